"""Image captioning evaluation (paper Sec. 4.2, Table 3, Fig. 6).

Pretrained captioners are fine-tuned on a captioning set's train split (:func:`finetune`),
caption its test split (:func:`generate_captions`: MDC greedy at lengths 10/15/20, ARC beam 6),
and are scored with pycocoevalcap (:func:`mdc.eval.metrics.caption_metrics`) and, optionally, an LLM judge that
picks the best of the four captions per image (:func:`mdc.eval.judge.llm_judge`).

Results (``results`` of the ``captioning`` results file, :mod:`mdc.eval.results`)::

    {
      "dataset": {"name": "coco" | "flickr30k",   # the Table 3 block these numbers fill
                  "captions_json", "format", "split",
                  "images_evaluated": int, "images_total": int, "images_missing": int},
      "metrics": {"mdc-10" | "mdc-15" | "mdc-20" | "arc-beam6": {
                  "bleu1", "bleu2", "bleu3", "bleu4", "meteor", "rouge_l", "cider", "spice",
                                                  # fractions, as pycocoevalcap returns them; null = not computed
                  "unavailable": {metric: why}}},
      "judge": {"model", "endpoint", "models": [names compared], "images", "valid", "invalid",
                "failed", "counts": {name: int}, "selection_rate": {name: fraction of valid answers} | null}
               | null,                            # null: the judge did not run
      "unavailable": {"spice" | "meteor" | ... | "judge" | "mdc" | "arc": why it is missing},
      "checkpoints": {"mdc" | "arc": {"path", "checkpoint_id", "finetuned": folder | null, "model": config}},
      "finetune": {"mdc" | "arc": {"steps", "batch_size", "lr", "images", "unknown_rate", "loss": [per step]}},
      "files": {"predictions", "table", "figure", "judge_answers"?},  # beside the results file
      "examples": [{"image_id", "image_path", "references", "captions": {model: caption},
                    "thumbnail": base64 PNG, at most 128 px}]  # the figure (Fig. 6), redrawn from this alone
    }

The results file's top-level ``checkpoint`` / ``model`` are the MDC checkpoint's (ARC's without one).
:func:`table3_rows` turns it into the paper's Table 3 rows ("ARC (beam 6)", "MDC-10", ...) and
columns (``coco_bleu4, coco_meteor, coco_cider, coco_spice, coco_rougeL, coco_llm_judge``) in
the paper's units (percent).
"""
from __future__ import annotations

import base64
import csv
import io
import json
import logging
import os
from dataclasses import asdict, dataclass
from typing import Mapping, Sequence

import numpy as np
import torch
from PIL import Image

from mdc.api import generate
from mdc.data.formats import Items, load_coco_captions, load_image, load_karpathy, load_karpathy_test
from mdc.options import with_options
from mdc.data.transforms import image_transform
from mdc.eval.metrics import METRICS, caption_metrics, descriptiveness, evaluate_captions  # noqa: F401 (part of this module's API)
from mdc.eval.results import checkpoint_id
from mdc.factory import checkpoint_folder, load
from mdc.optim import fit
from mdc.tokenizer import TextStats

logger = logging.getLogger(__name__)

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


def _check_captioner(model) -> str:
    objective = model.config.objective
    if objective not in ("mdc", "arc"):
        raise ValueError(f"captioning needs an 'mdc' or 'arc' model; got objective {objective!r}")
    return objective


def _check_items(items: Sequence[Mapping]) -> None:
    if not items:
        raise ValueError("no captioning items (an empty split, or every image missing?)")
    seen = set()
    for it in items:
        if it["image_id"] in seen:
            raise ValueError(f"image_id {it['image_id']!r} repeats in the captioning items; ids key the captions")
        seen.add(it["image_id"])
        if not it.get("references"):
            raise ValueError(f"image {it['image_id']!r} has no reference captions")


# --------------------------------------------------------------------------- fine-tuning
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
    objective = _check_captioner(model)
    _check_items(items)
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


@dataclass(frozen=True)
class CaptionOptions:
    """How :func:`caption_checkpoint` fine-tunes (defaults: :class:`FinetuneOptions`') and captions."""

    finetune_steps: int = 0  # fine-tuning steps; 0: caption with the pretrained weights
    finetune_batch_size: int = FinetuneOptions.batch_size  # image-caption pairs per fine-tuning step
    finetune_lr: float = FinetuneOptions.lr  # fine-tuning peak learning rate
    lengths: tuple[int, ...] = (10, 15, 20)  # MDC caption lengths
    beam_size: int = 6  # ARC beam width
    batch_size: int = 32  # images per generation batch
    device: str = "cpu"  # where the model runs
    seed: int = 0  # fine-tuning randomness
    save_dir: str | None = None  # save the fine-tuned model to save_dir/<objective>; None: not saved


def caption_checkpoint(path: str, objective: str, train_items: Sequence[Mapping], test_items: Sequence[Mapping],
                       options: CaptionOptions | None = None, **kw) -> tuple[dict, dict]:
    """Load the ``objective`` captioner at ``path`` (checked; errors name ``<objective>_checkpoint``),
    fine-tune it on ``train_items`` if ``finetune_steps`` and caption ``test_items``, as ``options`` say
    (a :class:`CaptionOptions`, or its fields as keywords). Returns ``(captions, info)``:
    :func:`generate_captions`' output and ``{path, checkpoint_id, config (ModelConfig), finetuned,
    finetune}`` for the results file."""
    o = with_options(CaptionOptions, options, kw, "captioning")
    path = resolve_checkpoint(path, objective, f"{objective}_checkpoint")  # a run folder -> its checkpoint
    model = load_captioner(path, objective, f"{objective}_checkpoint")
    info = {"path": path, "checkpoint_id": checkpoint_id(path), "config": model.config,
            "finetuned": None, "finetune": None}
    if o.finetune_steps:
        torch.manual_seed(o.seed)
        model, log = finetune(model, train_items, steps=o.finetune_steps, batch_size=o.finetune_batch_size,
                              lr=o.finetune_lr, seed=o.seed, device=o.device)
        unknown = log["text"]["unknown"] / max(1, log["text"]["tokens"])
        if unknown > 0.05:
            logger.warning("%s fine-tuning: %.0f%% of reference tokens are outside the model's vocabulary ([UNK])",
                           objective, 100 * unknown)
        info["finetune"] = {"steps": o.finetune_steps, "batch_size": o.finetune_batch_size, "lr": o.finetune_lr,
                            "images": len(train_items), "unknown_rate": unknown, "loss": log["loss"]}
        if o.save_dir:
            info["finetuned"] = os.path.join(o.save_dir, objective)
            model.save(info["finetuned"])
    captions = generate_captions(model, test_items, lengths=o.lengths, beam_size=o.beam_size,
                                 batch_size=o.batch_size, device=o.device)
    return captions, info


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
    a captioning ``results`` dict: ``method``, ``length_<dataset>``, ``<prefix>_bleu4, _meteor,
    _cider, _spice, _rougeL, _llm_judge`` (prefix coco | flickr) and, beside the paper's columns,
    :func:`descriptiveness`' ``grounded_words`` and ``repeated`` (%); None where not computed."""
    dataset = dataset or results["dataset"]["name"]
    prefix = TABLE3_PREFIX[dataset]
    judge = (results.get("judge") or {}).get("selection_rate") or {}
    rows = []
    for name in sorted(results["metrics"], key=_row_order):
        m = results["metrics"][name]
        row = {"method": row_label(name), f"length_{dataset}": int(name[4:]) if name.startswith("mdc-") else None}
        row |= {f"{prefix}_{col}": None if m.get(k) is None else 100 * m[k] for k, col in TABLE3_COLUMNS.items()}
        row[f"{prefix}_llm_judge"] = 100 * judge[name] if name in judge else None
        row |= {"grounded_words": m.get("grounded_words"),
                "repeated": None if m.get("repeated") is None else 100 * m["repeated"]}
        rows.append(row)
    return rows


def pick_examples(items: Sequence[Mapping], captions_by_model: Mapping[str, Mapping], k: int = 3,
                  seed: int = 0) -> dict:
    """``k`` seeded random images with every model's caption: the arguments of :func:`mdc.plots.plot_captions`,
    plus ``items``: the picked items (image_id, image_path, references), each with its captions and a
    thumbnail, so that the figure can be redrawn from the results alone (:func:`example_images`)."""
    chosen = sorted(np.random.default_rng(seed).choice(len(items), min(k, len(items)), replace=False).tolist())
    picked = [items[i] for i in chosen]
    images = [load_image(it) for it in picked]
    by_model = {n: [c[it["image_id"]] for it in picked] for n, c in captions_by_model.items()}
    return {"images": images, "references": [it["references"] for it in picked], "captions_by_model": by_model,
            "items": [{**{k: it[k] for k in ("image_id", "image_path", "references")},
                       "captions": {n: caps[i] for n, caps in by_model.items()}, "thumbnail": _thumbnail(image)}
                      for i, (it, image) in enumerate(zip(picked, images))]}


def _thumbnail(image, size: int = 128) -> str:
    """A PIL image as a base64 PNG whose longer side is at most ``size`` pixels."""
    image = image.copy()
    image.thumbnail((size, size))
    buffer = io.BytesIO()
    image.save(buffer, format="PNG")
    return base64.b64encode(buffer.getvalue()).decode("ascii")


def example_images(examples: Sequence[Mapping]) -> list:
    """The PIL images of :func:`pick_examples`' ``items`` (from their thumbnails)."""
    return [Image.open(io.BytesIO(base64.b64decode(e["thumbnail"]))).convert("RGB") for e in examples]


def captioning_results(*, dataset: str, items: Items, metrics: Mapping[str, dict], judge: Mapping | None,
                       checkpoints: Mapping[str, dict], captions_json: str, captions_format: str, split) -> dict:
    """The ``results`` of a captioning results file (schema in the module docstring).

    ``metrics``: :func:`evaluate_captions`' output; ``judge``: :func:`mdc.eval.judge.llm_judge`'s
    (its per-image answers are left out; a judge that did not run is null); ``checkpoints``:
    the ``info`` of :func:`caption_checkpoint` per objective.
    """
    if dataset not in TABLE3_PREFIX:
        raise ValueError(f"dataset must be one of {list(TABLE3_PREFIX)} (the Table 3 block); got {dataset!r}")
    unavailable = {obj: f"no {obj}_checkpoint given" for obj in ("mdc", "arc") if obj not in checkpoints}
    for name, m in metrics.items():
        for key, reason in m.get("unavailable", {}).items():
            unavailable.setdefault(key, reason)
    ran = judge is not None and judge["images"] > 0
    if judge is not None and judge.get("reason"):
        unavailable["judge"] = judge["reason"]
    return {
        "dataset": {"name": dataset, "captions_json": captions_json, "format": captions_format, "split": split,
                    "images_evaluated": len(items), "images_total": getattr(items, "total", len(items)),
                    "images_missing": len(getattr(items, "missing", ()))},
        "metrics": dict(metrics),
        "judge": {k: v for k, v in judge.items() if k not in ("answers", "reason")} if ran else None,
        "unavailable": unavailable,
        "checkpoints": {obj: {k: info[k] for k in ("path", "checkpoint_id", "finetuned")} | {"model": asdict(info["config"])}
                        for obj, info in checkpoints.items()},
        "finetune": {obj: info["finetune"] for obj, info in checkpoints.items() if info["finetune"]},
    }


def write_outputs(output_dir: str, captions: Mapping[str, Mapping], results: Mapping,
                  judge: Mapping | None = None) -> dict:
    """Write ``predictions.json`` ({name: {image_id: caption}}), ``table3.csv`` / ``table3.md``
    (:func:`table3_rows`) and, if the judge ran, ``judge_answers.json``; returns their paths."""
    os.makedirs(output_dir, exist_ok=True)
    files = {"predictions": os.path.join(output_dir, "predictions.json"), "table": os.path.join(output_dir, "table3.csv")}
    with open(files["predictions"], "w") as f:
        json.dump({name: {str(i): c for i, c in caps.items()} for name, caps in captions.items()}, f, indent=1)
    rows = table3_rows(results)
    columns = list(rows[0]) if rows else ["method"]
    with open(files["table"], "w", newline="") as f:
        writer = csv.DictWriter(f, columns)
        writer.writeheader()
        writer.writerows(rows)
    with open(os.path.splitext(files["table"])[0] + ".md", "w") as f:
        f.write(markdown_table(rows))
    if judge and judge.get("answers"):
        files["judge_answers"] = os.path.join(output_dir, "judge_answers.json")
        with open(files["judge_answers"], "w") as f:
            json.dump(judge["answers"], f, indent=1)
    return files


def markdown_table(rows: Sequence[Mapping]) -> str:
    """Rows of :func:`table3_rows` as a Markdown table (numbers to one decimal, "-" where missing)."""
    if not rows:
        return "(no captioner evaluated)\n"
    columns = list(rows[0])
    cell = lambda v: "-" if v is None else f"{v:.1f}" if isinstance(v, float) else str(v)  # noqa: E731
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(cell(r[c]) for c in columns) + " |" for r in rows]
    return "\n".join(lines) + "\n"
