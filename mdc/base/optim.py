"""Optimisation recipe of the paper: AdamW, parameter groups, linear warmup + cosine decay.

The per-backbone values are the paper's pretraining hyperparameter tables (App. A, Tables 6-8;
``paper/hyperparameters.csv``): AdamW with betas (0.9, 0.98), global batch 1024, 10,000
linear warmup steps then cosine decay to 0, 32 epochs. Gradient-norm clipping (1.0) is used
only for ARC with ViT-L/14 (on CC12M, the paper's only clipped run).

Any other recipe is a preset file (:func:`read_preset`), e.g. the `mini` reproduction profile's,
which its study froze and which lives with the experiments (``reproduce/presets/mini.json``).
"""
from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass

import torch
from torch import nn

from mdc.base.errors import ConfigError
from mdc.base.options import with_options

# Paper App. A, Tables 6-8 (pretraining hyperparameters per backbone).
PRESETS: dict[str, dict] = {
    "vit-b-32": dict(lr=5e-4, weight_decay=0.1),
    "vit-b-16": dict(lr=5e-4, weight_decay=0.2),
    "vit-l-14": dict(lr=4e-4, weight_decay=0.2),
}
PAPER = dict(betas=(0.9, 0.98), global_batch=1024, warmup_steps=10_000, epochs=32)
CLIPPED = {("vit-l-14", "arc"): 1.0}  # (preset, objective) -> grad-norm clip
# What a preset file may set (read_preset), besides "model", "about" and per-objective "objectives".
PRESET_VALUES = ("lr", "weight_decay", "steps", "epochs", "batch_size", "global_batch", "warmup_steps",
                 "grad_clip_norm")

# Parameters that are embeddings or temperatures, by their attribute name; never decayed.
_NO_DECAY_NAMES = {"pos", "pos_embed", "cls_token", "reg_token", "logit_scale"}


def preset_values(preset: str, objective: str) -> dict:
    """The recipe of a preset for one objective: ``model`` (its backbone), lr, weight_decay,
    global_batch, warmup_steps, epochs (or steps and batch_size), grad_clip_norm, and for the
    paper's presets betas. ``preset``: a name of :data:`PRESETS` (the paper's recipe of that
    backbone) or the path of a preset file (:func:`read_preset`)."""
    if preset in PRESETS:
        return {**PAPER, **PRESETS[preset], "model": preset, "grad_clip_norm": CLIPPED.get((preset, objective))}
    if not os.path.isfile(preset):
        raise ConfigError(f"preset must be one of {', '.join(map(repr, sorted(PRESETS)))} or the path of a "
                          f"JSON file of training values, got {preset!r}", "preset")
    spec = read_preset(preset)
    values = {k: spec[k] for k in ("model", *PRESET_VALUES) if k in spec}
    return {"grad_clip_norm": None, **values, **spec.get("objectives", {}).get(objective, {})}


def read_preset(path: str) -> dict:
    """A preset file: a JSON object of training values (:data:`PRESET_VALUES`), optionally the
    ``model`` they are for, an ``about`` text (where the values come from) and ``objectives``:
    {objective: {value: ...}} that one objective uses in place of the common values, e.g.
    ``{"lr": 1e-3, "steps": 2240, "objectives": {"clip": {"lr": 3e-4}}}``. A value the file leaves
    out keeps the training default. An unknown key is refused (a misspelt value would be lost)."""
    with open(path) as f:
        try:
            spec = json.load(f)
        except json.JSONDecodeError as exn:
            raise ConfigError(f"preset file {path} is not JSON: {exn}", "preset") from exn
    if not isinstance(spec, dict) or not isinstance(spec.get("objectives", {}), dict):
        raise ConfigError(f"preset file {path} must hold a JSON object, its objectives an object too", "preset")
    known = {"model", "about", "objectives", *PRESET_VALUES}
    unknown = sorted(set(spec) - known) + sorted(k for per in spec.get("objectives", {}).values()
                                                 for k in set(per) - set(PRESET_VALUES))
    if unknown:
        raise ConfigError(f"preset file {path}: unknown key {unknown[0]!r}; known: {', '.join(sorted(known))}",
                          "preset")
    return spec


def param_groups(model: nn.Module, weight_decay: float) -> list[dict]:
    """Two AdamW groups: decayed weight matrices, and everything else undecayed.

    Undecayed: biases and norm parameters (ndim < 2), token embeddings (``nn.Embedding``),
    position embeddings, class tokens and the CLIP temperature ``logit_scale``.
    """
    no_decay: set[int] = set()
    for module in model.modules():
        for name, p in module.named_parameters(recurse=False):
            if p.ndim < 2 or isinstance(module, (nn.Embedding, nn.LayerNorm)) or name in _NO_DECAY_NAMES:
                no_decay.add(id(p))
    params = [p for p in model.parameters() if p.requires_grad]
    return [
        {"params": [p for p in params if id(p) not in no_decay], "weight_decay": weight_decay},
        {"params": [p for p in params if id(p) in no_decay], "weight_decay": 0.0},
    ]


FUSED_DEVICES = ("cuda", "cpu", "xpu", "mps")  # where torch's AdamW has a fused kernel


def make_optimizer(model: nn.Module, lr: float, weight_decay: float,
                   betas: tuple[float, float] = PAPER["betas"]) -> torch.optim.AdamW:
    """AdamW over :func:`param_groups`, fused (one kernel for every parameter, no per-parameter step counter
    read on the host) where the parameters' device has the kernel: on a CPU, 6 operators a step instead of
    about 1,400 for ``mini``."""
    groups = param_groups(model, weight_decay)
    devices = {p.device.type for g in groups for p in g["params"]}
    fused = len(devices) == 1 and devices <= set(FUSED_DEVICES)
    return torch.optim.AdamW(groups, lr=lr, betas=tuple(betas), fused=fused)


def warmup_cosine(warmup_steps: int, total_steps: int):
    """LR factor of optimizer step s (0-based): linear warmup to 1, then cosine decay to 0 at ``total_steps``."""

    def factor(step: int) -> float:
        if step < warmup_steps:
            return (step + 1) / warmup_steps
        progress = (step - warmup_steps) / max(1, total_steps - warmup_steps)
        return 0.5 * (1.0 + math.cos(math.pi * min(1.0, progress)))

    return factor


def make_scheduler(optimizer: torch.optim.Optimizer, warmup_steps: int, total_steps: int):
    return torch.optim.lr_scheduler.LambdaLR(optimizer, warmup_cosine(warmup_steps, total_steps))


def optimizer_step(model: nn.Module, optimizer: torch.optim.Optimizer, scheduler, grad_clip_norm: float | None = None):
    """The end of a training step, once the gradients are in: clip their norm (if ``grad_clip_norm``),
    step the optimizer and the LR schedule, clamp CLIP's temperature in place (open_clip's rule,
    ``model.clamp_logit_scale``) and drop the gradients. The pretraining loop (:mod:`mdc.train`) and
    :func:`fit` both end their steps here."""
    if grad_clip_norm:
        nn.utils.clip_grad_norm_(model.parameters(), grad_clip_norm)
    optimizer.step()
    if hasattr(model, "clamp_logit_scale"):
        model.clamp_logit_scale()
    scheduler.step()
    optimizer.zero_grad(set_to_none=True)


@dataclass(frozen=True)
class FitOptions:
    """An in-memory fit's optimizer settings beyond its steps and peak rate (one default each)."""
    weight_decay: float = 0.1  # AdamW's decay of the weight matrices (param_groups)
    warmup_steps: int | None = None  # linear warm-up, then cosine decay to 0; None: 5% of the steps, at least 1
    grad_clip_norm: float | None = None  # gradient-norm clip; None: off


def fit(model: nn.Module, next_batch, steps: int, lr: float, options: FitOptions | None = None, *, loss_fn=None,
        stop=None, **kw) -> list[float]:
    """Train ``model`` in memory: ``steps`` AdamW steps on ``model.loss(*next_batch())``.

    ``next_batch()`` returns the loss's inputs (images, tokens); ``options`` (or its fields as keywords,
    :class:`FitOptions`): AdamW with :func:`param_groups`, ``warmup_steps`` of linear warm-up then cosine
    decay to 0, gradient-norm clipping if ``grad_clip_norm``. ``loss_fn(*next_batch())``, if given, is the
    loss in place of ``model.loss`` (e.g. the loss with a generator, or linear heads on the image features,
    with ``model`` holding every trained module). The loop of the tutorials, of captioning fine-tuning and of
    the studies' in-memory training; pretraining (:mod:`mdc.train`) adds accumulation, DDP and checkpoints
    around the same :func:`optimizer_step`. ``stop(step)``, if given, is asked after each step (1-based)
    whether to stop before ``steps`` (captioning fine-tuning's stopping rule); the schedule stays that of
    ``steps``. Returns the per-step losses; the model is left in eval mode.
    """
    o = with_options(FitOptions, options, kw, "fit")
    weight_decay, warmup_steps, grad_clip_norm = o.weight_decay, o.warmup_steps, o.grad_clip_norm
    optimizer = make_optimizer(model, lr, weight_decay)
    scheduler = make_scheduler(optimizer, max(1, steps // 20) if warmup_steps is None else warmup_steps, steps)
    loss_fn = loss_fn or model.loss
    losses = []
    model.train()
    optimizer.zero_grad(set_to_none=True)  # no gradient left over from before
    for step in range(1, steps + 1):
        loss = loss_fn(*next_batch())
        loss.backward()
        optimizer_step(model, optimizer, scheduler, grad_clip_norm)
        losses.append(loss.item())
        if stop is not None and stop(step):
            break
    model.eval()
    return losses
