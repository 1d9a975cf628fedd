"""A linear probe that sees position: the encoder's token grid, pooled to a few cells, beside the pooled probe.

The pooled probe (:mod:`mdc.eval.probe`) reads ``model.encode_image``: the mean of the encoder tokens (GAP,
the captioners) or the [CLS] token (CLIP). A mean discards where things are, so a task such as
``relation`` (where the large object is relative to the small one) cannot be read from it even where the
tokens hold it. This probe reads the same tokens, ``model.forward_features`` [B, T, D]: the patch tokens
(a leading [CLS] token dropped) laid out on their side x side grid, averaged over ``grid`` x ``grid``
cells, flattened in cell order, [B, grid^2 * D]; then exactly the pooled probe's classifier
(:func:`mdc.eval.probe.linear_probe`: L2-normalised features, one ``nn.Linear``, CLIP_benchmark's
recipe). The cells keep a coarse layout (at ``grid`` = 4, a quadrant of a quadrant) and the feature stays
4,096-dimensional or less at the encoder widths of ``mini`` and ``tiny`` (128, 256).

Both probes read one forward pass (:class:`PooledAndGrid`: the pooled features, exactly
``model.encode_image``'s, and the grid's side by side), so the grid probe adds a classifier per task and
no extraction. The features are cached as the pooled probe's are (:func:`mdc.eval.probe.cached_features`),
under keys that name the grid; the random-initialised floor's go to the shared cache under
:func:`mdc.eval.probe.feature_key` of a name that holds the grid.

:func:`probe_with_grid` returns ``{"pooled": ..., "grid": ...}``, each :func:`mdc.eval.probe.probe_datasets`'s
dict (the grid's with ``"grid"``); the linear-probe notebook writes the pooled one as its results, as before,
and the grid's as ``results["grid"]``, with the floor's as ``results["grid"]["random_init"]``.
"""
from __future__ import annotations

import math
from dataclasses import asdict
from typing import Callable, Iterable, Mapping

import numpy as np
import torch
import torch.nn.functional as F

from mdc.eval.probe import ProbeConfig, cached_features, dataset_fns, feature_key, linear_probe, random_init_like

GRID = 4  # cells per side of the pooled token grid


def token_grid(tokens: torch.Tensor, grid: int = GRID) -> torch.Tensor:
    """[B, T, D] encoder tokens -> [B, grid * grid * D]: the patch tokens on their square grid (leading
    extra tokens, e.g. [CLS], dropped), averaged over ``grid`` x ``grid`` cells, flattened cell by cell."""
    b, t, d = tokens.shape
    side = math.isqrt(t)
    patches = tokens[:, t - side * side:]  # [B, side^2, D]: the last side^2 tokens are the patches
    if side < grid or side % grid:
        raise ValueError(f"a {side} x {side} token grid cannot be pooled to {grid} x {grid} cells")
    maps = patches.transpose(1, 2).reshape(b, d, side, side)  # [B, D, side, side], row-major like the patches
    cells = F.avg_pool2d(maps, side // grid)  # [B, D, grid, grid]
    return cells.flatten(2).transpose(1, 2).reshape(b, grid * grid * d)  # [B, grid^2 * D], cell-major


class PooledAndGrid:
    """One forward pass, both probes' features: ``features(model, images [B, 3, S, S])`` ->
    [B, D + grid^2 * D], the pooled features (``model.encode_image``'s, from the same tokens) then the grid's."""

    def __init__(self, grid: int = GRID):
        self.grid = grid

    def __call__(self, model, images: torch.Tensor) -> torch.Tensor:
        tokens = model.forward_features(images)  # [B, T, D]
        pooled = model.visual.forward_head(tokens, pre_logits=True)  # [B, D], as model.encode_image
        return torch.cat([pooled, token_grid(tokens, self.grid)], 1)


def probe_with_grid(model, datasets: Mapping[str, tuple[Callable[[], Iterable], Callable[[], Iterable]]],
                    cfg: ProbeConfig = ProbeConfig(), *, grid: int = GRID, cache_dir: str | None = None,
                    transform_key: str = "", keys: Mapping[str, tuple[str, str]] | None = None, **extract) -> dict:
    """``{"pooled": ..., "grid": ...}``: the pooled probe (the numbers of :func:`mdc.eval.probe.probe_datasets`)
    and the grid probe of ``model`` on every dataset (``{name: (train_fn, test_fn)}``), from one extraction per
    split, cached as one file; ``extract``: ``batch_size`` and ``device``."""
    features, device = PooledAndGrid(grid), extract.get("device", "cpu")
    out = {"pooled": {}, "grid": {}}
    for name, (train_fn, test_fn) in datasets.items():
        stem = f"{name.replace('/', '-')}__pooled+grid{grid}"
        default = (f"{stem}__train__{transform_key}", f"{stem}__test__{transform_key}")
        train_key, test_key = keys[name] if keys else default
        (x, y), (xt, yt) = (cached_features(model, fn, key, cache_dir, features=features, **extract)
                            for fn, key in ((train_fn, train_key), (test_fn, test_key)))
        d = x.shape[1] // (1 + grid * grid)  # [N, D + grid^2 D]: the pooled D columns first
        out["pooled"][name] = linear_probe((x[:, :d], y), (xt[:, :d], yt), cfg, device)
        out["grid"][name] = linear_probe((x[:, d:], y), (xt[:, d:], yt), cfg, device)
    return {kind: {"datasets": res, "average": float(np.mean([r["top1"] for r in res.values()])) if res else None,
                   "protocol": asdict(cfg), **({"grid": grid} if kind == "grid" else {})} for kind, res in out.items()}


def probe_with_grid_random_init(model, roots: Mapping[str, str], transform, cfg: ProbeConfig = ProbeConfig(), *,
                                seed: int = 0, shared_cache: str = "", grid: int = GRID, **kw) -> dict:
    """:func:`probe_with_grid` of ``model``'s architecture at its random initialisation ``seed``; with
    ``shared_cache`` its features are shared between runs as the pooled floor's are
    (:func:`mdc.eval.probe.probe_random_init`). ``kw``: ``cache_dir``, ``transform_key``, ``batch_size``, ``device``."""
    floor = random_init_like(model, seed).to(kw.get("device", "cpu"))
    datasets = dataset_fns(roots, transform)
    extract = {k: kw[k] for k in ("batch_size", "device") if k in kw}
    if not shared_cache:
        return probe_with_grid(floor, datasets, cfg, grid=grid, cache_dir=kw.get("cache_dir"),
                               transform_key=kw.get("transform_key", ""), **extract)
    keys = {name: tuple(feature_key(floor, f"{name}__pooled+grid{grid}", root, split, transform,
                                    extract.get("batch_size", 256), extract.get("device", "cpu"), seed)
                        for split in ("train", "test")) for name, root in roots.items()}
    return probe_with_grid(floor, datasets, cfg, grid=grid, cache_dir=shared_cache, keys=keys, **extract)
