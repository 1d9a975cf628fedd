"""The training step as one static graph: a loss forward and backward on the tokenizer's padded output reads
nothing off the device (no .item(), bool() or int() of a tensor, no nonzero, no boolean-mask indexing), traces
as one graph with no break, and equals the gathered losses it replaced; the loop reads the device only at its
log and save steps."""
import pytest
import torch
import torch._dynamo
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode

from conftest import CAPTIONS, small_model
from mdc.tokenizer import caption_mask, trim_padding, valid_mask
from mdc.train import loop

OBJECTIVES = ("mdc", "arc", "clip")
# operators that make the host wait for the device: a tensor read as a Python number or bool, a shape that
# depends on values
READS = {"_local_scalar_dense", "is_nonzero", "nonzero", "nonzero_static", "masked_select", "unique", "item"}


class Reads(TorchDispatchMode):
    """The operators of a region that read a value off the device, by name."""

    def __init__(self):
        super().__init__()
        self.found = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func.overloadpacket.__name__
        indices = args[1] if name in ("index", "index_put", "index_put_", "_index_put_impl_") else ()
        if name in READS or any(isinstance(i, torch.Tensor) and i.dtype == torch.bool for i in indices or ()):
            self.found.append(name)
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("objective", OBJECTIVES)
def test_a_loss_step_reads_nothing_off_the_device(objective):
    model = small_model(objective)
    images, tokens = torch.randn(4, 3, 32, 32), model.tokenizer(CAPTIONS)  # padded to the context
    with Reads() as reads:
        model.loss(images, tokens).backward()
    assert reads.found == []


@pytest.mark.parametrize("objective", OBJECTIVES)
def test_a_loss_traces_as_one_graph(objective):
    torch._dynamo.reset()
    model = small_model(objective)
    images, tokens = torch.randn(4, 3, 32, 32), model.tokenizer(CAPTIONS)
    explained = torch._dynamo.explain(model.loss)(images, tokens)
    assert (explained.graph_count, explained.graph_break_count) == (1, 0), explained.break_reasons


def _gathered_mdc(model, images, tokens, t, u):
    """The loss as it was computed before: trimmed tokens, the head at the masked positions only."""
    tok = model.tokenizer
    tokens = trim_padding(tokens, tok.eot_id)
    maskable = caption_mask(tokens, tok.sot_id, tok.eot_id)
    masked = (u[:, : tokens.shape[1]] < t[:, None]) & maskable
    hidden = model.hidden(tokens.masked_fill(masked, tok.mask_id), model.context(images))
    ce = F.cross_entropy(model.head(hidden[masked]).float(), tokens[masked], reduction="none")
    return (ce / t[:, None].expand_as(masked)[masked]).sum() / maskable.sum()


def _gathered_arc(model, images, tokens):
    tokens = trim_padding(tokens, model.tokenizer.eot_id)
    supervised = valid_mask(tokens, model.tokenizer.eot_id)[:, 1:]
    hidden = model.hidden(tokens[:, :-1], model.context(images))
    return F.cross_entropy(model.head(hidden[supervised]).float(), tokens[:, 1:][supervised])


def test_the_dense_losses_equal_the_gathered_ones():
    """Weights 0 at the unmasked positions and at the padding (MDC), ignore_index (ARC), the text pooled at [EOT]
    with or without the padding after it (CLIP): the same losses as before, to 1e-6."""
    images = torch.randn(4, 3, 32, 32)
    mdc, arc, clip = (small_model(o).eval() for o in OBJECTIVES)
    tokens = mdc.tokenizer(CAPTIONS)
    t, u = torch.tensor([0.5, 0.7, 0.9, 1.0]), torch.rand(4, tokens.shape[1], generator=torch.Generator().manual_seed(0))
    torch.testing.assert_close(mdc.loss(images, tokens, t=t, u=u), _gathered_mdc(mdc, images, tokens, t, u),
                               rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(arc.loss(images, tokens), _gathered_arc(arc, images, tokens), rtol=1e-6, atol=1e-6)
    trimmed = trim_padding(tokens, clip.tokenizer.eot_id)
    torch.testing.assert_close(clip.loss(images, tokens), clip.loss(images, trimmed), rtol=1e-6, atol=1e-6)


def test_bad_values_fail_on_the_device_and_name_the_problem():
    model = small_model()
    tokens = model.tokenizer(CAPTIONS)
    with pytest.raises(RuntimeError, match="NaN or infinite"):
        model.loss(torch.full((4, 3, 32, 32), float("nan")), tokens)
    with pytest.raises(RuntimeError, match=rf"token ids must lie in \[0, {model.tokenizer.vocab_size}\)"):
        model.loss(torch.randn(4, 3, 32, 32), tokens.masked_fill(tokens == tokens[0, 1], 10**6))


def test_the_loop_reads_the_device_at_its_log_and_save_steps_only(scene_shards, tmp_path, monkeypatch):
    from conftest import TRAIN_MODEL

    reads, read = [], loop.read  # mdc.train.progress.read, as the loop calls it
    monkeypatch.setattr(loop, "read", lambda run: (reads.append(run.step), read(run))[1])
    out = loop.train(train_data=scene_shards, output_dir=str(tmp_path / "run"), model_overrides=TRAIN_MODEL,
                     batch_size=4, steps=8, log_every=4, save_every=6, workers=0, progress=False)
    assert reads == [4, 6, 8] and out["steps"] == 8


def test_the_optimizer_step_is_one_fused_kernel_per_group():
    """AdamW fused where the device has the kernel (the CPU does): a handful of operators a step, not a few per
    parameter, and no step counter read on the host."""
    from mdc.base import optim

    model = small_model()
    opt = optim.make_optimizer(model, 1e-3, 0.1)
    assert all(g["fused"] for g in opt.param_groups)
    for p in model.parameters():
        p.grad = torch.ones_like(p)
    opt.step()  # the first step makes the state
    with Reads() as reads, Ops() as ops:
        opt.step()
    assert reads.found == [] and ops.count < 20


class Ops(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.count = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.count += 1
        return func(*args, **(kwargs or {}))
