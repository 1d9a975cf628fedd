"""bf16 on CPU: the CUDA path's mixed precision, run where the tests run.

``torch.autocast("cpu", dtype=torch.bfloat16)`` is the same dtype plumbing as CUDA's, so every
switch that turns bf16 on for a GPU run is exercised here: the training loop's ``precision``
(MDC, ARC and CLIP, one process and DDP over two gloo processes) and the evaluation's
(:func:`mdc.model.evaluating`: generation and every scorer). Each run asserts that bf16 reached
the matrix products, that the optimizer sees fp32 master weights, gradients and state, that the
checkpoint holds fp32, and that a bf16 run resumes exactly. ``test_*_ignored_*`` turn autocast
off behind the code's back and check that these assertions notice.
"""
import json
import math
import os
import subprocess
import sys
import textwrap

import pytest
import torch
from safetensors.torch import load_file
from torch import nn

import mdc
from mdc.base import optim
from mdc.transformer import Head
from mdc.train import loop, train
from conftest import CAPTIONS, SUBPROCESS_ENV, TRAIN_MODEL, same_weights, small_model

pytestmark = pytest.mark.usefixtures("one_thread")  # fast on a busy 2-core machine, bitwise comparable


def run_args(data, out, **kw):
    return dict(train_data=data, output_dir=str(out), model_overrides=TRAIN_MODEL, batch_size=4, lr=1e-3, workers=0,
                shuffle_buffer=8, steps=3, save_every=3, warmup_steps=1, precision="bf16", progress=False) | kw


class AutocastOff(torch.amp.autocast):
    """``torch.autocast`` that ignores ``enabled``: what code that forgot the switch would do."""

    def __init__(self, device_type, dtype=None, enabled=True, cache_enabled=None):
        super().__init__(device_type, dtype=dtype, enabled=False, cache_enabled=cache_enabled)


def record_dtypes(model: nn.Module, record: dict) -> list:
    """Forward hooks: the output dtype of every linear layer goes to record["linear"], the
    vocabulary head's to record["head"]. Returns the hooks' handles."""
    return [module.register_forward_hook(lambda mod, args, out, key=key: record.setdefault(key, set()).add(out.dtype))
            for module in model.modules() if isinstance(module, nn.Linear)
            for key in ["head" if isinstance(module, Head) else "linear"]]


def recording_train(monkeypatch, **kwargs) -> tuple[dict, dict]:
    """``train(**kwargs)`` with the dtypes it uses recorded: every linear layer's output, and at each
    optimizer step the parameters, gradients (before) and optimizer state (after) the optimizer holds."""
    record: dict = {"params": set(), "grads": set(), "state": set()}
    create, step = loop.create_model, optim.optimizer_step

    def creating(*args, **kw):
        model = create(*args, **kw)
        record_dtypes(model, record)
        return model

    def stepping(model, optimizer, *args, **kw):
        params = [p for group in optimizer.param_groups for p in group["params"]]
        record["params"] |= {p.dtype for p in params}
        record["grads"] |= {p.grad.dtype for p in params if p.grad is not None}
        step(model, optimizer, *args, **kw)
        record["state"] |= {v.dtype for s in optimizer.state.values() for v in s.values() if torch.is_tensor(v)}

    monkeypatch.setattr(loop, "create_model", creating)
    monkeypatch.setattr(optim, "optimizer_step", stepping)
    return train(**kwargs), record


def check_bf16_training(result: dict, record: dict) -> None:
    """What a bf16 run must show: finite losses, bf16 matrix products, fp32 master weights, gradients,
    optimizer state and checkpoint."""
    assert math.isfinite(result["final_loss"])
    losses = [json.loads(line)["loss"] for line in open(result["metrics"])]
    assert losses and all(math.isfinite(x) for x in losses)
    assert torch.bfloat16 in record["linear"], f"no matrix product ran in bf16: {record['linear']}"
    assert record["params"] == {torch.float32} and record["grads"] == {torch.float32}, record
    assert record["state"] == {torch.float32}, record  # AdamW's moments (and its step counter)
    saved = load_file(os.path.join(result["checkpoint"], "model.safetensors"))
    assert {t.dtype for t in saved.values()} == {torch.float32}


@pytest.mark.parametrize("objective, extra", [("mdc", {}), ("arc", {}), ("clip", {"accum_steps": 2})])
def test_bf16_pretraining_keeps_fp32_master_weights(scene_shards, tmp_path, monkeypatch, objective, extra):
    """A few bf16 steps of each objective (CLIP accumulating: its cached-embedding path too)."""
    result, record = recording_train(monkeypatch, **run_args(scene_shards, tmp_path, objective=objective, **extra))
    check_bf16_training(result, record)
    if objective != "clip":
        assert record["head"] == {torch.bfloat16}  # training leaves the vocabulary head to autocast


def test_fp32_run_and_ignored_bf16_switch_are_noticed(scene_shards, tmp_path, monkeypatch):
    """The checks above fail on an fp32 run, and on a bf16 run whose autocast is switched off."""
    result, record = recording_train(monkeypatch, **run_args(scene_shards, tmp_path / "fp32", precision="fp32"))
    with pytest.raises(AssertionError, match="bf16"):
        check_bf16_training(result, record)
    monkeypatch.setattr(torch, "autocast", AutocastOff)
    result, record = recording_train(monkeypatch, **run_args(scene_shards, tmp_path / "off"))
    with pytest.raises(AssertionError, match="bf16"):
        check_bf16_training(result, record)


class Crash(Exception):
    pass


def test_bf16_run_resumes_exactly(scene_shards, tmp_path, monkeypatch):
    """A bf16 run stopped after its step-2 checkpoint and resumed ends bit for bit where an
    uninterrupted one does (the fp32 master weights and optimizer state are what is saved)."""
    straight = train(**run_args(scene_shards, tmp_path / "straight", steps=4, save_every=2))
    save = loop._save

    def crash_after_first(cfg, step, *rest):
        path = save(cfg, step, *rest)
        if step == 2:
            raise Crash
        return path

    monkeypatch.setattr(loop, "_save", crash_after_first)
    with pytest.raises(Crash):
        train(**run_args(scene_shards, tmp_path / "resumed", steps=4, save_every=2))
    monkeypatch.setattr(loop, "_save", save)
    resumed = train(**run_args(scene_shards, tmp_path / "resumed", steps=4, save_every=2, resume=True))
    a, b = (load_file(os.path.join(r["checkpoint"], "model.safetensors")) for r in (straight, resumed))
    assert resumed["steps"] == 4 and same_weights(a, b)
    assert resumed["final_loss"] == straight["final_loss"]


DDP_SCRIPT = textwrap.dedent('''
    """bf16 under torchrun (gloo): each rank records its dtypes and writes its final weights."""
    import json, os, sys
    from safetensors.torch import save_file
    import torch
    from torch import nn
    import mdc
    from mdc.base import optim
    from mdc.train import loop

    out, kwargs = sys.argv[1], json.loads(sys.argv[2])
    record = {"linear": set(), "params": set(), "grads": set(), "state": set()}
    create, step, models = loop.create_model, optim.optimizer_step, []

    def creating(*args, **kw):
        model = create(*args, **kw)
        for m in model.modules():
            if isinstance(m, nn.Linear):
                m.register_forward_hook(lambda mod, a, o: record["linear"].add(str(o.dtype)))
        models.append(model)
        return model

    def stepping(model, optimizer, *args, **kw):
        params = [p for g in optimizer.param_groups for p in g["params"]]
        record["params"] |= {str(p.dtype) for p in params}
        record["grads"] |= {str(p.grad.dtype) for p in params if p.grad is not None}
        step(model, optimizer, *args, **kw)
        record["state"] |= {str(v.dtype) for s in optimizer.state.values() for v in s.values() if torch.is_tensor(v)}

    loop.create_model, optim.optimizer_step = creating, stepping
    result = mdc.train.train(**kwargs)
    rank = os.environ["RANK"]
    save_file({k: v.contiguous() for k, v in models[0].state_dict().items()}, os.path.join(out, f"rank{rank}.safetensors"))
    with open(os.path.join(out, f"rank{rank}.json"), "w") as f:
        json.dump({"result": result, "record": {k: sorted(v) for k, v in record.items()}}, f)
''')


def test_ddp_two_gloo_processes_in_bf16(scene_shards, tmp_path):
    """DDP's gradient all-reduce in bf16 training: fp32 gradients and weights, ranks identical."""
    script = tmp_path / "ddp_bf16.py"
    script.write_text(DDP_SCRIPT)
    kwargs = run_args(scene_shards, tmp_path / "run", steps=2, save_every=2, accum_steps=2)
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", str(script),
           str(tmp_path), json.dumps(kwargs)]
    # gloo on the CPU wherever it runs: two ranks on a machine of one GPU would each need a GPU of their own
    env = SUBPROCESS_ENV | {"CUDA_VISIBLE_DEVICES": ""}
    done = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1)]
    for got in ranks:
        record = {k: {getattr(torch, d.removeprefix("torch.")) for d in v} for k, v in got["record"].items()}
        result = dict(got["result"], metrics=str(tmp_path / "run" / "metrics.jsonl"))
        check_bf16_training(result, record)
        assert result["world_size"] == 2 and result["global_batch"] == 16
    w0, w1 = (load_file(tmp_path / f"rank{r}.safetensors") for r in (0, 1))
    assert all(torch.equal(w0[k], w1[k]) for k in w0)
    saved = load_file(os.path.join(ranks[0]["result"]["checkpoint"], "model.safetensors"))
    assert all(torch.equal(saved[k], w0[k]) for k in w0)


# ----------------------------------------------------------------------------- evaluation
def evaluate_all(images) -> tuple[dict, dict]:
    """Every sampler and scorer at precision "fp32" and "bf16" (the switch "auto" flips on CUDA):
    {(what, precision): result} and the dtypes each bf16 call used {what: record}."""
    out, records = {}, {}
    models = {objective: small_model(objective) for objective in ("mdc", "arc", "clip")}
    calls = {
        "mdc generate": (models["mdc"], lambda m, p: mdc.generate(m, images, 6, return_tokens=True, precision=p)),
        "arc beam": (models["arc"], lambda m, p: mdc.generate(m, images, 6, beam_size=3, return_tokens=True,
                                                              precision=p)),
        "arc greedy": (models["arc"], lambda m, p: mdc.generate(m, images, 6, beam_size=1, return_tokens=True,
                                                                precision=p)),
        "exact": (models["arc"], lambda m, p: mdc.score(m, images, CAPTIONS, "exact", precision=p)),
        "elbo": (models["mdc"], lambda m, p: mdc.score(m, images, CAPTIONS, "elbo", num_samples=16, precision=p)),
        "heuristic": (models["mdc"], lambda m, p: mdc.score(m, images, CAPTIONS, "heuristic", precision=p)),
        "cosine": (models["clip"], lambda m, p: mdc.score(m, images, CAPTIONS, "cosine", precision=p)),
        "candidates": (models["mdc"], lambda m, p: mdc.score_candidates(
            m, images, [[c, CAPTIONS[0]] for c in CAPTIONS], "elbo", num_samples=16, precision=p)),
    }
    for what, (model, call) in calls.items():
        out[what, "fp32"] = call(model, "fp32")
        record: dict = {}
        hooked = record_dtypes(model, record)
        out[what, "bf16"] = call(model, "bf16")
        for h in hooked:
            h.remove()
        records[what] = record
    return out, records


def check_bf16_evaluation(out: dict, records: dict) -> None:
    for what, record in records.items():
        assert torch.bfloat16 in record["linear"], f"{what}: no matrix product ran in bf16 ({record['linear']})"
        if "head" in record:
            assert record["head"] == {torch.float32}, what  # the vocabulary head stays fp32 under bf16
        bf16, fp32 = out[what, "bf16"], out[what, "fp32"]
        if bf16.is_floating_point():  # scores: fp32, finite, near fp32's (tests/mdc/test_scoring.py bounds them)
            assert bf16.dtype == torch.float32 and torch.isfinite(bf16).all(), what
            torch.testing.assert_close(bf16, fp32, rtol=0.05, atol=0.5, msg=what)
        else:  # captions: token ids of the model's vocabulary
            assert bf16.shape[0] == fp32.shape[0] and int(bf16.max()) < 10**6, what


def test_generation_and_every_scorer_under_cpu_bf16_autocast(images):
    check_bf16_evaluation(*evaluate_all(images))


def test_ignored_evaluation_switch_is_noticed(images, monkeypatch):
    monkeypatch.setattr(torch, "autocast", AutocastOff)
    with pytest.raises(AssertionError, match="bf16"):
        check_bf16_evaluation(*evaluate_all(images))


@pytest.mark.parametrize("precision, tf32_inside", [("fp32", False), ("bf16", True)])
def test_fp32_evaluation_turns_tf32_off_and_restores_the_flags(precision, tf32_inside):
    """fp32 scores are fp32 through the conv stem and patch embedding too: TF32 (matmul and cuDNN) off
    inside evaluating(..., "fp32"), the caller's flags back afterwards (bf16 leaves them alone)."""
    from mdc.model import evaluating

    model = small_model("mdc")
    saved = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    try:
        torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = True
        with evaluating(model, precision):
            inside = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
        assert inside == (tf32_inside, tf32_inside)
        assert (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32) == (True, True)
        with pytest.raises(RuntimeError), evaluating(model, precision):
            raise RuntimeError("an error inside restores the flags too")
        assert (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32) == (True, True)
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = saved
