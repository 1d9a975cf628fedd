"""What every benchmark shares: interleaved timing, result rows, peers built from configs, batches."""
from __future__ import annotations

import hashlib
import json
import statistics
import time
from dataclasses import asdict, dataclass, field
from typing import Callable

import torch

import mdc
from mdc.tokenizer import trim_padding
from mdc.world.scenes import scene_captions

from benchmarks.peers import build_coca


@dataclass
class Row:
    """One figure: ``value`` in ``unit``; ``target`` (e.g. ">= 0.95") and whether it is ``met``."""

    name: str
    value: float | str | None
    unit: str = ""
    note: str = ""
    target: str = ""
    met: bool | None = None


@dataclass
class Section:
    name: str
    title: str
    rows: list[Row] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    seconds: float = 0.0

    def add(self, name: str, value, unit: str = "", note: str = "", at_least: float | None = None) -> Row:
        """Add a row; ``at_least``: the target the value should reach (reported, never asserted)."""
        row = Row(name, value, unit, note)
        if at_least is not None:
            row.target = f">= {at_least:g}"
            row.met = isinstance(value, (int, float)) and value >= at_least
        self.rows.append(row)
        return row

    def as_dict(self) -> dict:
        return {"title": self.title, "seconds": round(self.seconds, 1), "notes": self.notes,
                "rows": [asdict(r) for r in self.rows]}


@dataclass
class Context:
    """The run's settings, handed to every section."""

    quick: bool = False
    checkpoint: str | None = None
    device: torch.device = torch.device("cpu")
    cache: dict = field(default_factory=dict)

    def pick(self, full, quick):
        return quick if self.quick else full


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def interleaved(fns: dict[str, Callable], rounds: int, warmup: int = 1,
                device: torch.device = torch.device("cpu")) -> dict[str, list[float]]:
    """Seconds per call of each function, over ``rounds`` rounds that call them in turn (A B C, A B C, ...),
    so that a change of machine load touches every contestant alike; ``warmup`` untimed rounds first."""
    for _ in range(warmup):
        for fn in fns.values():
            fn()
    times = {name: [] for name in fns}
    for _ in range(rounds):
        for name, fn in fns.items():
            sync(device)
            start = time.perf_counter()
            fn()
            sync(device)
            times[name].append(time.perf_counter() - start)
    return times


def median(values: list[float]) -> float:
    return statistics.median(values)


def speedup(times: dict[str, list[float]], fast: str, slow: str) -> float:
    """How many times faster ``fast`` is than ``slow``: the median over rounds of the paired time ratio."""
    return statistics.median(s / f for f, s in zip(times[fast], times[slow]))


def batch(model, n: int, device=torch.device("cpu"), seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Random images [n, 3, S, S] and the tokens [n, L] of n synthetic alt-text captions, cut to the longest on
    the host as the training stream cuts them (:func:`mdc.tokenizer.trim_padding`)."""
    g = torch.Generator().manual_seed(seed)
    size = model.config.image_size
    images = torch.randn(n, 3, size, size, generator=g)
    tokens = trim_padding(model.tokenizer(scene_captions(n, seed=seed)), model.tokenizer.eot_id)
    return images.to(device), tokens.to(device)


def open_clip_module():
    """open_clip, importable on CPU torch too (see :mod:`mdc.base.torchvision_shim`)."""
    from mdc.base.torchvision_shim import patch_torchvision

    patch_torchvision()
    import open_clip

    return open_clip


def coca_config(model) -> tuple[dict, str]:
    """open_clip's CoCa config dict nearest to captioner ``model``, and a name for it.

    The same ViT (size, patch, width, depth, heads), a multimodal decoder of the captioner's
    decoder width, depth and heads, and a unimodal text tower of that size too (open_clip's CoCa
    split, as in its ``coca_ViT-B-32``: which ``vit-b-32`` reproduces but for the vocabulary,
    here the captioner's).
    """
    c, tok = model.config, model.tokenizer
    text = dict(context_length=c.context_length - 1, vocab_size=tok.vocab_size, width=c.text_width,
                heads=c.text_heads, layers=c.text_layers)
    cfg = dict(embed_dim=c.embed_dim, custom_text=True,
               vision_cfg=dict(image_size=c.image_size, patch_size=c.patch_size, width=c.vision_width,
                               layers=c.vision_layers, head_width=c.vision_width // c.vision_heads,
                               mlp_ratio=c.mlp_ratio, attentional_pool=True, attn_pooler_heads=c.text_heads,
                               output_tokens=True),
               text_cfg=dict(text, embed_cls=True, output_tokens=True, pad_id=tok.pad_id),
               multimodal_cfg=dict(text, attn_pooler_heads=c.text_heads))
    return cfg, "mdc-bench-coca-" + hashlib.sha1(json.dumps(cfg, sort_keys=True).encode()).hexdigest()[:10]


def coca_like(model) -> torch.nn.Module:
    """open_clip's CoCa at :func:`coca_config` of captioner ``model``, random weights (no download)."""
    return build_coca(open_clip_module(), *coca_config(model))


def count_calls(module: torch.nn.Module) -> list[int]:
    """A one-element counter of ``module``'s forward calls (a forward hook; remove with the model)."""
    counter = [0]
    module.register_forward_hook(lambda *_: counter.__setitem__(0, counter[0] + 1))
    return counter


def small(name: str, quick: bool) -> dict:
    """Model overrides: none, or depth 1 for the larger models in a quick (smoke) run."""
    return dict(vision_layers=1, text_layers=1) if quick and name != "tiny" else {}
