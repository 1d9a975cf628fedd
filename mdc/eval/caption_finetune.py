"""Fine-tuning a pretrained captioner on a captioning set's train split with its own loss (Table 3)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping, Sequence

import numpy as np
import torch

from mdc.data.formats import load_image
from mdc.data.transforms import image_transform
from mdc.eval.caption_data import check_captioner, check_items
from mdc.optim import fit
from mdc.options import with_options
from mdc.tokenizer import TextStats


@dataclass(frozen=True)
class FinetuneOptions:
    """How :func:`finetune` trains (one default each; ``steps`` has none)."""

    steps: int  # optimizer steps (required)
    batch_size: int = 32  # image-caption pairs per step
    lr: float = 1e-5  # peak learning rate (AdamW)
    weight_decay: float = 0.01  # AdamW decay of weight matrices
    warmup_steps: int | None = None  # linear warm-up steps; None: 5% of the steps
    grad_clip_norm: float | None = 1.0  # gradient-norm clip; None: off
    seed: int = 0  # image order, reference picks and MDC masks
    device: str = "cpu"  # where the model trains (and is left)
    cache_limit: int = 4096  # decode the images once when the set holds at most this many, else per batch


def finetune(model, items: Sequence[Mapping], options: FinetuneOptions | None = None, **kw):
    """Fine-tune a captioner with its own ``model.loss`` on ``items`` (image + references), as
    ``options`` say (a :class:`FinetuneOptions`, or its fields as keywords: ``steps=200, lr=1e-4``).

    Each draw pairs an image with one reference picked uniformly; images are visited in seeded
    random epochs and get the model's eval transform. :func:`mdc.optim.fit`: AdamW (the pretraining
    parameter groups), linear warm-up then cosine decay to 0. Returns ``(model, log)`` with
    ``log = {"loss": [per step], "text": TextStats counts}``; the model is left in eval mode on ``device``.
    """
    o = with_options(FinetuneOptions, options, kw, "finetune")
    objective = check_captioner(model)
    check_items(items)
    if o.steps < 1 or o.batch_size < 1:
        raise ValueError(f"steps and batch_size must be >= 1; got {o.steps}, {o.batch_size}")
    device = o.device
    model.to(device)
    transform = image_transform(model.config.image_size, train=False)
    cache: dict[int, torch.Tensor] | None = {} if len(items) <= o.cache_limit else None
    rng = np.random.default_rng(o.seed)
    generator = torch.Generator(device=device).manual_seed(o.seed)  # MDC masking
    order: list[int] = []  # what is left of the current random epoch
    text = TextStats()

    def image(i: int) -> torch.Tensor:
        if cache is None:
            return transform(load_image(items[i]))
        if i not in cache:
            cache[i] = transform(load_image(items[i]))
        return cache[i]

    def next_batch() -> tuple[torch.Tensor, torch.Tensor]:
        batch = []
        while len(batch) < o.batch_size:
            if not order:
                order.extend(rng.permutation(len(items)).tolist())
            batch.append(order.pop())
        captions = [items[i]["references"][rng.integers(len(items[i]["references"]))] for i in batch]
        tokens, stats = model.tokenizer.tokenize(captions)
        text.merge(stats)
        return torch.stack([image(i) for i in batch]).to(device), tokens.to(device)

    losses = fit(model, next_batch, o.steps, o.lr, o.weight_decay, o.warmup_steps, o.grad_clip_norm,
                 loss_kwargs={"generator": generator} if objective == "mdc" else None)
    return model, {"loss": losses, "text": text.as_dict()}
