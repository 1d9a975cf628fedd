"""The paper profile's preflight: before any process starts (a run, torchrun, sbatch scripts), every data variable a
selected run reads is set and laid out as the run reads it; each that is not is one line naming the variable, what
it should hold and the artifacts that need it."""
import json
import os

import pytest

from reproduce import paper_profile, preflight, registry
from reproduce.__main__ import main
from reproduce.running import cluster

CC3M_RUN = "pretrain/vit-b-32-mdc-t0.0-1.0-cc3m-s0"


@pytest.fixture
def no_data(monkeypatch):
    for var in registry.PAPER_ENV:
        monkeypatch.delenv(var, raising=False)
    return monkeypatch


def test_a_paper_run_without_its_data_stops_before_torchrun_naming_the_variable(no_data, tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["--profile", "paper", "--run", CC3M_RUN, "--gpus-per-node", "1", "--out", str(tmp_path)])
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and len(err.strip().splitlines()) == 2  # the reason, and one line a variable
    assert "MDC_CC3M is not set" in err and "CC3M shards" in err and "table5" in err
    assert not (tmp_path / "paper" / "pretrain").exists()  # no run folder: nothing started


def test_a_pattern_whose_shards_are_missing_is_named_with_the_first_missing(no_data, tmp_path):
    (tmp_path / "cc3m").mkdir()
    (tmp_path / "cc3m" / "00000.tar").write_bytes(b"")
    no_data.setenv("MDC_CC3M", str(tmp_path / "cc3m" / "{00000..00002}.tar"))
    run = next(r for r in registry.build("paper", 1) if r.name == CC3M_RUN)
    lines = preflight.missing([run])
    assert len(lines) == 1 and lines[0].startswith("MDC_CC3M: 2 of 3 shards do not exist, the first: ")
    assert "00001.tar" in lines[0]
    (tmp_path / "cc3m" / "00001.tar").write_bytes(b"")
    (tmp_path / "cc3m" / "00002.tar").write_bytes(b"")
    assert preflight.missing([run]) == []
    no_data.setenv("MDC_CC3M_SAMPLES", "many")
    assert preflight.missing([run]) == ["MDC_CC3M_SAMPLES: 'many' is not a positive whole number (samples in the "
                                        "CC3M shards); needed by table5 (1 run: " + CC3M_RUN + ")"]


def test_every_evaluation_variable_is_checked_for_its_layout(no_data, tmp_path):
    runs = [r for r in registry.build("paper", 1) if r.name.startswith(("compositionality/", "captioning/", "probe/"))]
    lines = preflight.missing(runs)
    named = {line.split(" ", 1)[0].rstrip(":") for line in lines}
    assert named == set(paper_profile.PROBE_VARS + paper_profile.COMPOSITIONALITY_VARS
                        + paper_profile.CAPTIONING_VARS)
    (tmp_path / "aro").mkdir()
    no_data.setenv("MDC_ARO", str(tmp_path / "aro"))
    no_data.setenv("MDC_COCO_KARPATHY", str(tmp_path / "nowhere.json"))
    no_data.setenv("MDC_PROBE_ROOTS", json.dumps({"cifar10": str(tmp_path)}))
    found = {line.split(" ", 1)[0].rstrip(":"): line for line in preflight.missing(runs)}
    assert "no visual_genome_*.json in" in found["MDC_ARO"]
    assert "no such file" in found["MDC_COCO_KARPATHY"]
    assert "MDC_PROBE_ROOTS" not in found


def test_slurm_scripts_are_not_written_without_their_data_and_run_the_projects_interpreter(no_data, tmp_path,
                                                                                            capsys, monkeypatch):
    with pytest.raises(SystemExit) as exit_:
        main(["--profile", "paper", "--only", "table5", "--slurm", str(tmp_path / "slurm"), "--out", str(tmp_path)])
    assert exit_.value.code == 2 and "MDC_CC3M is not set" in capsys.readouterr().err
    assert not (tmp_path / "slurm").exists()
    monkeypatch.setattr(preflight, "missing", lambda runs: [])
    runs = registry.build("paper", 1)
    cluster.slurm_scripts(runs, str(tmp_path / "runs" / "paper"), str(tmp_path / "slurm"), "paper")
    body = open(tmp_path / "slurm" / sorted(os.listdir(tmp_path / "slurm"))[0]).read()
    assert f"{os.path.realpath(os.sys.executable)} -m reproduce --profile paper" in body


def test_torchrun_is_the_one_beside_the_interpreter(tmp_path):
    run = next(r for r in registry.build("paper", 1) if r.name == CC3M_RUN)
    command = cluster.torchrun_command(run, str(tmp_path), gpus=1)
    beside = os.path.join(os.path.dirname(os.sys.executable), "torchrun")
    assert command.startswith((beside if os.path.isfile(beside) else "torchrun") + " --nnodes=1")


def test_a_failed_run_names_its_log_and_its_last_error_line():
    log = ("[rank0]: Traceback (most recent call last):\n"
           "[rank0]: mdc.base.errors.ConfigError: train_data: 3 of 3 shards do not exist, the first: '/d/0.tar'\n"
           "E1207 elastic: failed\n"
           "torch.distributed.elastic.multiprocessing.errors.ChildFailedError: \n============\n")
    assert preflight.last_error(log) == ("mdc.base.errors.ConfigError: train_data: 3 of 3 shards do not exist, the "
                                         "first: '/d/0.tar'")
    assert preflight.last_error("all fine\n") is None


def test_the_data_table_of_paper_scale_md_covers_every_variable_with_the_artifacts_that_need_it():
    with open(os.path.join(os.path.dirname(__file__), "..", "..", "docs", "paper_scale.md")) as f:
        rows = {line.split("|")[1].strip(" `"): line.split("|")[-2] for line in f if line.startswith("| `MDC_")}
    assert set(rows) == set(registry.PAPER_ENV)
    need = {}
    for r in registry.build("paper", 1):
        for var in paper_profile.data_vars(r):
            need.setdefault(var, set()).update(r.artifacts)
    for var in ("MDC_CC3M", "MDC_SUGARCREPE", "MDC_COCO_KARPATHY", "MDC_RECAP_SUBSETS"):
        assert all(a in rows[var] for a in need[var]), var


def test_a_failed_run_is_reported_with_its_cause_and_its_logs_path(tmp_path, capsys):
    from reproduce.__main__ import _say_failed

    run = next(r for r in registry.build("paper", 1) if r.name == CC3M_RUN)
    log = "[rank0]: ValueError: train_data: 1 of 1 shards do not exist\nChildFailedError: \n"
    _say_failed({run.name: {"status": "failed", "error": log}}, [run], str(tmp_path))
    err = capsys.readouterr().err
    assert "ValueError: train_data: 1 of 1 shards do not exist (the whole log: " in err
    assert str(tmp_path / "pretrain" / "vit-b-32-mdc-t0.0-1.0-cc3m-s0" / "log.txt") in err
