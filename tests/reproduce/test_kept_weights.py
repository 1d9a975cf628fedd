"""The reference run keeps the float16 weights of every seed of the descriptive MDC, ARC and CLIP
(reproduce/pretrained.py:KEEP) as their records are written, and ships a kept float16 file as it is."""
import json
import os

import pytest
import torch
from safetensors.torch import load_file, save_file

from conftest import toy_notebook
from mdc.eval.results import checkpoint_id
from reproduce import graph, pretrained
from reproduce.running import ledger, runner
from reproduce.__main__ import main
from reproduce.graph import Run
from reproduce.running.runner import RunSettings


def _run_folder(root, config='{"name": "tiny"}'):
    """A pretraining run folder whose newest checkpoint holds a few float32 tensors and an integer one."""
    checkpoint = root / "checkpoints" / "step_000002"
    checkpoint.mkdir(parents=True)
    (checkpoint / "config.json").write_text(config)
    generator = torch.Generator().manual_seed(0)
    save_file({"w": torch.randn(4, 8, generator=generator), "b": torch.randn(8, generator=generator) * 1e-3,
               "ids": torch.arange(5)}, str(checkpoint / "model.safetensors"))
    (root / "checkpoints" / "latest.json").write_text(json.dumps({"step": 2, "path": "step_000002"}))
    return checkpoint


def _record(run, checkpoint):
    return {"run": run, "key": "0123456789abcdef", "results": {"checkpoint_id": checkpoint_id(checkpoint)}}


def test_a_kept_run_leaves_its_weights_rounded_to_float16_with_its_checkpoint_named(tmp_path):
    checkpoint = _run_folder(tmp_path / "run")
    record = _record("pretrain/arc-descriptive-s3", checkpoint)
    folder = pretrained.keep(str(tmp_path / "run"), str(tmp_path / "kept"), record)
    assert folder == str(tmp_path / "kept" / "pretrain" / "arc-descriptive-s3")
    assert sorted(os.listdir(folder)) == ["config.json", "kept.json", "model.safetensors"]  # no temporary file
    assert open(os.path.join(folder, "config.json")).read() == (checkpoint / "config.json").read_text()
    kept = load_file(os.path.join(folder, "model.safetensors"))
    original = load_file(str(checkpoint / "model.safetensors"))
    assert kept["w"].dtype == kept["b"].dtype == torch.float16 and kept["ids"].dtype == torch.int64
    for name in original:
        assert torch.equal(kept[name], pretrained.half(original)[name]), name
    assert pretrained.kept_checkpoint(folder) == record["results"]["checkpoint_id"]
    note = json.load(open(os.path.join(folder, "kept.json")))
    assert (note["run"], note["key"], note["float16_id"]) == ("pretrain/arc-descriptive-s3", record["key"],
                                                               checkpoint_id(folder))
    first = open(os.path.join(folder, "model.safetensors"), "rb").read()
    for _ in range(3):  # the same bytes each time
        pretrained.keep(str(tmp_path / "run"), str(tmp_path / "kept"), record)
        assert open(os.path.join(folder, "model.safetensors"), "rb").read() == first


@pytest.mark.parametrize("run", ["pretrain/mdc-alt-s0", "pretrain/mdc-descriptive-n0.50-s1",
                                 "pretrain/cliplb-descriptive-s0", "probe/mdc-descriptive-s0",
                                 "pretrain/mdc-descriptive"])
def test_a_run_not_kept_writes_nothing(tmp_path, run):
    checkpoint = _run_folder(tmp_path / "run")
    assert not pretrained.is_kept(run)
    assert pretrained.keep(str(tmp_path / "run"), str(tmp_path / "kept"), _record(run, checkpoint)) is None
    assert not (tmp_path / "kept").exists()


def test_every_seed_of_the_descriptive_mdc_arc_and_clip_is_kept():
    for stem in ("pretrain/mdc-descriptive", "pretrain/arc-descriptive", "pretrain/clip-descriptive"):
        assert all(pretrained.is_kept(f"{stem}-s{seed}") for seed in (0, 1, 2, 12))


def test_a_checkpoint_that_is_not_the_record_s_is_not_kept(tmp_path):
    _run_folder(tmp_path / "run")
    record = {"run": "pretrain/mdc-descriptive-s1", "key": "k", "results": {"checkpoint_id": "0" * 16}}
    with pytest.raises(ValueError, match="step_000002/model.safetensors is not the checkpoint 0{16}"):
        pretrained.keep(str(tmp_path / "run"), str(tmp_path / "kept"), record)
    assert not (tmp_path / "kept" / "pretrain" / "mdc-descriptive-s1" / "model.safetensors").exists()


def _keep_seed_0(tmp_path):
    """Seed 0's MDC as a reference run keeps it: a float32 checkpoint, its record in a ledger of its own,
    and the float16 file keep() writes from it."""
    run = pretrained.SHIPPED["mdc"]
    checkpoint = _run_folder(tmp_path / "run")
    records = tmp_path / "records"
    record = {**_record(run, checkpoint), "schema": ledger.SCHEMA}
    (records / "pretrain").mkdir(parents=True)
    (records / f"{run}.json").write_text(json.dumps(record))
    kept = tmp_path / "kept"
    pretrained.keep(str(tmp_path / "run"), str(kept), record)
    return run, kept, str(records)


def test_a_kept_float16_file_is_shipped_as_it_is(tmp_path):
    run, kept, records = _keep_seed_0(tmp_path)
    digest = pretrained.ship(run, str(tmp_path / "out"), kept=str(kept), records=records)
    weights = kept / run / "model.safetensors"
    assert (tmp_path / "out" / "model.safetensors").read_bytes() == weights.read_bytes()
    assert digest == checkpoint_id(kept / run)
    assert json.load(open(tmp_path / "out" / "record.json")) == ledger.read(records, run)


def test_a_kept_float16_file_of_another_checkpoint_is_refused_naming_it_and_both_ids(tmp_path):
    run, kept, records = _keep_seed_0(tmp_path)
    weights = kept / run / "model.safetensors"
    note = json.load(open(kept / run / "kept.json"))
    (kept / run / "kept.json").write_text(json.dumps({**note, "checkpoint_id": "fedcba9876543210"}))
    wanted = ledger.read(records, run)["results"]["checkpoint_id"]
    with pytest.raises(ValueError, match=f"{weights} is not the checkpoint {wanted} .*fedcba9876543210"):
        pretrained.ship(run, str(tmp_path / "out"), kept=str(kept), records=records)


TOY = '''
import hashlib, json, os
import numpy as np
from safetensors.numpy import save_file
step = os.path.join(output_dir, "checkpoints", "step_000001")
os.makedirs(step, exist_ok=True)
with open(os.path.join(step, "config.json"), "w") as f:
    f.write('{"name": "toy"}')
weights = np.linspace(-1, 1, 12, dtype=np.float32).reshape(3, 4) * value
save_file({"w": weights}, os.path.join(step, "model.safetensors"))
with open(os.path.join(output_dir, "checkpoints", "latest.json"), "w") as f:
    json.dump({"step": 1, "path": "step_000001"}, f)
digest = hashlib.sha256(open(os.path.join(step, "model.safetensors"), "rb").read()).hexdigest()[:16]
json.dump({"schema": "mdc.results/1", "kind": "pretrain", "checkpoint": step, "checkpoint_id": digest,
           "results": {"value": value}}, open(os.path.join(output_dir, "results.json"), "w"))
'''


def test_the_runner_keeps_the_weights_of_a_kept_run_as_it_records_it(tmp_path, monkeypatch):
    notebooks = toy_notebook(tmp_path / "notebooks", "toy", 'output_dir = ""\nvalue = 1.0', TOY)
    monkeypatch.setattr(graph, "NOTEBOOKS", notebooks)
    runs = [Run(name, "toy", {"output_dir": f"{{run:{name}}}", "value": value})
            for name, value in (("pretrain/clip-descriptive-s4", 2.0), ("pretrain/clip-alt-s4", 3.0))]
    out, records, kept = (str(tmp_path / name) for name in ("out", "records", "kept"))
    lines = []
    outcome = runner.run_all(runs, out, RunSettings(records=records, kept_weights=kept), log=lines.append)
    assert {o["status"] for o in outcome.values()} == {"ok"}
    assert os.listdir(os.path.join(kept, "pretrain")) == ["clip-descriptive-s4"]
    weights = os.path.join(kept, "pretrain", "clip-descriptive-s4", "model.safetensors")
    record = ledger.read(records, "pretrain/clip-descriptive-s4")
    assert pretrained.kept_checkpoint(os.path.dirname(weights)) == record["results"]["checkpoint_id"]
    assert load_file(weights)["w"].dtype == torch.float16
    assert any("float16 weights kept" in line for line in lines)
    assert RunSettings().kept_weights is None  # unless asked, a runner keeps nothing


@pytest.mark.parametrize("argv, kept", [
    ([], os.path.join(ledger.ROOT, "reproduce", "weights", "mini")),  # the reference run's ledger
    (["--records", os.path.join(ledger.ROOT, "reproduce", "records", "mini-next")],
     os.path.join(ledger.ROOT, "reproduce", "weights", "mini-next")),
    (["--records", "{tmp}/records"], None),  # an ad-hoc ledger keeps nothing...
    (["--records", "{tmp}/records", "--kept-weights", "{tmp}/kept"], "{tmp}/kept"),  # ...unless asked
])
def test_a_reference_run_keeps_weights_beside_its_ledger_and_others_only_when_asked(argv, kept, tmp_path, monkeypatch):
    seen = []
    monkeypatch.setattr(runner, "run_all", lambda runs, out, settings, **kwargs: seen.append(settings) or {})
    argv = [a.format(tmp=tmp_path) for a in argv]
    assert main(["--profile", "mini", "--seeds", "1", "--out", str(tmp_path / "runs"),
                 "--figures", str(tmp_path / "figures"), *argv]) == 0
    assert seen[0].kept_weights == (kept.format(tmp=tmp_path) if kept else None)
