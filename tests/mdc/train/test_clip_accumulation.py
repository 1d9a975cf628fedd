"""CLIP with gradient accumulation contrasts the whole (global) batch, as one big batch would."""
import json
import math
import os

import pytest
import torch

from mdc.base import optim
from mdc.world.scenes import vocabulary, write_shards
from mdc.train import LossModule, accumulate, train
from conftest import CAPTIONS, SMALL, clip_batch, small_model


def test_clip_accumulation_equals_one_big_batch():
    """In float64: exactness is checked, not float32 rounding (which differs with the CPU's kernels)."""
    model = small_model("clip").double()
    images, captions = clip_batch(torch.float64)
    tokens = model.tokenizer(captions)
    with torch.no_grad():
        model.logit_scale.fill_(2.0)  # away from the clamp, so that the temperature has a gradient
    loss = model.loss(images, tokens)
    loss.backward()
    big = {n: p.grad.clone() for n, p in model.named_parameters()}
    model.zero_grad(set_to_none=True)

    micro = [(images[i : i + 2], tokens[i : i + 2]) for i in range(0, 8, 2)]  # 4 micro-batches of 2
    got = accumulate(LossModule(model), model, micro)
    torch.testing.assert_close(got.double(), loss.detach(), rtol=1e-6, atol=1e-6)  # the loss is logged in float32
    assert big["logit_scale"].abs() > 0
    for name, p in model.named_parameters():  # every parameter, the temperature counted once
        torch.testing.assert_close(p.grad, big[name], rtol=1e-9, atol=1e-12, msg=name)


def test_captioner_accumulation_averages_the_micro_batch_losses():
    model = small_model("arc")
    images, tokens = torch.randn(4, 3, 32, 32), model.tokenizer(CAPTIONS)
    parts = [model.loss(images[i : i + 2], tokens[i : i + 2]).detach() for i in (0, 2)]
    got = accumulate(LossModule(model), model, [(images[:2], tokens[:2]), (images[2:], tokens[2:])])
    torch.testing.assert_close(got, (parts[0] + parts[1]) / 2)


pytestmark = pytest.mark.usefixtures("one_thread")  # fast on a busy 2-core machine, bitwise comparable


def test_train_loop_clip_accumulation_logs_the_big_batch_loss(tmp_path):
    """batch 4 x accum 2 trains like batch 8 (one worker: the same samples in the same order)."""
    write_shards(str(tmp_path / "data"), 32, "alt", seed=0, image_size=32, shard_size=32)
    common = dict(train_data=str(tmp_path / "data" / "000000.tar"), objective="clip", steps=2, lr=1e-3, workers=1,
                  shuffle_buffer=8, model_overrides=SMALL | {"vocab": list(vocabulary()), "context_length": 32})
    big = train(**common, output_dir=str(tmp_path / "big"), batch_size=8)
    accum = train(**common, output_dir=str(tmp_path / "accum"), batch_size=4, accum_steps=2)
    assert accum["global_batch"] == big["global_batch"] == 8
    rows = [[json.loads(line)["loss"] for line in open(os.path.join(r["metrics"]))] for r in (big, accum)]
    assert rows[1] == pytest.approx(rows[0], rel=1e-5)


@pytest.mark.parametrize("loop", ["trainer", "fit"])
def test_a_temperature_past_the_clamp_keeps_its_gradient_and_is_clamped_after_the_step(loop):
    """open_clip clamps logit_scale in place after each optimizer step; a clamp inside the forward
    would give a temperature past log 100 a zero gradient for ever."""
    model = small_model("clip")
    images, captions = clip_batch()
    tokens = model.tokenizer(captions)
    with torch.no_grad():
        model.logit_scale.fill_(math.log(200))
    if loop == "trainer":  # the pretraining loop's step: accumulate, then optim.optimizer_step
        optimizer = optim.make_optimizer(model, 1e-3, 0.1)
        accumulate(LossModule(model), model, [(images, tokens)])
        assert model.logit_scale.grad.abs() > 0
        optim.optimizer_step(model, optimizer, optim.make_scheduler(optimizer, 1, 10))
    else:
        grads = []
        model.logit_scale.register_hook(grads.append)
        optim.fit(model, lambda: (images, tokens), steps=1, lr=1e-3)
        assert grads and grads[0].abs() > 0
    assert model.logit_scale.item() == torch.tensor(math.log(100)).item()


def test_a_graphed_step_is_marked_as_new_and_keeps_a_copy_of_its_loss(monkeypatch):
    """CUDA graphs overwrite a replay's outputs at the next one: ``accumulate(graphs=True)``, the one helper the
    training loop and the GPU benchmark's trainer share, marks the step first and returns a copy of the loss."""
    import mdc.train.loop as loop

    made, marks = torch.tensor(1.5), []
    monkeypatch.setattr(loop, "_accumulate", lambda *a: made)
    monkeypatch.setattr(torch.compiler, "cudagraph_mark_step_begin", lambda: marks.append("mark"))
    graphed = accumulate(None, None, [], graphs=True)
    assert marks == ["mark"] and graphed is not made and graphed.data_ptr() != made.data_ptr() and graphed == made
    assert accumulate(None, None, []) is made and marks == ["mark"]  # eager: the loss itself, no mark
