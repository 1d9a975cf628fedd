"""The costed dry run of the paper profile (reproduce/cost/paper_cost.py, reproduce/cost/model_cost.py, reproduce/cost/cost_table.py):
meta-device FLOPs checked against the real loss and the analytic count, activation memory against CPU autocast,
the plan's table and totals."""
import json
import os
import re
import sys

import pytest
import torch

import mdc
from mdc.factory import model_config
from mdc.base.flops import Meter
from reproduce import paper_profile, registry
from reproduce.cost import model_cost, paper_cost
from reproduce.running import cluster
from reproduce.__main__ import main
from conftest import SMALL

pytestmark = pytest.mark.usefixtures("one_thread")


def real_loss_flops(model, tokens, **kw) -> float:
    """The meter over the real loss's forward and backward (CPU tensors)."""
    images = torch.randn(len(tokens), 3, model.config.image_size, model.config.image_size)
    with Meter() as meter:
        model.loss(images, tokens, **kw).backward()
    return meter.flops


@pytest.mark.parametrize("objective", ["mdc", "arc", "clip"])
def test_meta_training_pass_counts_what_the_real_loss_does(objective):
    """The modules called in the loss's order count the same FLOPs as the loss itself: 4 captions of
    N = 6 caption tokens (L = 8 with [SOT], [EOT]), cut to their length on the host as the training stream
    cuts them; the dense losses run the head at every position they read, MDC 8, ARC 7."""
    model = mdc.create_model("tiny", objective, **SMALL)
    tok = model.tokenizer
    N, B = 6, 4
    words = torch.randint(0, tok.vocab_size, (B, N))
    words[words >= min(tok.sot_id, tok.eot_id, tok.mask_id, tok.pad_id)] = 5  # plain words
    tokens = torch.cat([torch.full((B, 1), tok.sot_id), words, torch.full((B, 1), tok.eot_id)], dim=1)
    kw = {"t": torch.ones(B)} if objective == "mdc" else {}
    length, positions = {"mdc": (N + 2, N + 2), "arc": (N + 1, N + 1), "clip": (N + 2, 0)}[objective]
    assert positions == model_cost.OBJECTIVES[objective].positions(N + 2)
    flops, _ = model_cost.measure_training(model, B, length, positions)
    assert flops == pytest.approx(real_loss_flops(model, tokens, **kw), rel=1e-3)
    with torch.device("meta"):
        meta = mdc.create_model("tiny", objective, **SMALL).to(torch.bfloat16)
    meta_flops, _ = model_cost.measure_training(meta, B, length, positions)  # fused attention on meta
    assert meta_flops == pytest.approx(flops, rel=0.05)  # only the attention backward is counted differently


@pytest.mark.parametrize("name", ["vit-b-32", "vit-l-14"])
@pytest.mark.parametrize("objective", ["mdc", "clip"])
def test_meta_forward_matches_the_analytic_count(name, objective):
    model = model_cost.meta_model(name, objective)
    with torch.no_grad(), Meter(fused=True) as meter:
        model_cost.training_forward(model, 1, 77, 16 if objective == "mdc" else 0)
    analytic = model_cost.analytic_forward_flops(model_config(name, objective), 77, 16 if objective == "mdc" else 0)
    assert meter.flops == pytest.approx(analytic, rel=0.01)


def test_the_head_is_linear_in_its_positions():
    p = model_cost.training_pass("vit-b-32", "mdc")
    flops, saved = model_cost.measure_training(model_cost.meta_model("vit-b-32", "mdc"), 2, 77, 5)
    assert p.at(5)[0] == pytest.approx(flops / 2, rel=1e-6) and p.at(5)[1] == pytest.approx(saved / 2, rel=0.01)
    assert p.head_flops == pytest.approx(3 * 2 * 512 * mdc.get_tokenizer("vit-b-32").vocab_size, rel=1e-6)


@pytest.mark.slow  # 70-150 s on 2 cores: a constant's calibration, not a code path (make test-slow)
def test_activation_memory_factor_of_autocast_is_what_cpu_autocast_measures():
    """Per sample (two batch sizes differenced: autocast's weight copies cancel), the bytes saved under
    CPU autocast over those of the same model in bf16: AUTOCAST_FACTOR must be within 0.05 of it."""
    def per_sample(model, autocast):
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            six, two = (model_cost.measure_training(model, batch, 20, 4)[1] for batch in (6, 2))
            return (six - two) / 4

    for objective in ("mdc", "clip"):
        model = mdc.create_model("vit-b-32", objective, vision_layers=2, text_layers=2)
        ratio = per_sample(model, True) / per_sample(model.to(torch.bfloat16), False)
        assert abs(ratio - paper_cost.AUTOCAST_FACTOR) < 0.05, (objective, ratio)


def test_every_placeholder_of_the_paper_profile_is_a_listed_data_variable(monkeypatch):
    for var in registry.PAPER_ENV:
        monkeypatch.delenv(var, raising=False)
    for run in registry.build("paper", seeds=1):
        needed = set(re.findall(r"<set (\w+)>", json.dumps(run.params)))
        assert needed <= set(paper_profile.data_vars(run)) <= set(registry.PAPER_ENV), run.name
    lb = next(r for r in registry.build("paper") if "cliplb" in r.name)
    assert "--global-batch 2048" in cluster.torchrun_command(lb, "out", 8)  # CLIP-LB: twice the batch


def test_paper_dry_run_prints_the_costed_plan(tmp_path, monkeypatch, capsys):
    for var in registry.PAPER_ENV:
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("MDC_CC12M", "/data/cc12m/{00000..01242}.tar")
    monkeypatch.setenv("MDC_CC12M_SAMPLES", "10000000")
    assert main(["--profile", "paper", "--dry-run", "--only", "table4", "--out", str(tmp_path), "--mfu", "0.5"]) == 0
    text = capsys.readouterr().out
    assert not list(tmp_path.iterdir())  # a dry run writes nothing
    assert "MFU 50%" in text and "== table4: 4 runs" in text
    assert "MDC_CC12M set, MDC_CC12M_SAMPLES set" in text and "MDC_RECAP10M UNSET" in text
    assert f"$ {cluster.torchrun()} --nnodes=1 --nproc_per_node=8 --standalone -m mdc.train" in text
    assert "--train-data /data/cc12m/{00000..01242}.tar" in text.replace("'", "")
    assert f"--run probe/vit-b-32-mdc-wot-alt-s0" in text
    rows = re.findall(r"^  (\S+)\s+(\d+)\s+(\S+)\s+(\S+)\s+.*?\s([\d.,]+)$", text, re.M)
    hours = {name: float(h.replace(",", "")) for name, _, _, _, h in rows}
    assert set(hours) == {"pretrain/vit-b-32-mdc-wot-alt-s0", "pretrain/vit-b-32-mdc-wot-descriptive-s0",
                          "probe/vit-b-32-mdc-wot-alt-s0", "probe/vit-b-32-mdc-wot-descriptive-s0"}
    total = float(re.search(r"== total: 5 runs, ([\d,.]+) GPU-hours", text).group(1).replace(",", ""))
    assert total == pytest.approx(sum(hours.values()), abs=1)

    # the figures behind the table: 10M pairs x 32 epochs, FLOPs / (MFU x peak)
    runs = registry.select(registry.with_figures(registry.build("paper"), "figs", "paper", "records"), ["table4"])
    costs = {c.run: c for c in paper_cost.plan(runs, str(tmp_path))}
    alt = costs["pretrain/vit-b-32-mdc-wot-alt-s0"]
    per_sample = model_cost.training_pass("vit-b-32", "mdc").at(model_cost.CONTEXT)[0]  # the dense head: every position
    assert alt.flops == pytest.approx(per_sample * 32 * (10_000_000 // 1024) * 1024)
    assert alt.gpu_hours(0.5) == pytest.approx(alt.flops / (0.5 * 989e12) / 3600)
    assert alt.params == model_cost.num_params("vit-b-32", "mdc") and 150e6 < alt.params < 250e6
    assert 1 < alt.act_bytes / 2**30 < 40 and alt.micro_batch == 128 and alt.gpus == 8
    assert costs["figures"].flops == 0 and costs["figures"].gpus == 0


def test_the_paper_dry_run_is_one_cost_whose_lines_sum_to_its_total(tmp_path, capsys):
    """No line of the synthetic profiles' estimates (minutes, run-hours) beside the GPU-hours; the per-artifact
    figures, which count a run once for each artifact it feeds, are explained against the total, which counts it
    once; the notebooks' commands name this interpreter."""
    assert main(["--profile", "paper", "--dry-run", "--out", str(tmp_path)]) == 0
    text = capsys.readouterr().out
    assert "~0 min" not in text and "run-hours" not in text
    rows = dict(re.findall(r"^  (\S+)\s+\d+\s+\S+\s+\S+\s+.*?\s([\d.,]+)$", text, re.M))
    total = float(re.search(r"== total: (\d+) runs, ([\d,.]+) GPU-hours", text).group(2).replace(",", ""))
    assert total == pytest.approx(sum(float(h.replace(",", "")) for h in rows.values()), abs=1)
    shared = re.search(r"(\d+) runs feed more than one artifact .* sum to ([\d,]+) GPU-hours", text)
    per_artifact = re.search(r"per artifact: (.*)$", text, re.M).group(1)
    figures = [int(x.replace(",", "")) for x in re.findall(r"\w+ ([\d,]+)", per_artifact)]
    assert int(shared.group(2).replace(",", "")) == pytest.approx(sum(figures), abs=len(figures))  # each rounded
    assert f"$ {os.path.realpath(sys.executable)} -m reproduce --profile paper" in text


def test_mfu_is_checked(capsys):
    with pytest.raises(SystemExit) as exit:
        main(["--profile", "paper", "--dry-run", "--mfu", "0"])
    assert exit.value.code == 2 and "--mfu must be in (0, 1], got 0.0" in capsys.readouterr().err


def test_the_paper_step_is_a_flag_that_the_runs_the_scripts_and_the_cost_follow(tmp_path, capsys):
    """The step that held under torchrun on an H200 (docs/benchmarks.md, 2026-12-04) is the paper profile's
    default: compiled whole and replayed as CUDA graphs. ``--step eager`` or ``compiled`` trains the others; the
    runs' parameters carry it, the sbatch scripts pass it on to the runs they start, and the dry run costs the
    step's measured utilisation. A synthetic profile has no such choice."""
    def command(step) -> str:
        run = next(r for r in registry.build("paper", 1, step=step) if r.name == "pretrain/vit-b-32-mdc-alt-s0")
        return cluster.torchrun_command(run, "out", 8)

    assert "--compile --compile-mode reduce-overhead" in command("graphs")
    assert "--compile --compile-mode default" in command("compiled") and "--compile" not in command("eager")
    assert paper_cost.STEP_MFU == {"eager": 0.058, "compiled": 0.061, "graphs": 0.18}
    assert main(["--profile", "paper", "--dry-run", "--step", "eager", "--only", "table4", "--out", str(tmp_path)]) == 0
    text = capsys.readouterr().out
    assert "MFU 5.8%" in text and "--compile" not in text and "--step eager --run probe/" in text
    submit = cluster.slurm_scripts(registry.build("paper", 1, step="eager"), str(tmp_path / "paper"),
                                   str(tmp_path / "slurm"), "paper", step="eager")
    scripts = [open(os.path.join(tmp_path / "slurm", f)).read() for f in os.listdir(tmp_path / "slurm")
               if f.endswith(".sbatch")]
    assert submit and all("--step eager --run " in body for body in scripts)
    with pytest.raises(SystemExit) as exit_:
        main(["--profile", "mini", "--dry-run", "--step", "eager"])
    assert exit_.value.code == 2 and "--step" in capsys.readouterr().err
