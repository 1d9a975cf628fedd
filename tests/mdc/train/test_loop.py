"""Pretraining loop: exact resume after SIGKILL, skip accounting, NaN stop, paper presets, optimizer groups."""
import json
import math
import os
import signal
import subprocess
import time

import pytest
import torch

import mdc
from mdc.base import optim
from mdc.base.errors import ConfigError
from mdc.data.writer import write_tar
from mdc.world.scenes import write_shards
from mdc.train import NonFiniteLossError, TrainConfig, train
from conftest import SMALL, SUBPROCESS_ENV, TRAIN_MODEL, latest_weights, png, train_cli


@pytest.fixture(scope="module")
def shards(tmp_path_factory):
    """Four shards of 24 synthetic 32 px scenes each (12 steps of 8 per pass); returns the brace pattern."""
    out = tmp_path_factory.mktemp("shards")
    write_shards(str(out), 96, "alt", seed=0, image_size=32, shard_size=24)
    return os.path.join(str(out), "{000000..000003}.tar")


def run_args(data, out, **kw):
    return dict(dict(train_data=data, output_dir=str(out), model_overrides=TRAIN_MODEL, batch_size=8, lr=1e-3,
                     workers=2, shuffle_buffer=20), **kw)


pytestmark = pytest.mark.usefixtures("one_thread")  # fast on a busy 2-core machine, bitwise comparable


def test_resume_after_sigkill_is_exact(shards, tmp_path):
    """Kill a run right after its first checkpoint, resume it: same weights, bit for bit."""
    args = run_args(shards, tmp_path / "full", steps=16, save_every=3)  # 16 steps: into the second pass
    subprocess.run(train_cli(args), check=True, capture_output=True, env=SUBPROCESS_ENV)

    killed = dict(args, output_dir=str(tmp_path / "killed"))
    proc = subprocess.Popen(train_cli(killed), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            env=SUBPROCESS_ENV, start_new_session=True)
    pointer = tmp_path / "killed" / "checkpoints" / "latest.json"
    deadline = time.time() + 120
    while not pointer.exists() and proc.poll() is None and time.time() < deadline:
        time.sleep(0.01)
    os.killpg(proc.pid, signal.SIGKILL)  # the trainer and its loader workers, like a lost node
    proc.wait()
    stopped_at = json.loads(pointer.read_text())["step"]
    assert 0 < stopped_at < 16, "the run must die mid-way"

    out = subprocess.run(train_cli(dict(killed, resume=True)), check=True, capture_output=True, text=True,
                         env=SUBPROCESS_ENV)
    results = json.loads(out.stdout.strip().splitlines()[-1])
    assert results["steps"] == 16
    full, resumed = latest_weights(tmp_path / "full"), latest_weights(tmp_path / "killed")
    assert full.keys() == resumed.keys()
    for name in full:
        assert torch.equal(full[name], resumed[name]), name
    steps = [json.loads(line)["step"] for line in open(tmp_path / "killed" / "metrics.jsonl")]
    assert steps == list(range(1, 17))  # lines logged after the checkpoint by the killed run are dropped
    assert mdc.load(results["checkpoint"]).config.image_size == 32

    again = train(**dict(killed, resume=True))  # a finished run: nothing left to do
    assert again["steps"] == 16 and again["checkpoint"] == results["checkpoint"]


def test_corrupt_samples_are_skipped_and_logged(tmp_path):
    members = []
    for i in range(24):
        members += [(f"{i:04d}.png", png((i, 255 - i, 40))), (f"{i:04d}.txt", b"a red circle left of a blue square")]
    members += [("bad1.png", b"not a png"), ("bad1.txt", b"a circle"), ("bad2.png", png((3, 252, 40))),
                ("bad3.png", png((4, 251, 40))), ("bad3.txt", b"  ")]
    shard = write_tar(str(tmp_path / "000000.tar"), members)
    results = train(**run_args(shard, tmp_path / "run", steps=4, save_every=10, workers=1))
    assert results["skipped"] == {"corrupt_image": 1, "missing_caption": 1, "empty_caption": 1}
    rows = [json.loads(line) for line in open(results["metrics"])]
    assert [r["step"] for r in rows] == [1, 2, 3, 4]
    assert rows[-1]["skipped"] == results["skipped"]
    assert {"loss", "lr", "images_per_s", "epoch"} <= rows[0].keys()


def test_nan_loss_stops_naming_step_and_checkpoint(shards, tmp_path, monkeypatch):
    calls = []
    forward = mdc.train.LossModule.forward

    def poisoned(self, images, tokens):
        calls.append(1)
        loss = forward(self, images, tokens)
        return loss * float("nan") if len(calls) == 5 else loss

    monkeypatch.setattr(mdc.train.LossModule, "forward", poisoned)
    with pytest.raises(NonFiniteLossError, match=r"at step 5; last good checkpoint: .*step_000004"):
        train(**run_args(shards, tmp_path / "run", steps=8, save_every=2, workers=1))


def test_paper_presets_and_global_batch():
    cfg = TrainConfig("x", "y", preset="vit-l-14", objective="arc", batch_size=32, samples_per_epoch=12_000_000)
    c = cfg.resolved(world_size=8)
    assert (c.model, c.lr, c.weight_decay, c.accum_steps, c.warmup_steps) == ("vit-l-14", 4e-4, 0.2, 4, 10_000)
    assert c.grad_clip_norm == 1.0 and c.steps == 32 * (12_000_000 // 1024)
    b16 = TrainConfig("x", "y", preset="vit-b-16", batch_size=128, steps=10, warmup_steps=2).resolved(world_size=8)
    assert (b16.lr, b16.weight_decay, b16.accum_steps, b16.grad_clip_norm) == (5e-4, 0.2, 1, None)
    with pytest.raises(ValueError, match="not divisible"):
        TrainConfig("x", "y", preset="vit-b-32", batch_size=48, steps=10).resolved(world_size=8)
    with pytest.raises(ValueError, match="global batch 1024"):
        TrainConfig("x", "y", preset="vit-b-32", batch_size=64, accum_steps=1, steps=10).resolved(world_size=8)
    with pytest.raises(ValueError, match="exactly one of steps or epochs"):
        TrainConfig("x", "y", steps=10, epochs=2).resolved(world_size=1)


def test_warmup_longer_than_the_run_is_refused():
    """vit-b-16's 10,000 warm-up steps in a 5,000-step run: the LR would never peak nor decay."""
    with pytest.raises(ValueError, match=r"warmup_steps 10000 >= steps 5000.*--warmup-steps"):
        TrainConfig("x", "y", preset="vit-b-16", batch_size=128, steps=5000).resolved(world_size=8)
    with pytest.raises(ValueError, match=r"warmup_steps 10 >= steps 10"):
        TrainConfig("x", "y", steps=10, warmup_steps=10).resolved(world_size=1)
    assert TrainConfig("x", "y", steps=10, warmup_steps=9).resolved(world_size=1).warmup_steps == 9


def test_no_weight_decay_on_norms_biases_embeddings_and_temperature():
    model = mdc.create_model("tiny", "clip", **SMALL)
    decay, no_decay = optim.param_groups(model, 0.2)
    assert decay["weight_decay"] == 0.2 and no_decay["weight_decay"] == 0.0
    names = {id(p): n for n, p in model.named_parameters()}
    undecayed = {names[id(p)] for p in no_decay["params"]}
    assert {"logit_scale", "text.pos", "text.embed.weight", "visual.cls_token", "visual.pos_embed"} <= undecayed
    assert all(n.endswith(("bias", "weight")) for n in undecayed - {"logit_scale", "text.pos", "visual.cls_token",
                                                                    "visual.pos_embed"})
    decayed = {names[id(p)] for p in decay["params"]}
    assert "text_proj.weight" in decayed and "visual.patch_embed.proj.weight" in decayed
    assert not any("norm" in n or "ln" in n.split(".")[-2] or n.endswith("bias") for n in decayed)
    assert len(decayed) + len(undecayed) == len(names)


def test_warmup_then_cosine_to_zero():
    f = optim.warmup_cosine(10, 110)
    assert f(0) == pytest.approx(0.1) and f(9) == pytest.approx(1.0)
    assert f(60) == pytest.approx(0.5) and f(110) == pytest.approx(0.0, abs=1e-12)
    assert all(f(s) >= f(s + 1) for s in range(10, 110))
    assert math.isclose(optim.warmup_cosine(0, 10)(0), 1.0)


def test_train_data_may_be_a_folder_of_shards(shards, tmp_path):
    folder = os.path.dirname(shards)
    c = TrainConfig(folder, str(tmp_path), steps=4, warmup_steps=1).resolved(world_size=1)
    assert c.train_data.split("::") == [os.path.join(folder, f"{i:06d}.tar") for i in range(4)]
    with pytest.raises(ValueError, match="without .tar shards"):
        TrainConfig(str(tmp_path), str(tmp_path), steps=4).resolved(world_size=1)


def test_global_batch_override_and_step_presets(monkeypatch):
    lb = TrainConfig("x", "y", preset="vit-b-32", batch_size=128, global_batch=2048, steps=100,
                     warmup_steps=10).resolved(world_size=8)
    assert lb.accum_steps == 2  # CLIP-LB: twice the paper's global batch
    with pytest.raises(ValueError, match="global_batch needs a global batch of 100"):
        TrainConfig("x", "y", batch_size=32, global_batch=100, steps=10).resolved(world_size=1)
    monkeypatch.setitem(optim.PRESETS, "toy", dict(lr=1e-3, weight_decay=0.05, global_batch=64, batch_size=64,
                                                   warmup_steps=5, steps=40))
    c = TrainConfig("x", "y", preset="toy", model="tiny").resolved(world_size=1)
    assert (c.batch_size, c.accum_steps, c.steps, c.epochs, c.warmup_steps, c.lr) == (64, 1, 40, None, 5, 1e-3)


def test_a_preset_file_sets_its_values_its_model_and_per_objective_overrides(tmp_path):
    """--preset takes the path of a JSON file as well as a paper backbone's name (mdc.base.optim.read_preset)."""
    path = tmp_path / "recipe.json"
    path.write_text(json.dumps({"about": "a test recipe", "model": "tiny", "lr": 1e-3, "steps": 40, "batch_size": 16,
                                "objectives": {"clip": {"lr": 3e-4, "warmup_steps": 4}}}))
    mdc_run = TrainConfig("x", "y", preset=str(path), objective="mdc").resolved(world_size=1)
    assert (mdc_run.model, mdc_run.lr, mdc_run.steps, mdc_run.batch_size) == ("tiny", 1e-3, 40, 16)
    assert mdc_run.warmup_steps == 2  # left out: 5% of the steps
    assert (mdc_run.weight_decay, mdc_run.accum_steps, mdc_run.grad_clip_norm) == (0.1, 1, None)  # left out: defaults
    clip_run = TrainConfig("x", "y", preset=str(path), objective="clip", lr=5e-4).resolved(world_size=1)
    assert (clip_run.lr, clip_run.warmup_steps) == (5e-4, 4)  # a given value wins over the preset's
    path.write_text(json.dumps({"lr": 1e-3, "stpes": 40}))
    with pytest.raises(ValueError, match="unknown key 'stpes'"):
        TrainConfig("x", "y", preset=str(path)).resolved(world_size=1)
    with pytest.raises(ValueError, match=r"preset must be one of 'vit-b-16'.* or the path of a JSON file"):
        TrainConfig("x", "y", preset="mini").resolved(world_size=1)


def test_count_samples_reads_img2dataset_stats_instead_of_the_tars(shards, tmp_path, monkeypatch):
    import shutil

    from mdc.train import count_samples

    for i in range(4):
        shutil.copy(shards.replace("{000000..000003}", f"{i:06d}"), tmp_path)
    pattern = str(tmp_path / "{000000..000003}.tar")
    plain = count_samples(pattern)
    assert plain == 96
    for i in range(3):  # img2dataset's stats files (000003 has none: its tar is counted)
        (tmp_path / f"{i:06d}_stats.json").write_text(json.dumps({"count": 30, "successes": 24, "failed_to_download": 6}))
    opened = []
    real_open = mdc.train.stream.tarfile.open
    monkeypatch.setattr(mdc.train.stream.tarfile, "open", lambda name, *a, **k: opened.append(name) or real_open(name, *a, **k))
    assert count_samples(pattern) == plain and opened == [str(tmp_path / "000003.tar")]


def test_progress_false_draws_no_bar_and_resumes_the_same_run(shards, tmp_path, capfd):
    train(**run_args(shards, tmp_path, steps=2, workers=0, progress=False))
    err = capfd.readouterr().err
    assert "mdc tiny" not in err and "it/s" not in err
    out = train(**run_args(shards, tmp_path, steps=2, workers=0, progress=True, resume=True))
    assert out["steps"] == 2  # a bookkeeping field: the same run continues


def test_a_run_stopped_at_a_step_and_continued_elsewhere_is_the_uninterrupted_run(shards, tmp_path):
    """``stop_at`` ends a run mid-schedule; ``resume_from`` continues it into another folder: the pieces together
    are the run trained in one go, bit for bit (each piece's folder holds its own checkpoint and metrics)."""
    args = run_args(shards, tmp_path / "whole", steps=10, save_every=5, workers=0)
    whole = train(**args)
    first = train(**dict(args, output_dir=str(tmp_path / "first"), stop_at=4))
    assert first["steps"] == 4 and first["checkpoint"].endswith("step_000004")
    second = train(**dict(args, output_dir=str(tmp_path / "second"), resume_from=str(tmp_path / "first"), stop_at=7))
    third = train(**dict(args, output_dir=str(tmp_path / "third"), resume_from=second["checkpoint"], resume=True))
    assert (second["steps"], third["steps"]) == (7, 10)
    full, pieced = latest_weights(tmp_path / "whole"), latest_weights(tmp_path / "third")
    assert all(torch.equal(full[name], pieced[name]) for name in full)
    assert [json.loads(line)["step"] for line in open(tmp_path / "third" / "metrics.jsonl")] == [8, 9, 10]
    assert whole["final_loss"] == third["final_loss"]


def test_resume_from_refuses_another_run_weights_alone_and_a_stop_already_passed(shards, tmp_path):
    args = run_args(shards, tmp_path / "a", steps=6, save_every=3, workers=0)
    train(**dict(args, stop_at=3))
    with pytest.raises(ValueError, match="lr: checkpoint 0.001, now 0.002"):
        train(**dict(args, output_dir=str(tmp_path / "b"), resume_from=str(tmp_path / "a"), lr=2e-3))
    with pytest.raises(ValueError, match="at step 3.*stop_at 2"):
        train(**dict(args, output_dir=str(tmp_path / "c"), resume_from=str(tmp_path / "a"), stop_at=2))
    weights = tmp_path / "weights"
    mdc.load(str(tmp_path / "a")).save(str(weights))
    with pytest.raises(ValueError, match="trainer.pt"):
        train(**dict(args, output_dir=str(tmp_path / "d"), resume_from=str(weights)))
    with pytest.raises(ConfigError, match="stop_at"):
        TrainConfig(**dict(args, stop_at=7)).resolved(1)
