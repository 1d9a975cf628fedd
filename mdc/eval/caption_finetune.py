"""Fine-tuning a pretrained captioner on a captioning set's train split with its own loss (Table 3),
until its validation loss stops improving.

The stopping rule (:class:`StopRule`, fixed before any method was compared; docs/evaluation.md): the loss on
the validation images, each with every one of its references (MDC's masks and times drawn from one seed, the
same at every evaluation, so that two evaluations differ by the weights alone), is measured before the first
step and every ``eval_every`` steps. An evaluation improves when it is below the best one so far by more
than ``tolerance`` of it (relative); after ``patience`` evaluations in a row without an improvement the
training stops, and the weights of the lowest validation loss seen are put back. ``steps`` caps the
training (the learning rate's cosine decay runs over the cap); a run that reaches it keeps its best weights
too. ``eval_every = 0`` trains exactly ``steps`` steps and keeps the last weights.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Callable, Mapping, Sequence

import numpy as np
import torch

from mdc.eval.caption_data import Images, check_captioner, check_items
from mdc.base.optim import fit
from mdc.base.options import with_options
from mdc.tokenizer import TextStats, trim_padding


@dataclass(frozen=True)
class FinetuneOptions:
    """How :func:`finetune` trains (one default each; ``steps`` has none)."""

    steps: int  # optimizer steps (required); with eval_every, the most it may take
    batch_size: int = 32  # image-caption pairs per step
    lr: float = 1e-5  # peak learning rate (AdamW)
    weight_decay: float = 0.01  # AdamW decay of weight matrices
    warmup_steps: int | None = None  # linear warm-up steps; None: 5% of the steps
    grad_clip_norm: float | None = 1.0  # gradient-norm clip; None: off
    seed: int = 0  # image order, reference picks and MDC masks
    device: str = "cpu"  # where the model trains (and is left)
    cache_limit: int = 4096  # decode the images once when the set holds at most this many, else per batch
    eval_every: int = 0  # validation loss every this many steps (the stopping rule); 0: exactly `steps` steps
    patience: int = 3  # stop after this many evaluations in a row without an improvement
    tolerance: float = 0.005  # an improvement: below the best validation loss by more than this fraction of it
    t_interval: tuple[float, float] | None = None  # MDC: train and validate at t ~ U[w_l, w_u]; None: as pretrained


@dataclass
class StopRule:
    """The stopping rule (module docstring): ``check(model, step)`` after each step says whether to stop;
    ``restore(model)`` puts the best weights back. ``history``: [(step, validation loss)]."""

    evaluate: Callable[[], float]  # validation loss of the model's current weights
    every: int
    patience: int
    tolerance: float
    history: list = field(default_factory=list)
    best: float = math.inf  # the last improvement's loss (what the next one must beat)
    lowest: float = math.inf  # the lowest loss seen, whose weights are kept
    best_step: int = 0
    waited: int = 0  # evaluations since the last improvement
    state: dict | None = None

    def check(self, model, step: int, last: bool = False) -> bool:
        if step % self.every and not last:
            return False
        loss = self.evaluate()
        self.history.append((step, loss))
        if loss < self.lowest:
            self.lowest, self.best_step = loss, step
            self.state = {k: v.detach().to("cpu", copy=True) for k, v in model.state_dict().items()}
        if loss < self.best * (1 - self.tolerance):
            self.best, self.waited = loss, 0
        else:
            self.waited += 1
        return self.waited >= self.patience

    def restore(self, model) -> None:
        if self.state is not None:
            model.load_state_dict(self.state)


@torch.no_grad()
def validation_loss(model, items: Sequence[Mapping], batch_size: int = 32, seed: int = 0, device: str = "cpu") -> float:
    """The mean of ``model.loss`` over every (image, reference) pair of ``items``, in eval mode; MDC's masks
    and times come from a generator seeded with ``seed`` (the same draws at every call). The model's
    training mode is restored."""
    was_training = model.training
    model.eval()
    images = Images(items, model.config.image_size, len(items))
    pairs = [(i, ref) for i, it in enumerate(items) for ref in it["references"]]  # P pairs
    kw = {"generator": torch.Generator(device=device).manual_seed(seed)} if model.config.objective == "mdc" else {}
    total = 0.0
    for a in range(0, len(pairs), batch_size):
        chunk = pairs[a : a + batch_size]
        x = torch.stack([images[i] for i, _ in chunk]).to(device)  # [b, 3, H, W]
        tokens = trim_padding(model.tokenizer([ref for _, ref in chunk]), model.tokenizer.eot_id).to(device)  # [b, L]
        total += model.loss(x, tokens, **kw).item() * len(chunk)
    model.train(was_training)
    return total / len(pairs)


def finetune(model, items: Sequence[Mapping], options: FinetuneOptions | None = None,
             val_items: Sequence[Mapping] = (), **kw):
    """Fine-tune a captioner with its own ``model.loss`` on ``items`` (image + references), as
    ``options`` say (a :class:`FinetuneOptions`, or its fields as keywords: ``steps=200, lr=1e-4``);
    with ``eval_every``, until its loss on ``val_items`` stops improving (the module's stopping rule).

    Each draw pairs an image with one reference picked uniformly; images are visited in seeded
    random epochs and get the model's eval transform. :func:`mdc.base.optim.fit`: AdamW (the pretraining
    parameter groups), linear warm-up then cosine decay to 0 at ``steps``. Returns ``(model, log)`` with
    ``log = {"loss": [per step], "text": TextStats counts}`` and, with the rule, ``"val"`` ([step, loss] per
    evaluation), ``"best_step"`` (whose weights the model holds) and ``"stopped"`` ("plateau" | "cap");
    the model is left in eval mode on ``device``.
    """
    o = with_options(FinetuneOptions, options, kw, "finetune")
    objective = check_captioner(model)
    if o.t_interval is not None:
        if objective != "mdc":
            raise ValueError(f"t_interval sets MDC's masking ratio; a {objective!r} captioner has none")
        model.config = replace(model.config, t_interval=tuple(o.t_interval))  # validated by ModelConfig
    check_items(items)
    if o.steps < 1 or o.batch_size < 1:
        raise ValueError(f"steps and batch_size must be >= 1; got {o.steps}, {o.batch_size}")
    if o.eval_every < 0 or o.patience < 1 or not 0 <= o.tolerance < 1:
        raise ValueError(f"eval_every >= 0, patience >= 1 and 0 <= tolerance < 1; got {o.eval_every}, {o.patience}, "
                         f"{o.tolerance}")
    if o.eval_every:
        if not val_items:
            raise ValueError("eval_every needs val_items: the stopping rule reads the validation loss")
        check_items(val_items)
    model.to(o.device)
    text = TextStats()
    rule = StopRule(lambda: validation_loss(model, val_items, o.batch_size, o.seed, o.device),
                    o.eval_every, o.patience, o.tolerance) if o.eval_every else None
    stop = None
    if rule:
        rule.check(model, 0)  # the pretrained weights: the first loss to beat
        stop = lambda step: rule.check(model, step, last=step == o.steps)  # noqa: E731
    masks = {"generator": torch.Generator(device=o.device).manual_seed(o.seed)} if objective == "mdc" else {}
    losses = fit(model, _draws(model, items, o, text), o.steps, o.lr, weight_decay=o.weight_decay,
                 warmup_steps=o.warmup_steps, grad_clip_norm=o.grad_clip_norm,
                 loss_fn=lambda *batch: model.loss(*batch, **masks), stop=stop)
    log = {"loss": losses, "text": text.as_dict()}
    if rule:
        rule.restore(model)
        log |= {"val": [list(h) for h in rule.history], "best_step": rule.best_step,
                "stopped": "plateau" if rule.waited >= rule.patience else "cap"}
    return model.eval(), log


def _draws(model, items: Sequence[Mapping], o: FinetuneOptions, text: TextStats):
    """``next_batch()`` of :func:`finetune`: ``batch_size`` images in seeded random epochs, each with one
    reference picked uniformly, tokenized (counted in ``text``); ([B, 3, H, W], [B, L]) on ``device``."""
    images = Images(items, model.config.image_size, o.cache_limit)
    rng = np.random.default_rng(o.seed)
    order: list[int] = []  # what is left of the current random epoch

    def next_batch() -> tuple[torch.Tensor, torch.Tensor]:
        batch = []
        while len(batch) < o.batch_size:
            if not order:
                order.extend(rng.permutation(len(items)).tolist())
            batch.append(order.pop())
        captions = [items[i]["references"][rng.integers(len(items[i]["references"]))] for i in batch]
        tokens, stats = model.tokenizer.tokenize(captions)
        text.merge(stats)
        tokens = trim_padding(tokens, model.tokenizer.eot_id)  # on the host: the loss reads no length off the device
        return torch.stack([images[i] for i in batch]).to(o.device), tokens.to(o.device)

    return next_batch
