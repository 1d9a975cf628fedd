"""Linear probing of frozen image features (paper Table 1, Tables 4-5, Figs. 4-5; App. B).

Features are ``model.encode_image``: global average pooling of the encoder tokens for the
captioners, the [CLS] token for CLIP (pre-projection). They are extracted once per
(weights, dataset, split, transform) and cached on disk under a key made of a fingerprint
of the weights (sha256 of the state dict), so a random-initialised encoder and a trained
checkpoint never share a cache entry and a re-run reuses the features.

The classifier follows CLIP_benchmark's ``linear_probe`` protocol, which the paper uses:
L2-normalised features, one ``nn.Linear``, AdamW (lr 0.1, weight decay 0), batch 64 with
shuffling, 10 epochs, cosine decay from the first step (no warm-up), cross-entropy; top-1
on the test split. ``weight_decay="search"`` runs CLIP_benchmark's validation search instead:
hold out ``val_proportion`` of the training features, try weight decays on
``logspace(-6, 2, 97)`` (7 coarse points, then a bisection-like refinement around the peak
with spans 8, 4, 2, 1), retrain on train+val with the best one. It runs on CPU or GPU.

Every probe of a trained encoder comes with the same probe of the same architecture at its
random initialisation (:func:`random_init_like`): the floor every method must beat (on the
synthetic world colour and background are decodable from random features). Those features are
the same for every run with the same architecture, initialisation seed and evaluation set, so
:func:`probe_random_init` can share them between runs through one folder: each file is named by
:func:`feature_key`, a digest of everything that determines it, written atomically and verified
on read (a bad file is recomputed, with a warning).

Results of :func:`probe_datasets`::

    {"datasets": {name: {"top1": float, "top5": float | null, "mean_per_class_recall": float,
                         "weight_decay": float, "classes": int, "chance": float,
                         "n_train": int, "n_test": int,
                         "correct": str}},        # "0"/"1" per test item, in test order
                                                  # (intervals over the items: reproduce/claims/claim_rows.py)
     "average": float,                     # mean top-1 over the datasets
     "protocol": {batch_size, epochs, lr, weight_decay, val_proportion, normalize, seed}}

and the ``results`` part of a ``linear_probe`` results file is that dict for the trained
encoder plus ``"random_init"``: the same dict for the random-initialised one.
"""
from __future__ import annotations

import hashlib
import json
import logging
import math
import os
from dataclasses import asdict, dataclass
from typing import Callable, Iterable, Mapping

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from mdc.data.formats import build_probe_dataset
from mdc.factory import build

logger = logging.getLogger(__name__)

@dataclass
class ProbeConfig:
    batch_size: int = 64  # CLIP_benchmark default (paper App. B)
    epochs: int = 10
    lr: float = 0.1
    weight_decay: float | str = 0.0  # a value, or "search" (CLIP_benchmark's validation search)
    val_proportion: float = 0.2  # held out of the training features by the search
    normalize: bool = True  # L2-normalise features (CLIP_benchmark's default)
    seed: int = 0


# ----------------------------------------------------------------------------- features
def fingerprint(model: nn.Module) -> str:
    """sha256 (16 hex digits) of a model's state dict: which weights, wherever they came from."""
    h = hashlib.sha256()
    for name, tensor in sorted(model.state_dict().items()):
        h.update(name.encode())
        h.update(tensor.detach().cpu().contiguous().view(-1).view(torch.uint8).numpy().tobytes())
    return h.hexdigest()[:16]


@torch.no_grad()
def extract_features(model, dataset: Iterable, batch_size: int = 256, device="cpu",
                     features: Callable | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """(features [N, D] float32, labels [N] int64) of ``(image tensor, label)`` items, in order;
    ``features(model, images)`` -> [B, D] (default ``model.encode_image``, the pooled features)."""
    loader = torch.utils.data.DataLoader(dataset, batch_size=batch_size)
    model.eval()
    feats, labels = [], []
    for images, y in loader:
        images = images.to(device)
        feats.append((features(model, images) if features else model.encode_image(images)).float().cpu())
        labels.append(torch.as_tensor(y, dtype=torch.long))
    if not feats:
        raise ValueError("the dataset yielded no images")
    return torch.cat(feats), torch.cat(labels)


def _digest(feats: torch.Tensor, labels: torch.Tensor) -> str:
    return hashlib.sha256(feats.numpy().tobytes() + labels.numpy().tobytes()).hexdigest()


def _read(path: str, key: str) -> tuple[torch.Tensor, torch.Tensor] | None:
    """The cached (features, labels) at ``path`` if it holds ``key``'s features intact; None (with a
    one-line warning) for a file that is unreadable, of another key, or whose digest does not match."""
    from safetensors import safe_open

    try:
        with safe_open(path, "pt") as f:
            meta, feats, labels = f.metadata() or {}, f.get_tensor("features"), f.get_tensor("labels")
        why = ("holds another key" if meta.get("key") != key else
               "bad shapes" if feats.ndim != 2 or labels.shape != (len(feats),) else
               "digest mismatch" if meta.get("sha256") != _digest(feats, labels) else None)
    except Exception as exn:  # truncated, not safetensors, missing tensors
        why = f"unreadable ({type(exn).__name__})"
    if why:
        logger.warning("feature cache %s: %s; recomputing", path, why)
        return None
    return feats, labels


def _write(path: str, key: str, feats: torch.Tensor, labels: torch.Tensor) -> None:
    """Write atomically (temp file + os.replace): a reader never sees a half-written file."""
    from safetensors.torch import save_file

    os.makedirs(os.path.dirname(path), exist_ok=True)
    tmp = f"{path}.tmp-{os.getpid()}"
    feats = feats.contiguous()
    save_file({"features": feats, "labels": labels}, tmp, metadata={"key": key, "sha256": _digest(feats, labels)})
    os.replace(tmp, path)


def cached_features(model, dataset_fn: Callable[[], Iterable], key: str, cache_dir: str | None,
                    batch_size: int = 256, device="cpu", features: Callable | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`extract_features` of ``dataset_fn()``, stored as ``cache_dir/<fingerprint>/<key>.safetensors``.

    ``key`` names the dataset, split and transform (e.g. ``"wds-object__train__eval64"``), or is a
    :func:`feature_key`; it must also name ``features`` where they are not the pooled ones. Files are
    written atomically and verified on read.
    """
    path = os.path.join(cache_dir, fingerprint(model), f"{key}.safetensors") if cache_dir else None
    cached = _read(path, key) if path and os.path.isfile(path) else None
    if cached is not None:
        return cached
    feats, labels = extract_features(model, dataset_fn(), batch_size, device, features)
    if path:
        _write(path, key, feats, labels)
    return feats, labels


_CONTENT_BYTES = 1 << 30  # evaluation sets up to this size are hashed by content; larger ones by name, size, mtime
_CONTENT_IDS: dict[tuple, str] = {}


def content_id(root: str) -> str:
    """sha256 of the files under ``root`` (relative names, sizes and contents; for sets over 1 GiB,
    names, sizes and modification times instead of contents): which evaluation set, not where."""
    files = sorted(os.path.join(d, f) for d, _, names in os.walk(root) for f in names)
    listing = tuple((os.path.relpath(f, root), os.stat(f).st_size, os.stat(f).st_mtime_ns) for f in files)
    memo = (os.path.abspath(root), listing)
    if memo not in _CONTENT_IDS:
        by_content = sum(size for _, size, _ in listing) <= _CONTENT_BYTES
        h = hashlib.sha256()
        for f, (name, size, mtime) in zip(files, listing):
            h.update(f"{name}\0{size}\0".encode())
            if by_content:
                with open(f, "rb") as fh:
                    for block in iter(lambda: fh.read(1 << 20), b""):
                        h.update(block)
            else:
                h.update(str(mtime).encode())
        _CONTENT_IDS[memo] = h.hexdigest()
    return _CONTENT_IDS[memo]


def transform_id(transform) -> str:
    """A description of an image transform: its class and settings (random state left out)."""
    state = {k: (v.tolist() if torch.is_tensor(v) else v) for k, v in vars(transform).items()
             if not isinstance(v, np.random.Generator)} if hasattr(transform, "__dict__") else repr(transform)
    name = f"{type(transform).__module__}.{type(transform).__qualname__}"
    return f"{name}:{json.dumps(state, sort_keys=True, default=repr)}"


def feature_key(model, name: str, root: str, split: str, transform, batch_size: int, device, init_seed=None) -> str:
    """sha256 (32 hex digits) of what determines ``model``'s features of a dataset split: its config
    and weights (:func:`fingerprint`; ``init_seed`` recorded too), the dataset (name, split,
    :func:`content_id`), the transform (:func:`transform_id`), the extraction batch size, the device
    type and the torch version (both can change the last bits)."""
    payload = dict(config=asdict(model.config), weights=fingerprint(model), init_seed=init_seed, dataset=name,
                   split=split, content=content_id(root), transform=transform_id(transform), batch_size=batch_size,
                   device=torch.device(device).type, torch=torch.__version__)
    return hashlib.sha256(json.dumps(payload, sort_keys=True, default=repr).encode()).hexdigest()[:32]


# ----------------------------------------------------------------------------- classifier
def _cosine(step: int, total: int, base: float) -> float:
    return 0.5 * (1 + math.cos(math.pi * step / total)) * base


def train_linear(x: torch.Tensor, y: torch.Tensor, num_classes: int, cfg: ProbeConfig, weight_decay: float,
                 device="cpu") -> nn.Linear:
    """CLIP_benchmark's probe training: AdamW, cosine LR per step, shuffled batches (seeded)."""
    torch.manual_seed(cfg.seed)
    layer = nn.Linear(x.shape[1], num_classes).to(device)
    opt = torch.optim.AdamW(layer.parameters(), lr=cfg.lr, weight_decay=weight_decay)
    g = torch.Generator().manual_seed(cfg.seed)
    batches = math.ceil(len(x) / cfg.batch_size)
    total = cfg.epochs * batches
    for epoch in range(cfg.epochs):
        order = torch.randperm(len(x), generator=g)
        for i in range(batches):
            for group in opt.param_groups:
                group["lr"] = _cosine(epoch * batches + i, total, cfg.lr)
            idx = order[i * cfg.batch_size : (i + 1) * cfg.batch_size]
            loss = F.cross_entropy(layer(x[idx].to(device)), y[idx].to(device))
            opt.zero_grad()
            loss.backward()
            opt.step()
    return layer


@torch.no_grad()
def _accuracy(layer: nn.Linear, x: torch.Tensor, y: torch.Tensor, device="cpu") -> dict:
    logits = layer(x.to(device)).cpu()  # [N, C]
    pred = logits.argmax(1)
    top5 = None
    if logits.shape[1] >= 5:
        top5 = float((logits.topk(5, 1).indices == y[:, None]).any(1).float().mean())
    recalls = [float((pred[y == c] == c).float().mean()) for c in y.unique()]
    return {"top1": float((pred == y).float().mean()), "top5": top5, "mean_per_class_recall": float(np.mean(recalls)),
            "correct": "".join("1" if right else "0" for right in (pred == y).tolist())}  # per item, in order


def _search_weight_decay(x, y, num_classes, cfg: ProbeConfig, device) -> float:
    """CLIP_benchmark's search: coarse grid of 7 on logspace(-6, 2, 97), then refine around the peak."""
    g = torch.Generator().manual_seed(cfg.seed)
    perm = torch.randperm(len(x), generator=g)
    n_val = max(1, int(round(cfg.val_proportion * len(x))))
    tr, va = perm[n_val:], perm[:n_val]
    grid = np.logspace(-6, 2, num=97).tolist()
    scores: dict[int, float] = {}

    def peak(indices: list[int]) -> int:
        best, best_acc = indices[0], -1.0
        for i in indices:
            if i not in scores:
                layer = train_linear(x[tr], y[tr], num_classes, cfg, grid[i], device)
                scores[i] = _accuracy(layer, x[va], y[va], device)["top1"]
            if scores[i] > best_acc:
                best, best_acc = i, scores[i]
        return best

    best = peak(list(range(0, 97, 16)))  # the 7 points of logspace(-6, 2, 7)
    span = 8
    while span > 0:
        best = peak([max(best - span, 0), best, min(best + span, len(grid) - 1)])
        span //= 2
    return grid[best]


def linear_probe(train: tuple[torch.Tensor, torch.Tensor], test: tuple[torch.Tensor, torch.Tensor],
                 cfg: ProbeConfig = ProbeConfig(), device="cpu") -> dict:
    """Fit the probe on ``train`` features/labels and report top-1 (and more) on ``test``."""
    (x, y), (xt, yt) = train, test
    if cfg.normalize:
        x, xt = F.normalize(x, dim=-1), F.normalize(xt, dim=-1)
    num_classes = int(max(y.max(), yt.max())) + 1
    wd = _search_weight_decay(x, y, num_classes, cfg, device) if cfg.weight_decay == "search" else float(cfg.weight_decay)
    layer = train_linear(x, y, num_classes, cfg, wd, device)
    return {**_accuracy(layer, xt, yt, device), "weight_decay": wd, "classes": num_classes,
            "chance": 1.0 / num_classes, "n_train": len(x), "n_test": len(xt)}


# ----------------------------------------------------------------------------- datasets
SYNTHETIC_TASKS = ("object", "shape", "texture", "count", "relation", "shape_texture", "colour", "background")


def synthetic_roots(evalsets_dir: str, tasks=SYNTHETIC_TASKS) -> dict[str, str]:
    """``{"wds/<task>": folder}`` of the synthetic probe tasks written by ``mdc.world.evalsets``."""
    roots = {f"wds/{t}": os.path.join(evalsets_dir, "probe", t) for t in tasks}
    missing = [r for r in roots.values() if not os.path.isdir(r)]
    if missing:
        raise ValueError(f"synthetic probe task folder not found: {missing[0]} "
                         f"(write them with python -m mdc.world.evalsets --out {evalsets_dir})")
    return roots


def random_init_like(model, seed: int = 0):
    """The same architecture (config) as ``model`` at a seeded random initialisation."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return build(model.config)


def dataset_fns(roots: Mapping[str, str], transform) -> dict[str, tuple[Callable, Callable]]:
    """``{name: (train_fn, test_fn)}`` for :func:`probe_datasets` from ``{name: root}``: CLIP_benchmark
    names (imagenet1k, food101, cifar10, cifar100, pets) or ``wds/<name>`` folders (the synthetic
    probe tasks are ``wds/<task>`` at ``<evalsets>/probe/<task>``)."""
    def fns(name, root):
        return (lambda: build_probe_dataset(name, root, "train", transform),
                lambda: build_probe_dataset(name, root, "test", transform))

    return {name: fns(name, root) for name, root in roots.items()}


def probe_datasets(model, datasets: Mapping[str, tuple[Callable[[], Iterable], Callable[[], Iterable]]],
                   cfg: ProbeConfig = ProbeConfig(), cache_dir: str | None = None, transform_key: str = "",
                   batch_size: int = 256, device="cpu", keys: Mapping[str, tuple[str, str]] | None = None) -> dict:
    """Probe ``model`` on every dataset: ``{name: (train_dataset_fn, test_dataset_fn)}``.

    Each function returns an iterable of ``(image tensor, label)``. Features are cached under
    ``cache_dir`` by name, split and ``transform_key``, or by ``keys[name]`` = (train key, test key)
    if given. Returns the documented ``results`` dict (per-dataset numbers and the average top-1).
    """
    out = {}
    for name, (train_fn, test_fn) in datasets.items():
        key = name.replace("/", "-")
        default = (f"{key}__train__{transform_key}", f"{key}__test__{transform_key}")
        train_key, test_key = keys[name] if keys else default
        train = cached_features(model, train_fn, train_key, cache_dir, batch_size, device)
        test = cached_features(model, test_fn, test_key, cache_dir, batch_size, device)
        out[name] = linear_probe(train, test, cfg, device)
    return {"datasets": out, "average": float(np.mean([r["top1"] for r in out.values()])) if out else None,
            "protocol": asdict(cfg)}


def probe_random_init(model, roots: Mapping[str, str], transform, cfg: ProbeConfig = ProbeConfig(), *, seed: int = 0,
                      shared_cache: str = "", cache_dir: str | None = None, transform_key: str = "",
                      batch_size: int = 256, device="cpu") -> dict:
    """:func:`probe_datasets` of ``model``'s architecture at its random initialisation ``seed``
    (:func:`random_init_like`) on the datasets ``roots`` (as :func:`dataset_fns`). With ``shared_cache``
    (a folder shared by probe runs), its features live there under :func:`feature_key`, so runs with
    the same architecture, seed, evaluation set and transform extract them once; else in ``cache_dir``."""
    floor = random_init_like(model, seed).to(device)
    datasets = dataset_fns(roots, transform)
    if not shared_cache:
        return probe_datasets(floor, datasets, cfg, cache_dir, transform_key, batch_size, device)
    keys = {name: tuple(feature_key(floor, name, root, split, transform, batch_size, device, seed)
                        for split in ("train", "test")) for name, root in roots.items()}
    return probe_datasets(floor, datasets, cfg, shared_cache, batch_size=batch_size, device=device, keys=keys)
