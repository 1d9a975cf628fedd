"""Optimisation recipe of the paper: AdamW, parameter groups, linear warmup + cosine decay.

The per-backbone values are the paper's pretraining hyperparameter tables (App. A, Tables 6-8;
``paper/hyperparameters.csv``): AdamW with betas (0.9, 0.98), global batch 1024, 10,000
linear warmup steps then cosine decay to 0, 32 epochs. Gradient-norm clipping (1.0) is used
only for ARC with ViT-L/14 (on CC12M, the paper's only clipped run).
"""
from __future__ import annotations

import math

import torch
from torch import nn

# Paper App. A, Tables 6-8 (pretraining hyperparameters per backbone).
PRESETS: dict[str, dict] = {
    "vit-b-32": dict(lr=5e-4, weight_decay=0.1),
    "vit-b-16": dict(lr=5e-4, weight_decay=0.2),
    "vit-l-14": dict(lr=4e-4, weight_decay=0.2),
}
# The `mini` reproduction profile on the synthetic world (model "mini", 2 CPU cores, descriptive
# captions): the recipe of the learnability study's second part (reproduce/studies/learnability.md), not
# the paper's: lr 1e-3 by the supervised ceiling's training loss, 2,240 steps (4x the first study's 560).
PRESETS["mini"] = dict(lr=1e-3, weight_decay=0.1, steps=2240, batch_size=64, global_batch=64, warmup_steps=224)
PAPER = dict(betas=(0.9, 0.98), global_batch=1024, warmup_steps=10_000, epochs=32)
CLIPPED = {("vit-l-14", "arc"): 1.0}  # (preset, objective) -> grad-norm clip
# (preset, objective) -> peak lr in place of the preset's. mini's CLIP: at 1e-3 its InfoNCE stalled on alt
# captions in one seed of two; 3e-4 trains in every run of the study's rule (learnability.md).
OBJECTIVE_LR = {("mini", "clip"): 3e-4}

# Parameters that are embeddings or temperatures, by their attribute name; never decayed.
_NO_DECAY_NAMES = {"pos", "pos_embed", "cls_token", "reg_token", "logit_scale"}


def preset_values(preset: str, objective: str) -> dict:
    """lr, weight_decay, betas, global_batch, warmup_steps, epochs (or steps and batch_size) and
    grad_clip_norm of a preset for one objective."""
    if preset not in PRESETS:
        raise ValueError(f"unknown preset {preset!r}; choose one of {sorted(PRESETS)}")
    values = {**PAPER, **PRESETS[preset], "grad_clip_norm": CLIPPED.get((preset, objective))}
    return {**values, "lr": OBJECTIVE_LR.get((preset, objective), values["lr"])}


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


def make_optimizer(model: nn.Module, lr: float, weight_decay: float,
                   betas: tuple[float, float] = PAPER["betas"]) -> torch.optim.AdamW:
    return torch.optim.AdamW(param_groups(model, weight_decay), lr=lr, betas=tuple(betas))


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


def fit(model: nn.Module, next_batch, steps: int, lr: float, weight_decay: float = 0.1, warmup_steps: int | None = None,
        grad_clip_norm: float | None = None, loss_kwargs: dict | None = None) -> list[float]:
    """Train ``model`` in memory: ``steps`` AdamW steps on ``model.loss(*next_batch(), **loss_kwargs)``.

    ``next_batch()`` returns the loss's inputs (images, tokens); AdamW with :func:`param_groups`,
    ``warmup_steps`` of linear warm-up (default 5% of the steps, at least 1) then cosine decay to 0,
    gradient-norm clipping if ``grad_clip_norm``. The loop of the tutorials and of captioning
    fine-tuning; pretraining (:mod:`mdc.train`) adds accumulation, DDP and checkpoints around the
    same :func:`optimizer_step`. Returns the per-step losses; the model is left in eval mode.
    """
    optimizer = make_optimizer(model, lr, weight_decay)
    scheduler = make_scheduler(optimizer, max(1, steps // 20) if warmup_steps is None else warmup_steps, steps)
    losses = []
    model.train()
    optimizer.zero_grad(set_to_none=True)  # no gradient left over from before
    for _ in range(steps):
        loss = model.loss(*next_batch(), **(loss_kwargs or {}))
        loss.backward()
        optimizer_step(model, optimizer, scheduler, grad_clip_norm)
        losses.append(loss.item())
    model.eval()
    return losses
