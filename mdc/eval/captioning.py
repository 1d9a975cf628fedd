"""Image captioning evaluation (paper Sec. 4.2, Table 3, Fig. 6).

Pretrained captioners are fine-tuned on a captioning set's train split until their loss on its
validation split stops improving (:func:`finetune`, the rule in :mod:`mdc.eval.caption_finetune`), caption
its test split (:func:`generate_captions`: the paper's MDC greedy at lengths 10/15/20 and ARC beam 6, and
beside them the sets at matched length and ARC greedy, :mod:`mdc.eval.caption_generation`), and are scored
with pycocoevalcap (:func:`mdc.eval.metrics.evaluate_captions`, with BLEU's brevity penalty and the mean
length in words beside the metrics) and, optionally, an LLM judge that picks the best of the paper's four
captions per image (:func:`mdc.eval.judge.llm_judge`).

Results (``results`` of the ``captioning`` results file, :mod:`mdc.eval.results`)::

    {
      "dataset": {"name": "coco" | "flickr30k",   # the Table 3 block these numbers fill
                  "captions_json", "format", "split",
                  "images_evaluated": int, "images_total": int, "images_missing": int,
                  "reference_words": mean words of a reference, "image_ids": [sorted as strings]},
      "metrics": {"mdc-10" | "mdc-15" | "mdc-20" | "arc-beam6"          # the paper's sets
                  | "arc-greedy" | "arc-beam6-ref" | "mdc-arc" | "mdc-ref": {   # matched length, greedy
                  "bleu1", "bleu2", "bleu3", "bleu4", "bp", "meteor", "rouge_l", "cider", "spice",
                                                  # fractions, as pycocoevalcap returns them; null = not computed
                  "cider_per_image": [per image, in image_ids' order],
                  "words", "content_words", "grounded_words", "repeated",   # mdc.eval.metrics.descriptiveness
                  "unavailable": {metric: why}}},
      "judge": {"model", "endpoint", "models": [names compared], "images", "valid", "invalid",
                "failed", "counts": {name: int}, "selection_rate": {name: fraction of valid answers} | null}
               | null,                            # null: the judge did not run
      "unavailable": {"spice" | "meteor" | ... | "judge" | "mdc" | "arc": why it is missing},
      "checkpoints": {"mdc" | "arc": {"path", "checkpoint_id", "finetuned": folder | null, "model": config}},
      "finetune": {"mdc" | "arc": {"steps" (the cap), "steps_taken", "batch_size", "lr", "images", "unknown_rate",
                   "t_interval" (MDC: the masking ratios it trained at), "loss": [per step], and with the
                   stopping rule "eval_every", "patience", "tolerance", "val_images", "val": [[step, validation
                   loss]], "best_step", "stopped": "plateau" | "cap"}},
      "files": {"predictions", "table", "figure", "judge_answers"?},  # beside the results file
      "examples": [{"image_id", "image_path", "references", "captions": {model: caption},
                    "thumbnail": base64 PNG, at most 128 px}]  # the figure (Fig. 6), redrawn from this alone
    }

The results file's top-level ``checkpoint`` / ``model`` are the MDC checkpoint's (ARC's without one).
:func:`table3_rows` turns it into the paper's Table 3 rows ("ARC (beam 6)", "MDC-10", ...; the matched
ones as "MDC (ARC's length)", ...) and columns (``words, bp, coco_bleu4, coco_meteor, coco_cider,
coco_spice, coco_rougeL, coco_llm_judge``) in the paper's units (percent).
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
from mdc.eval.caption_outputs import (MATCHED, TABLE3_COLUMNS, TABLE3_PREFIX, captioning_results,  # noqa: F401
                                      example_images, markdown_table, paper_sets, pick_examples, row_label,
                                      table3_rows, write_outputs)
from mdc.eval.metrics import (METRICS, another_image_cider, brevity_penalty, caption_metrics,  # noqa: F401
                              descriptiveness, evaluate_captions, mean_words)
from mdc.eval.results import checkpoint_id
from mdc.base.options import with_options

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class CaptionOptions:
    """How :func:`caption_checkpoint` fine-tunes (defaults: :class:`FinetuneOptions`') and captions."""

    finetune_steps: int = 0  # fine-tuning steps (with finetune_eval_every: the most); 0: the pretrained weights
    finetune_batch_size: int = FinetuneOptions.batch_size  # image-caption pairs per fine-tuning step
    finetune_lr: float = FinetuneOptions.lr  # fine-tuning peak learning rate
    finetune_eval_every: int = FinetuneOptions.eval_every  # the stopping rule's validation period; 0: no rule
    finetune_patience: int = FinetuneOptions.patience  # evaluations without an improvement before it stops
    finetune_tolerance: float = FinetuneOptions.tolerance  # an improvement: by more than this fraction
    finetune_t_interval: tuple[float, float] | None = None  # MDC fine-tunes at t ~ U[w_l, w_u]; None: as pretrained
    lengths: tuple[int, ...] = (10, 15, 20)  # MDC caption lengths
    beam_size: int = 6  # ARC beam width
    matched_length: bool = True  # also the sets at matched length (caption_generation's docstring)
    arc_greedy: bool = True  # also ARC's greedy decoding
    batch_size: int = 32  # images per generation batch
    device: str = "cpu"  # where the model runs
    seed: int = 0  # fine-tuning randomness
    save_dir: str | None = None  # save the fine-tuned model to save_dir/<objective>; None: not saved


def caption_checkpoint(path: str, objective: str, train_items: Sequence[Mapping], test_items: Sequence[Mapping],
                       options: CaptionOptions | None = None, *, val_items: Sequence[Mapping] = (),
                       match: Mapping[str, Mapping] | None = None, **kw) -> tuple[dict, dict]:
    """Load the ``objective`` captioner at ``path`` (checked; errors name ``<objective>_checkpoint``),
    fine-tune it on ``train_items`` if ``finetune_steps`` (until its loss on ``val_items`` stops improving, with
    ``finetune_eval_every``) and caption ``test_items``, as ``options`` say (a :class:`CaptionOptions`, or its
    fields as keywords). With ``matched_length`` it also captions at the references' median length per image
    (tag ``ref``) and, for MDC, at the length of each caption set of ``match`` ({tag: {image_id: caption}},
    e.g. ``{"arc": ARC's beam captions}``), counted in this model's tokens. Returns ``(captions, info)``:
    :func:`generate_captions`' output and ``{path, checkpoint_id, config (ModelConfig), finetuned,
    finetune}`` for the results file."""
    o = with_options(CaptionOptions, options, kw, "captioning")
    path = resolve_checkpoint(path, objective, f"{objective}_checkpoint")  # a run folder -> its checkpoint
    model = load_captioner(path, objective, f"{objective}_checkpoint")
    info = {"path": path, "checkpoint_id": checkpoint_id(path), "config": model.config,
            "finetuned": None, "finetune": None}
    if o.finetune_steps:
        model, info["finetune"] = _finetune(model, objective, train_items, val_items, o)
        if o.save_dir:
            info["finetuned"] = os.path.join(o.save_dir, objective)
            model.save(info["finetuned"])
    per_image = {}
    if o.matched_length:
        most = model.config.context_length - 2
        per_image = {tag: {i: token_length(model.tokenizer, c, most) for i, c in captions.items()}
                     for tag, captions in (match or {}).items()} if objective == "mdc" else {}
        per_image["ref"] = reference_lengths(test_items, model.tokenizer, most)
    captions = generate_captions(model, test_items, lengths=o.lengths, beam_size=o.beam_size, batch_size=o.batch_size,
                                 device=o.device, greedy=o.arc_greedy, per_image=per_image)
    return captions, info


def _finetune(model, objective: str, train_items, val_items, o: CaptionOptions) -> tuple:
    """:func:`finetune` as ``o`` says; returns the model and the ``finetune`` entry of the results."""
    torch.manual_seed(o.seed)
    model, log = finetune(model, train_items, val_items=val_items, steps=o.finetune_steps,
                          batch_size=o.finetune_batch_size, lr=o.finetune_lr, seed=o.seed, device=o.device,
                          eval_every=o.finetune_eval_every, patience=o.finetune_patience,
                          tolerance=o.finetune_tolerance,
                          t_interval=o.finetune_t_interval if objective == "mdc" else None)  # ARC has no t
    unknown = log["text"]["unknown"] / max(1, log["text"]["tokens"])
    if unknown > 0.05:
        logger.warning("%s fine-tuning: %.0f%% of reference tokens are outside the model's vocabulary ([UNK])",
                       objective, 100 * unknown)
    rule = {"eval_every": o.finetune_eval_every, "patience": o.finetune_patience, "tolerance": o.finetune_tolerance,
            "val_images": len(val_items)} if o.finetune_eval_every else {}
    t = {"t_interval": list(model.config.t_interval)} if objective == "mdc" else {}
    return model, {"steps": o.finetune_steps, "steps_taken": len(log["loss"]), "batch_size": o.finetune_batch_size,
                   "lr": o.finetune_lr, "images": len(train_items), "unknown_rate": unknown, "loss": log["loss"],
                   **t, **rule, **{k: log[k] for k in ("val", "best_step", "stopped") if k in log}}
