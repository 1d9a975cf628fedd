"""Captioning data and captioners: the items of a captioning file (:data:`FORMATS`), a captioner loaded
from a checkpoint and checked to be the objective asked for, and the checks every captioning step shares.
"""
from __future__ import annotations

import json
import os
from typing import Mapping, Sequence

import torch

from mdc.data.formats import Items, load_coco_captions, load_image, load_karpathy, load_karpathy_test
from mdc.data.transforms import image_transform
from mdc.factory import checkpoint_folder, load

FORMATS = ("karpathy", "coco", "karpathy_test")


def load_caption_items(captions_json: str, captions_format: str, image_root: str,
                       split: str | Sequence[str] = "test", on_missing: str = "error") -> Items:
    """``[{image_id, image_path, references}]`` of a captioning file in one of :data:`FORMATS`.

    ``split`` applies to the Karpathy split file only: the other two hold one split each.
    """
    if captions_format not in FORMATS:
        raise ValueError(f"captions_format must be one of {FORMATS}; got {captions_format!r}")
    if not os.path.isdir(image_root):
        raise ValueError(f"image_root {image_root!r}: folder not found (images of {captions_json})")
    if captions_format == "karpathy":
        return load_karpathy(captions_json, image_root, split, on_missing)
    if captions_format == "coco":
        return load_coco_captions(captions_json, image_root, on_missing)
    return load_karpathy_test(captions_json, image_root, on_missing)


def limit(items: Items, n: int | None) -> Items:
    """The first ``n`` items (all if ``n`` is None), keeping the file's ``total`` and ``missing``."""
    return items if n is None else Items(items[:n], items.source, items.total, items.missing)


def resolve_checkpoint(path: str, objective: str, parameter: str = "checkpoint") -> str:
    """The checkpoint folder ``path`` (or a pretraining run folder's latest checkpoint), checked
    from its config to hold an ``objective`` ("mdc" | "arc") captioner; errors name ``parameter``."""
    if not os.path.isdir(path):
        raise ValueError(f"{parameter} = {path!r}: folder not found")
    try:
        path = checkpoint_folder(path)
    except FileNotFoundError as exn:
        raise ValueError(f"{parameter} = {path!r}: not a checkpoint folder ({exn})") from exn
    try:
        with open(os.path.join(path, "config.json")) as f:
            got = json.load(f).get("objective")
    except (OSError, ValueError, AttributeError) as exn:
        raise ValueError(f"{parameter} = {path!r}: unreadable config.json ({exn})") from exn
    if got == "clip":
        raise ValueError(f"{parameter} = {path!r} holds a CLIP model, which cannot caption; "
                         f"give a checkpoint pretrained with objective {objective!r}")
    if got != objective:
        raise ValueError(f"{parameter} = {path!r} holds an {got!r} captioner, expected {objective!r} "
                         f"(are mdc_checkpoint and arc_checkpoint swapped?)")
    return path


def load_captioner(path: str, objective: str, parameter: str = "checkpoint"):
    """``mdc.load`` a checkpoint checked by :func:`resolve_checkpoint`; errors name ``parameter``."""
    path = resolve_checkpoint(path, objective, parameter)
    try:
        return load(path)
    except (FileNotFoundError, ValueError) as exn:
        raise ValueError(f"{parameter} = {path!r}: {exn}") from exn


def check_captioner(model) -> str:
    objective = model.config.objective
    if objective not in ("mdc", "arc"):
        raise ValueError(f"captioning needs an 'mdc' or 'arc' model; got objective {objective!r}")
    return objective


def check_items(items: Sequence[Mapping]) -> None:
    if not items:
        raise ValueError("no captioning items (an empty split, or every image missing?)")
    seen = set()
    for it in items:
        if it["image_id"] in seen:
            raise ValueError(f"image_id {it['image_id']!r} repeats in the captioning items; ids key the captions")
        seen.add(it["image_id"])
        if not it.get("references"):
            raise ValueError(f"image {it['image_id']!r} has no reference captions")


def token_length(tokenizer, text: str, most: int) -> int:
    """Caption tokens of ``text`` in ``tokenizer`` (no SOT/EOT), within [1, ``most``]."""
    return min(most, max(1, len(tokenizer.encode(text))))


def reference_lengths(items: Sequence[Mapping], tokenizer, most: int) -> dict:
    """``{image_id: the median token length of its references}`` (the lower median of an even count),
    within [1, ``most``]: the length a captioner is asked for when it is matched to the references."""
    out = {}
    for it in items:
        lengths = sorted(token_length(tokenizer, r, most) for r in it["references"])
        out[it["image_id"]] = lengths[(len(lengths) - 1) // 2]
    return out


class Images:
    """``images[i]``: the eval-transformed image of ``items[i]`` [3, H, W], decoded once when there are at most
    ``limit`` items (else at every access)."""

    def __init__(self, items: Sequence[Mapping], image_size: int, limit: int):
        self.items, self.transform = items, image_transform(image_size, train=False)
        self.cache: dict[int, torch.Tensor] | None = {} if len(items) <= limit else None

    def __getitem__(self, i: int) -> torch.Tensor:
        if self.cache is None:
            return self.transform(load_image(self.items[i]))
        if i not in self.cache:
            self.cache[i] = self.transform(load_image(self.items[i]))
        return self.cache[i]
