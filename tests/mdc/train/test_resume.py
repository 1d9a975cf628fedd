"""Resume continues only the same run: the checkpoint's resolved configuration must match this call's."""
import json
import logging
import os

import pytest
from safetensors.torch import load_file

import mdc
from mdc.train import train
from conftest import TRAIN_MODEL, same_weights


@pytest.fixture(scope="module")
def data(scene_shards):
    """(the two-shard pattern, another pattern over its first shard only)."""
    return scene_shards, os.path.join(os.path.dirname(scene_shards), "000000.tar")


pytestmark = pytest.mark.usefixtures("one_thread")  # fast on a busy 2-core machine, bitwise comparable


def args(data, out, **kw):
    return dict(train_data=data[0], output_dir=str(out), model_overrides=TRAIN_MODEL, batch_size=8, lr=1e-3,
                workers=1, shuffle_buffer=8, steps=2, save_every=1) | kw


@pytest.fixture(scope="module")
def mdc_run(data, tmp_path_factory):
    """A finished 2-step MDC run."""
    out = tmp_path_factory.mktemp("run")
    train(**args(data, out))
    return out


@pytest.mark.parametrize("change, message", [
    (dict(objective="arc"), "objective: checkpoint 'mdc', now 'arc'"),
    (dict(model_overrides=TRAIN_MODEL | {"text_layers": 1}), "model_overrides.text_layers: checkpoint 2, now 1"),
    ("other data", "train_data: checkpoint '.*000001}.tar', now '.*000000.tar'"),
    (dict(lr=2e-3, t_interval=(0.2, 0.9)), r"lr: checkpoint 0.001, now 0.002.*\n.*t_interval: checkpoint None"),
])
def test_resume_refuses_a_different_run(data, mdc_run, change, message):
    change = dict(train_data=data[1]) if change == "other data" else change
    before = os.listdir(mdc_run / "checkpoints")
    with pytest.raises(ValueError, match=message) as info:
        train(**args(data, mdc_run, resume=True, **change))
    assert "force_resume" in str(info.value)
    assert os.listdir(mdc_run / "checkpoints") == before


def test_checkpoints_hold_the_resolved_run_config(mdc_run):
    saved = json.loads((mdc_run / "checkpoints" / "step_000002" / "train_config.json").read_text())
    assert saved["objective"] == "mdc" and saved["steps"] == 2 and saved["world_size"] == 1
    assert saved["warmup_steps"] == 0 and saved["model"] == "tiny"  # resolved defaults, not None


def test_same_run_resumes_with_free_fields_changed(data, tmp_path):
    full = train(**args(data, tmp_path / "full", steps=3))
    run = tmp_path / "run"
    train(**args(data, run, steps=3))
    # as if killed after step 2: latest.json names step 2; resume with only bookkeeping fields changed
    (run / "checkpoints" / "latest.json").write_text(json.dumps({"step": 2, "path": "step_000002"}))
    resumed = train(**args(data, run, steps=3, resume=True, save_every=5, log_every=2, keep_last=1,
                           tensorboard=False))
    assert resumed["steps"] == 3 and resumed["final_loss"] == full["final_loss"]
    a, b = (load_file(os.path.join(r["checkpoint"], "model.safetensors")) for r in (full, resumed))
    assert same_weights(a, b)
    assert sorted(os.listdir(run / "checkpoints")) == ["latest.json", "step_000003"]  # keep_last=1


def test_a_model_field_the_checkpoint_predates_counts_as_its_default(data, tmp_path):
    run = tmp_path / "run"
    train(**args(data, run))
    (run / "checkpoints" / "latest.json").write_text(json.dumps({"step": 1, "path": "step_000001"}))
    saved = run / "checkpoints" / "step_000001" / "config.json"
    config = json.loads(saved.read_text())
    del config["positions"], config["length_visible"]  # written before the two fields existed
    saved.write_text(json.dumps(config))
    with pytest.raises(ValueError, match="positions: checkpoint '<unset>', now 'rotary'"):
        train(**args(data, run, resume=True, model_overrides=TRAIN_MODEL | {"positions": "rotary"}))
    assert train(**args(data, run, resume=True))["steps"] == 2


def test_force_resume_continues_and_warns(data, tmp_path, caplog):
    run = tmp_path / "run"
    train(**args(data, run))
    with caplog.at_level(logging.WARNING, logger="mdc.train"):
        results = train(**args(data, run, objective="arc", steps=3, resume=True, force_resume=True))
    assert results["steps"] == 3 and mdc.load(results["checkpoint"]).config.objective == "arc"
    warned = [r.getMessage() for r in caplog.records if "force_resume" in r.getMessage()]
    assert len(warned) == 1
    assert "objective: checkpoint 'mdc', now 'arc'" in warned[0] and "steps: checkpoint 2, now 3" in warned[0]


def test_checkpoint_without_run_config_is_refused(data, tmp_path):
    run = tmp_path / "run"
    train(**args(data, run, steps=1))
    os.remove(run / "checkpoints" / "step_000001" / "train_config.json")
    with pytest.raises(ValueError, match="step_000001.*no train_config.json.*force_resume"):
        train(**args(data, run, steps=2, resume=True))
