"""Captions of a captioning set's test images by each decoding Table 3 compares."""
from __future__ import annotations

from typing import Mapping, Sequence

import torch

from mdc.api import generate
from mdc.data.formats import load_image
from mdc.data.transforms import image_transform
from mdc.eval.caption_data import check_captioner, check_items


@torch.no_grad()
def generate_captions(model, items: Sequence[Mapping], *, lengths: Sequence[int] = (10, 15, 20),
                      beam_size: int = 6, arc_max_length: int | None = None, batch_size: int = 32,
                      device: str = "cpu") -> dict[str, dict]:
    """``{name: {image_id: caption}}``: MDC greedy at each length (``mdc-10``, ...), ARC beam
    search (``arc-beam6``; at most ``arc_max_length`` tokens, default the context minus SOT/EOT)."""
    objective = check_captioner(model)
    check_items(items)
    if objective == "mdc":
        for n in lengths:
            model.check_length(n)
        runs = {f"mdc-{n}": dict(length=n) for n in lengths}
    else:
        max_length = arc_max_length or model.config.context_length - 2
        model.check_length(max_length)
        runs = {f"arc-beam{beam_size}": dict(length=max_length, beam_size=beam_size)}
    model.to(device).eval()
    transform = image_transform(model.config.image_size, train=False)
    out: dict[str, dict] = {name: {} for name in runs}
    for start in range(0, len(items), batch_size):
        batch = items[start : start + batch_size]
        images = torch.stack([transform(load_image(it)) for it in batch]).to(device)
        for name, kw in runs.items():
            for it, caption in zip(batch, generate(model, images, **kw)):
                out[name][it["image_id"]] = caption
    return out
