"""Captions of a captioning set's test images by each decoding Table 3 compares.

The paper's sets: MDC greedy at fixed lengths (``mdc-10``, ``mdc-15``, ``mdc-20``) and ARC beam search
(``arc-beam6``), whose lengths differ, so that a metric with a length term (BLEU's brevity penalty, CIDEr's
length penalty) compares lengths as much as captioners. Beside them, the sets at matched length, each given
per image (``per_image``: {tag: {image_id: caption tokens}}):

- ``mdc-<tag>``: MDC writing exactly that many tokens for the image (``mdc-arc``: as many as ARC wrote for
  it; ``mdc-ref``: its references' median length);
- ``arc-beam6-<tag>``: ARC's beam search with [EOT] held back until that many tokens (``arc-beam6-ref``);
- ``arc-greedy``: ARC's greedy decoding beside its beam search.
"""
from __future__ import annotations

from collections import defaultdict
from typing import Mapping, Sequence

import torch

from mdc.api import generate
from mdc.eval.caption_data import Images, check_captioner, check_items


def _runs(model, objective: str, lengths, beam_size: int, arc_max_length, greedy: bool, per_image) -> dict:
    """{set name: generate's keywords}; a per-image length is under ``per_image`` (keyed by image id)."""
    if objective == "mdc":
        for n in lengths:
            model.check_length(n)
        return {f"mdc-{n}": dict(length=n) for n in lengths} | {f"mdc-{tag}": dict(per_image=lens)
                                                                  for tag, lens in per_image.items()}
    max_length = arc_max_length or model.config.context_length - 2
    model.check_length(max_length)
    beam = dict(length=max_length, beam_size=beam_size)
    return ({"arc-greedy": dict(length=max_length, beam_size=1)} if greedy else {}) | {f"arc-beam{beam_size}": beam} \
        | {f"arc-beam{beam_size}-{tag}": dict(beam, min_lengths={i: min(n, max_length) for i, n in lens.items()})
           for tag, lens in per_image.items()}


def _batches(items: Sequence[Mapping], batch_size: int, lengths: Mapping | None = None):
    """``(length, batch of items)``: ``batch_size`` items at a time, grouped by their per-image length if
    ``lengths`` ({image_id: length}) is given (MDC writes one length per call), else length None."""
    groups: dict = defaultdict(list)
    for it in items:
        groups[None if lengths is None else lengths[it["image_id"]]].append(it)
    for n in sorted(groups, key=lambda n: -1 if n is None else n):
        for start in range(0, len(groups[n]), batch_size):
            yield n, groups[n][start : start + batch_size]


@torch.no_grad()
def generate_captions(model, items: Sequence[Mapping], *, lengths: Sequence[int] = (10, 15, 20),
                      beam_size: int = 6, arc_max_length: int | None = None, batch_size: int = 32,
                      device: str = "cpu", greedy: bool = False, per_image: Mapping[str, Mapping] | None = None,
                      cache_limit: int = 4096) -> dict[str, dict]:
    """``{name: {image_id: caption}}`` (names in the module docstring): MDC greedy at each length of ``lengths``
    and, per tag of ``per_image``, at the image's own length; ARC beam search with ``beam_size`` (at most
    ``arc_max_length`` tokens, default the context minus SOT/EOT), its greedy decoding if ``greedy``, and, per
    tag of ``per_image``, beam search with [EOT] held back until the image's length. The images are decoded
    once for every set when there are at most ``cache_limit`` of them."""
    objective = check_captioner(model)
    check_items(items)
    runs = _runs(model, objective, lengths, beam_size, arc_max_length, greedy, dict(per_image or {}))
    model.to(device).eval()
    images = Images(items, model.config.image_size, cache_limit)
    index = {it["image_id"]: i for i, it in enumerate(items)}
    out: dict[str, dict] = {name: {} for name in runs}
    for name, kw in runs.items():
        per = kw.pop("per_image", None)
        minimum = kw.pop("min_lengths", None)
        for n, batch in _batches(items, batch_size, per):
            x = torch.stack([images[index[it["image_id"]]] for it in batch]).to(device)  # [b, 3, H, W]
            if n is not None:
                kw["length"] = n
            if minimum is not None:
                kw["min_length"] = torch.tensor([minimum[it["image_id"]] for it in batch], device=device)
            for it, caption in zip(batch, generate(model, x, **kw)):
                out[name][it["image_id"]] = caption
    return out
