"""The FLOP and memory meter: what the code run inside ``with Meter(model) as m:`` costs.

- FLOPs (``m.flops``, ``m.by_op()``): ``torch.utils.flop_counter.FlopCounterMode`` over everything
  run inside, forward and backward: matrix products, convolutions and attention, 2 per multiply-add,
  as MFU counts them; elementwise ops, norms, reductions and the optimizer are not counted. The
  counter knows the CUDA kernels of ``scaled_dot_product_attention`` and its math path, not its CPU
  kernel: that one is counted at the counter's formula for the others (all L x S scores, padding
  and causal masks included).
- Activation memory (``m.saved_bytes``, given ``model``): the bytes of every storage autograd saves
  for backward, ``model``'s parameters excluded.
- ``fused=True``: attention runs as the GPU's memory-efficient kernel. On the meta device (shapes
  only: a ViT-L/14 built there costs no memory) the dispatcher would take the math path, which
  saves the [B, h, L, S] attention matrix that no GPU kernel keeps.

The dry run costs the paper profile with it (``reproduce/cost/model_cost.py``); the benchmarks count a
training step with it (``benchmarks/flops.py``, ``benchmarks/gpu.py``).
"""
from __future__ import annotations

import contextlib
from contextlib import contextmanager

import torch
import torch.nn.functional as F
from torch.utils.flop_counter import FlopCounterMode, sdpa_backward_flop_count, sdpa_flop_count

aten = torch.ops.aten


def _cpu_sdpa(query, key, value, *args, **kwargs) -> int:
    return sdpa_flop_count(query, key, value)


def _cpu_sdpa_backward(grad_out, query, key, value, *args, **kwargs) -> int:
    return sdpa_backward_flop_count(grad_out, query, key, value)


#: FlopCounterMode's formulas for SDPA's CPU kernel (it counts the CUDA kernels and the math path only)
CPU_ATTENTION = {aten._scaled_dot_product_flash_attention_for_cpu: _cpu_sdpa,
                 aten._scaled_dot_product_flash_attention_for_cpu_backward: _cpu_sdpa_backward}


def _fused_sdpa(q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False):
    """SDPA as the GPU's memory-efficient kernel (on meta the dispatcher picks the math path, which
    saves the [B, h, L, S] attention matrix no GPU kernel keeps)."""
    bias = None
    if attn_mask is not None:
        if attn_mask.dtype == torch.bool:
            attn_mask = torch.zeros(attn_mask.shape, dtype=q.dtype, device=q.device).masked_fill(~attn_mask, -1e4)
        bias = attn_mask.expand(q.shape[0], q.shape[1], q.shape[2], k.shape[2])
    return torch.ops.aten._scaled_dot_product_efficient_attention(q, k, v, bias, True, dropout_p, is_causal,
                                                                  scale=scale)[0]


@contextmanager
def fused_attention():
    """F.scaled_dot_product_attention (called by the model and timm at run time) as :func:`_fused_sdpa`."""
    real = F.scaled_dot_product_attention
    F.scaled_dot_product_attention = _fused_sdpa
    try:
        yield
    finally:
        F.scaled_dot_product_attention = real


class SavedBytes:
    """A saved-tensors pack hook that adds up the bytes of each storage autograd keeps, parameters' excluded."""

    def __init__(self, model):
        self.params = {p.untyped_storage()._cdata for p in model.parameters()}
        self.seen: dict[int, int] = {}

    def __call__(self, t):
        storage = t.untyped_storage()
        if storage._cdata not in self.params:
            self.seen[storage._cdata] = storage.nbytes()
        return t

    @property
    def total(self) -> int:
        return sum(self.seen.values())


class Meter:
    """Counts the FLOPs (and, given ``model``, the saved activation bytes) of what runs inside it;
    ``fused``: attention as the GPU's memory-efficient kernel (module docstring)."""

    def __init__(self, model=None, fused: bool = False):
        self.fused = fused
        self.counter = FlopCounterMode(display=False, custom_mapping=CPU_ATTENTION)
        self.saved = None if model is None else SavedBytes(model)
        self._stack = contextlib.ExitStack()

    def __enter__(self) -> Meter:
        if self.fused:
            self._stack.enter_context(fused_attention())
        self._stack.enter_context(self.counter)
        if self.saved is not None:
            self._stack.enter_context(torch.autograd.graph.saved_tensors_hooks(self.saved, lambda t: t))
        return self

    def __exit__(self, *exc) -> bool | None:
        return self._stack.__exit__(*exc)

    @property
    def flops(self) -> float:
        return float(self.counter.get_total_flops())

    def by_op(self) -> dict[str, int]:
        """The FLOPs by aten operator."""
        return {str(op): n for op, n in self.counter.get_flop_counts()["Global"].items()}

    @property
    def saved_bytes(self) -> float:
        return float(self.saved.total) if self.saved is not None else 0.0
