"""Image captioning evaluation (paper Sec. 4.2, Table 3, Fig. 6).

Pretrained captioners are fine-tuned on a captioning set's train split (:func:`finetune`),
caption its test split (:func:`generate_captions`: MDC greedy at lengths 10/15/20, ARC beam 6),
and are scored with pycocoevalcap (:func:`caption_metrics`) and, optionally, an LLM judge that
picks the best of the four captions per image (:func:`mdc.eval.judge.llm_judge`).

Results (``results`` of the ``captioning`` results file, :mod:`mdc.eval.results`)::

    {
      "dataset": {"name": "coco" | "flickr30k",   # the Table 3 block these numbers fill
                  "captions_json", "format", "split",
                  "images_evaluated": int, "images_total": int, "images_missing": int},
      "metrics": {"mdc-10" | "mdc-15" | "mdc-20" | "arc-beam6": {
                  "bleu1", "bleu2", "bleu3", "bleu4", "meteor", "rouge_l", "cider", "spice"}},
                                                  # fractions, as pycocoevalcap returns them; null = not computed
      "judge": {"model", "endpoint", "models": [names compared], "images", "valid", "invalid",
                "failed", "counts": {name: int}, "selection_rate": {name: fraction of valid answers}} | null,
      "unavailable": {"spice" | "meteor" | ... | "judge" | "mdc" | "arc": "why it is missing"},
      "checkpoints": {"mdc" | "arc": {"path", "checkpoint_id", "finetuned": folder | null}},
      "finetune": {"mdc" | "arc": {"steps", "first_loss", "final_loss", "unknown_rate"}},
      "files": {"predictions", "table", "figure", "judge_answers"}   # beside the results file
    }

:func:`table3_rows` turns it into the paper's Table 3 rows ("ARC (beam 6)", "MDC-10", ...) and
columns (``coco_bleu4, coco_meteor, coco_cider, coco_spice, coco_rougeL, coco_llm_judge``) in
the paper's units (percent).
"""
from __future__ import annotations

import contextlib
import io
import logging
import os
import socket
from typing import Mapping, Sequence

import numpy as np
import torch

from mdc.data.formats import Items, load_coco_captions, load_image, load_karpathy, load_karpathy_test
from mdc.data.pipeline import image_transform
from mdc.optim import make_optimizer, make_scheduler
from mdc.sampler import check_length, generate
from mdc.tokenizer import TextStats

logger = logging.getLogger(__name__)

#: pycocoevalcap scorers -> the names they report under.
METRICS = {"bleu": ("bleu1", "bleu2", "bleu3", "bleu4"), "meteor": ("meteor",), "rouge_l": ("rouge_l",),
           "cider": ("cider",), "spice": ("spice",)}
SPICE_DOWNLOAD_TIMEOUT = 60  # seconds per socket operation while SPICE fetches its CoreNLP jars
#: Table 3: our metric keys -> the paper's column suffixes (rows: :func:`row_label`).
TABLE3_COLUMNS = {"bleu4": "bleu4", "meteor": "meteor", "cider": "cider", "spice": "spice", "rouge_l": "rougeL"}
TABLE3_PREFIX = {"coco": "coco", "flickr30k": "flickr"}
FORMATS = ("karpathy", "coco", "karpathy_test")


# --------------------------------------------------------------------------- data and models
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


def load_captioner(path: str, objective: str, parameter: str = "checkpoint"):
    """``mdc.load`` a checkpoint folder (or a pretraining run folder: its latest checkpoint) and
    check that it is an ``objective`` ("mdc" | "arc") captioner; errors name ``parameter`` and the path."""
    from mdc.checkpoint import latest
    from mdc.factory import load

    if not os.path.isdir(path):
        raise ValueError(f"{parameter} = {path!r}: folder not found")
    path = latest(path) or path
    if not os.path.isfile(os.path.join(path, "config.json")):
        raise ValueError(f"{parameter} = {path!r}: not a checkpoint folder (no config.json; give a folder "
                         f"written by model.save or a pretraining run folder)")
    try:
        model = load(path)
    except (FileNotFoundError, ValueError) as exn:
        raise ValueError(f"{parameter} = {path!r}: {exn}") from exn
    got = model.config.objective
    if got == "clip":
        raise ValueError(f"{parameter} = {path!r} holds a CLIP model, which cannot caption; "
                         f"give a checkpoint pretrained with objective {objective!r}")
    if got != objective:
        raise ValueError(f"{parameter} = {path!r} holds an {got!r} captioner, expected {objective!r} "
                         f"(are mdc_checkpoint and arc_checkpoint swapped?)")
    return model


def _check_captioner(model) -> str:
    objective = model.config.objective
    if objective not in ("mdc", "arc"):
        raise ValueError(f"captioning needs an 'mdc' or 'arc' model; got objective {objective!r}")
    return objective


def _check_items(items: Sequence[Mapping]) -> None:
    if not items:
        raise ValueError("no captioning items (an empty split, or every image missing?)")
    ids = [it["image_id"] for it in items]
    if len(set(ids)) != len(ids):
        raise ValueError(f"image_id values repeat in the captioning items (e.g. {ids[0]!r}); they key the captions")
    for it in items:
        if not it.get("references"):
            raise ValueError(f"image {it['image_id']!r} has no reference captions")


# --------------------------------------------------------------------------- fine-tuning
def finetune(model, items: Sequence[Mapping], *, steps: int, batch_size: int = 32, lr: float = 1e-5,
             weight_decay: float = 0.01, warmup_steps: int | None = None, grad_clip_norm: float | None = 1.0,
             seed: int = 0, device: str = "cpu", cache_limit: int = 4096):
    """Fine-tune a captioner with its own ``model.loss`` on ``items`` (image + references).

    Each draw pairs an image with one reference picked uniformly; images are visited in seeded
    random epochs. AdamW (the pretraining parameter groups), ``warmup_steps`` linear warm-up
    (default 5% of the steps) then cosine decay to 0. Images get the model's eval transform and
    are decoded once when the set holds at most ``cache_limit`` images, else per batch.
    Returns ``(model, log)`` with ``log = {"loss": [per step], "text": TextStats counts}``;
    the model is left in eval mode on ``device``.
    """
    objective = _check_captioner(model)
    _check_items(items)
    if steps < 1 or batch_size < 1:
        raise ValueError(f"steps and batch_size must be >= 1; got {steps}, {batch_size}")
    model.to(device).train()
    transform = image_transform(model.config.image_size, train=False)
    cache: dict[int, torch.Tensor] | None = {} if len(items) <= cache_limit else None
    rng = np.random.default_rng(seed)
    generator = torch.Generator(device=device).manual_seed(seed)  # MDC masking
    optimizer = make_optimizer(model, lr, weight_decay)
    warmup = max(1, steps // 20) if warmup_steps is None else warmup_steps
    scheduler = make_scheduler(optimizer, warmup, steps)
    order: list[int] = []
    losses, text = [], TextStats()

    def image(i: int) -> torch.Tensor:
        if cache is None:
            return transform(load_image(items[i]))
        if i not in cache:
            cache[i] = transform(load_image(items[i]))
        return cache[i]

    for _ in range(steps):
        batch = []
        while len(batch) < batch_size:
            order = order or rng.permutation(len(items)).tolist()
            batch.append(order.pop())
        captions = [items[i]["references"][rng.integers(len(items[i]["references"]))] for i in batch]
        tokens, stats = model.tokenizer.tokenize(captions)
        text.merge(stats)
        images = torch.stack([image(i) for i in batch]).to(device)
        kw = {"generator": generator} if objective == "mdc" else {}
        loss = model.loss(images, tokens.to(device), **kw)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        if grad_clip_norm:
            torch.nn.utils.clip_grad_norm_(model.parameters(), grad_clip_norm)
        optimizer.step()
        scheduler.step()
        losses.append(loss.item())
    model.eval()
    return model, {"loss": losses, "text": text.as_dict()}


# --------------------------------------------------------------------------- generation
@torch.no_grad()
def generate_captions(model, items: Sequence[Mapping], *, lengths: Sequence[int] = (10, 15, 20),
                      beam_size: int = 6, arc_max_length: int | None = None, batch_size: int = 32,
                      device: str = "cpu") -> dict[str, dict]:
    """``{name: {image_id: caption}}``: MDC greedy at each length (``mdc-10``, ...), ARC beam
    search (``arc-beam6``; at most ``arc_max_length`` tokens, default the context minus SOT/EOT)."""
    objective = _check_captioner(model)
    _check_items(items)
    if objective == "mdc":
        for n in lengths:
            check_length(model, n)
        runs = {f"mdc-{n}": dict(length=n) for n in lengths}
    else:
        max_length = arc_max_length or model.config.context_length - 2
        check_length(model, max_length)
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


# --------------------------------------------------------------------------- metrics
def _scorer(metric: str):
    """A pycocoevalcap scorer, imported at call time."""
    if metric == "bleu":
        from pycocoevalcap.bleu.bleu import Bleu
        return Bleu(4)
    if metric == "meteor":
        from pycocoevalcap.meteor.meteor import Meteor
        return Meteor()
    if metric == "rouge_l":
        from pycocoevalcap.rouge.rouge import Rouge
        return Rouge()
    if metric == "cider":
        from pycocoevalcap.cider.cider import Cider
        return Cider()
    from pycocoevalcap.spice import spice

    old = socket.getdefaulttimeout()
    socket.setdefaulttimeout(SPICE_DOWNLOAD_TIMEOUT)  # its jar download has no timeout of its own
    try:
        return spice.Spice()
    except Exception as exn:
        lib = os.path.join(os.path.dirname(spice.__file__), "lib")
        raise RuntimeError(f"SPICE needs the Stanford CoreNLP 3.6.0 jars in {lib}, which it downloads on first "
                           f"use; that failed ({type(exn).__name__}: {exn})") from exn
    finally:
        socket.setdefaulttimeout(old)


def _close(scorer) -> None:
    """Stop METEOR's Java process (its own __del__ would hang if a failed call left its lock held)."""
    process = getattr(scorer, "meteor_p", None)
    if process is not None:
        process.kill()
        process.wait()
        if scorer.lock.locked():
            scorer.lock.release()


def _ptb_tokenize(captions: Mapping) -> dict:
    """pycocoevalcap's PTB tokenizer (Java) on ``{key: [captions]}``, checked to keep every caption."""
    from pycocoevalcap.tokenizer.ptbtokenizer import PTBTokenizer

    flat = {k: [{"caption": " ".join(c.split())} for c in v] for k, v in captions.items()}  # one line each
    out = PTBTokenizer().tokenize(flat)
    if any(len(out.get(k, ())) != len(v) for k, v in captions.items()):
        raise RuntimeError("PTB tokenizer returned fewer lines than captions")
    return out


def evaluate_captions(captions_by_model: Mapping[str, Mapping], references: Mapping[object, Sequence[str]],
                      metrics: Sequence[str] = tuple(METRICS)) -> dict[str, dict]:
    """:func:`caption_metrics` of several models at once (one tokenizer run, one METEOR process)."""
    unknown = set(metrics) - set(METRICS)
    if unknown:
        raise ValueError(f"unknown metrics {sorted(unknown)}; choose from {list(METRICS)}")
    for name, predictions in captions_by_model.items():
        if not predictions:
            raise ValueError(f"{name or 'predictions'}: no captions to score")
        for image_id in predictions:
            if not references.get(image_id):
                raise ValueError(f"{name or 'predictions'}: image {image_id!r} has no reference captions")
    out = {name: {key: None for keys in METRICS.values() for key in keys} | {"unavailable": {}}
           for name in captions_by_model}

    def unavailable(metric: str, reason: str, names=tuple(out)) -> None:
        for name in names:
            out[name]["unavailable"].update({key: reason for key in METRICS[metric]})

    for metric in set(METRICS) - set(metrics):
        unavailable(metric, "not requested")
    ids = sorted({i for p in captions_by_model.values() for i in p}, key=str)
    try:
        gts = _ptb_tokenize({i: list(references[i]) for i in ids})
        res = _ptb_tokenize({(name, i): [c] for name, p in captions_by_model.items() for i, c in p.items()})
    except Exception as exn:  # Java missing, ...: nothing can be scored on pycocoevalcap's scale
        reason = f"PTB tokenizer failed ({type(exn).__name__}: {exn})"
        logger.warning("caption metrics unavailable: %s", reason)
        for metric in metrics:
            unavailable(metric, reason)
        return out
    for metric in [m for m in METRICS if m in metrics]:
        try:
            with contextlib.redirect_stdout(io.StringIO()):  # pycocoevalcap prints progress
                scorer = _scorer(metric)
        except Exception as exn:
            logger.warning("%s unavailable: %s", metric, exn)
            unavailable(metric, f"{type(exn).__name__}: {exn}")
            continue
        try:
            for name, predictions in captions_by_model.items():
                keys = sorted(predictions, key=str)
                try:
                    with contextlib.redirect_stdout(io.StringIO()):
                        score, _ = scorer.compute_score({i: gts[i] for i in keys}, {i: res[(name, i)] for i in keys})
                except Exception as exn:
                    logger.warning("%s failed for %s: %s", metric, name or "predictions", exn)
                    unavailable(metric, f"{type(exn).__name__}: {exn}", [name])
                    continue
                scores = score if isinstance(score, list) else [score]
                out[name].update({k: float(s) for k, s in zip(METRICS[metric], scores)})
        finally:
            _close(scorer)
    return out


def caption_metrics(predictions: Mapping, references: Mapping[object, Sequence[str]],
                    metrics: Sequence[str] = tuple(METRICS)) -> dict:
    """pycocoevalcap's BLEU-1..4, METEOR, ROUGE-L, CIDEr and SPICE of ``{image_id: caption}``
    against ``{image_id: [references]}`` (the predicted images only), PTB-tokenized as the
    COCO caption evaluation does; fractions, as pycocoevalcap returns them.

    A metric that cannot be computed (SPICE offline without its CoreNLP jars, METEOR without
    Java, one not in ``metrics``) is None, with the reason under ``unavailable[name]``, logged.
    """
    return evaluate_captions({"": predictions}, references, metrics)[""]


# --------------------------------------------------------------------------- tables and figures
def row_label(name: str) -> str:
    """The paper's row label of a caption set: ``arc-beam6`` -> "ARC (beam 6)", ``mdc-10`` -> "MDC-10"."""
    if name.startswith("arc-beam"):
        return f"ARC (beam {name[8:]})"
    return name.upper()


def _row_order(name: str) -> tuple:
    return (name.startswith("mdc-"), int(name.split("-")[-1].removeprefix("beam")))


def table3_rows(results: Mapping, dataset: str | None = None) -> list[dict]:
    """Table 3 rows (ARC, then MDC by length; values in percent, as the paper prints them) from
    a captioning ``results`` dict: ``method``, ``length_<dataset>`` and ``<prefix>_bleu4, _meteor,
    _cider, _spice, _rougeL, _llm_judge`` (prefix coco | flickr); None where not computed."""
    dataset = dataset or results["dataset"]["name"]
    prefix = TABLE3_PREFIX[dataset]
    judge = (results.get("judge") or {}).get("selection_rate") or {}
    rows = []
    for name in sorted(results["metrics"], key=_row_order):
        m = results["metrics"][name]
        row = {"method": row_label(name), f"length_{dataset}": int(name[4:]) if name.startswith("mdc-") else None}
        row |= {f"{prefix}_{col}": None if m.get(k) is None else 100 * m[k] for k, col in TABLE3_COLUMNS.items()}
        row[f"{prefix}_llm_judge"] = 100 * judge[name] if name in judge else None
        rows.append(row)
    return rows


def pick_examples(items: Sequence[Mapping], captions_by_model: Mapping[str, Mapping], k: int = 3,
                  seed: int = 0) -> dict:
    """``k`` seeded random images with every model's caption: the arguments of :func:`mdc.plots.plot_captions`."""
    chosen = sorted(np.random.default_rng(seed).choice(len(items), min(k, len(items)), replace=False).tolist())
    picked = [items[i] for i in chosen]
    return {"images": [load_image(it) for it in picked], "references": [it["references"] for it in picked],
            "captions_by_model": {n: [c[it["image_id"]] for it in picked] for n, c in captions_by_model.items()}}
