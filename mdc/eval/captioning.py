"""Image captioning evaluation (paper Sec. 4.2, Table 3, Fig. 6).

Pretrained captioners are fine-tuned on a captioning set's train split (:func:`finetune`),
caption its test split (:func:`generate_captions`: MDC greedy at lengths 10/15/20, ARC beam 6),
and are scored with pycocoevalcap (:func:`mdc.eval.metrics.caption_metrics`) and, optionally, an LLM judge that
picks the best of the four captions per image (:func:`mdc.eval.judge.llm_judge`).

This module runs one captioner through those steps (:func:`caption_checkpoint`) and is where every
captioning name is imported from; the steps live in :mod:`mdc.eval.caption_data` (items, checkpoints),
:mod:`mdc.eval.caption_finetune`, :mod:`mdc.eval.caption_generation`, :mod:`mdc.eval.metrics` and
:mod:`mdc.eval.caption_outputs` (Table 3's rows, the results, the files, Fig. 6's examples).

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

import logging
import os
from dataclasses import dataclass
from typing import Mapping, Sequence

import torch

from mdc.eval.caption_data import (FORMATS, Images, check_captioner, check_items, limit,  # noqa: F401
                                   load_caption_items, load_captioner, reference_lengths, resolve_checkpoint,
                                   token_length)
from mdc.eval.caption_finetune import FinetuneOptions, finetune  # noqa: F401
from mdc.eval.caption_generation import generate_captions  # noqa: F401
from mdc.eval.caption_outputs import (TABLE3_COLUMNS, TABLE3_PREFIX, captioning_results, example_images,  # noqa: F401
                                      markdown_table, pick_examples, row_label, table3_rows, write_outputs)
from mdc.eval.metrics import METRICS, caption_metrics, descriptiveness, evaluate_captions  # noqa: F401
from mdc.eval.results import checkpoint_id
from mdc.options import with_options

logger = logging.getLogger(__name__)


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
