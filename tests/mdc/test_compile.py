"""``--compile`` on CPU: the training loop's ``torch.compile`` path, run where the tests run.

A short MDC, ARC and CLIP run with ``compile=True`` (each loss one graph, ``fullgraph``) must equal the eager
run (the same caption-length buckets: the stream cuts each batch's tokens to a multiple of 16 when compiling,
so the eager twin is given the same cut) and must stop compiling once warm: Dynamo's
graph counter (``torch._dynamo.utils.counters["stats"]["unique_graphs"]``) is read at every optimizer step and may
grow only in the first ``WARM`` steps (the first graphs, then a recompilation with dynamic shapes
where a batch's length first changes).

- In ``make test``: the ``aot_eager`` backend (Dynamo's graphs and AOTAutograd's joint graph, no
  code generation; about 20 s a run): bit-for-bit the eager run.
- In ``make test-slow`` (``-m slow``): inductor, the default backend, generating C++ with gcc
  (minutes on a cold cache); ``torch._inductor.config.fallback_random`` makes its random masks
  eager's, so the losses agree to float rounding.
- ``test_an_ignored_compile_switch_is_noticed``: with ``torch.compile`` a no-op, the checks fail.
"""
import functools
import json
import os

import pytest
import torch
import torch._dynamo
import torch._inductor.config
from safetensors.torch import load_file
from torch._dynamo.utils import counters

import mdc
from mdc.base import optim
from mdc.tokenizer import trim_padding
from mdc.train import LossModule, stream, train
from conftest import CAPTIONS, SMALL, TRAIN_MODEL

STEPS, WARM = 6, 2

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(autouse=True)
def fresh_dynamo():
    torch._dynamo.reset()
    counters.clear()
    yield
    torch._dynamo.reset()


def run_args(data, out, objective, **kw):
    return dict(train_data=data, output_dir=str(out), objective=objective, model_overrides=TRAIN_MODEL, batch_size=4,
                lr=1e-3, workers=0, shuffle_buffer=8, steps=STEPS, save_every=STEPS, warmup_steps=1, progress=False,
                precision="fp32") | kw


def counting_train(monkeypatch, **kwargs) -> tuple[dict, list[int]]:
    """``train(**kwargs)`` and Dynamo's count of compiled graphs at each optimizer step."""
    frames, step = [], optim.optimizer_step

    def stepping(*args, **kw):
        frames.append(counters["stats"]["unique_graphs"])
        step(*args, **kw)

    monkeypatch.setattr(optim, "optimizer_step", stepping)
    result = train(**kwargs)
    monkeypatch.setattr(optim, "optimizer_step", step)
    return result, frames


def eager_twin(monkeypatch, **kwargs) -> dict:
    """The eager run with the compiled run's caption-length buckets (multiples of 16, cut by the stream)."""
    make = stream.make_loader
    monkeypatch.setattr(stream, "make_loader", lambda *a, **kw: make(*a, **{**kw, "trim_multiple": 16}))
    result = train(**kwargs)
    monkeypatch.setattr(stream, "make_loader", make)
    return result


def check_compiled(eager: dict, compiled: dict, frames: list[int], rtol: float, atol: float) -> None:
    """What a compiled run must show: frames compiled, none after the first WARM steps, the eager losses
    and weights."""
    assert len(frames) == STEPS and frames[0] > 0, f"nothing was compiled (Dynamo graphs per step: {frames})"
    late = [i + 1 for i in range(WARM, STEPS) if frames[i] != frames[i - 1]]
    assert not late, f"recompiled at steps {late} once warm (graphs per step: {frames})"
    losses = [[json.loads(line)["loss"] for line in open(r["metrics"])] for r in (eager, compiled)]
    torch.testing.assert_close(losses[1], losses[0], rtol=rtol, atol=0)
    a, b = (load_file(os.path.join(r["checkpoint"], "model.safetensors")) for r in (eager, compiled))
    for name in a:
        torch.testing.assert_close(b[name], a[name], rtol=0, atol=atol, msg=name)


@pytest.mark.parametrize("objective", ["mdc", "arc", "clip"])
def test_compiled_training_equals_eager_and_stops_compiling(scene_shards, tmp_path, monkeypatch, objective):
    """aot_eager: Dynamo's graph capture (the whole loss as one graph: fullgraph turns a break into an error;
    guards, dynamic shapes) and AOTAutograd's joint forward-backward graph, bit for bit."""
    eager = eager_twin(monkeypatch, **run_args(scene_shards, tmp_path / "eager", objective))
    asked = []
    compile_ = functools.partial(torch.compile, backend="aot_eager")
    monkeypatch.setattr(torch, "compile", lambda model, **kw: asked.append(kw) or compile_(model, **kw))
    compiled, frames = counting_train(monkeypatch, **run_args(scene_shards, tmp_path / "compiled", objective,
                                                              compile=True))
    check_compiled(eager, compiled, frames, rtol=0, atol=0)
    assert asked == [{"fullgraph": True, "mode": None}]


def test_an_ignored_compile_switch_is_noticed(scene_shards, tmp_path, monkeypatch):
    eager = eager_twin(monkeypatch, **run_args(scene_shards, tmp_path / "eager", "arc"))
    monkeypatch.setattr(torch, "compile", lambda model, **kw: model)  # compile=True does nothing
    compiled, frames = counting_train(monkeypatch, **run_args(scene_shards, tmp_path / "compiled", "arc", compile=True))
    with pytest.raises(AssertionError, match="nothing was compiled"):
        check_compiled(eager, compiled, frames, rtol=0, atol=0)


def test_a_compiled_loss_takes_new_batch_sizes():
    """A second batch size makes Dynamo trace the batch dimension as a symbol; the MDC loss's random
    draws must trace with it (torch.rand(B, generator=None) did not) and match eager's."""
    model = mdc.create_model("tiny", "mdc", **SMALL)
    net, compiled = LossModule(model), torch.compile(LossModule(model), backend="aot_eager")
    for B in (4, 6, 8):
        tokens = trim_padding(model.tokenizer((CAPTIONS * 2)[:B]), model.tokenizer.eot_id, 16)  # as the stream cuts
        images = torch.randn(B, 3, 32, 32)
        torch.manual_seed(B)
        eager = net(images, tokens)
        torch.manual_seed(B)
        torch.testing.assert_close(compiled(images, tokens), eager, rtol=1e-6, atol=0)


@pytest.mark.slow
@pytest.mark.parametrize("objective", ["mdc", "arc"])
def test_inductor_training_equals_eager_and_stops_compiling(scene_shards, tmp_path, monkeypatch, objective):
    """Inductor's C++ code (the default backend): the losses agree to float rounding, the weights after
    6 AdamW steps to 1e-2 (measured for MDC: 7e-4; AdamW's normalised step amplifies rounding in
    near-zero gradients)."""
    eager = eager_twin(monkeypatch, **run_args(scene_shards, tmp_path / "eager", objective))
    with torch._inductor.config.patch(fallback_random=True):  # eager's random masks
        compiled, frames = counting_train(monkeypatch, **run_args(scene_shards, tmp_path / "compiled", objective,
                                                                  compile=True))
    check_compiled(eager, compiled, frames, rtol=1e-4, atol=1e-2)
