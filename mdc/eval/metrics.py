"""Captioning metrics on pycocoevalcap's scale: BLEU-1..4, METEOR, ROUGE-L, CIDEr and SPICE.

Captions and references are PTB-tokenized as the COCO caption evaluation does. Every metric
fails on its own: one that cannot run (SPICE offline without its Stanford CoreNLP jars, METEOR
or the tokenizer without Java, one not asked for) is None, with the reason under
``unavailable``, and logged; the others are still computed.
"""
from __future__ import annotations

import contextlib
import io
import logging
import math
import os
import random
import re
import socket
from typing import Mapping, Sequence

logger = logging.getLogger(__name__)

#: pycocoevalcap scorers -> the names they report under (bp: BLEU's brevity penalty, :func:`brevity_penalty`).
METRICS = {"bleu": ("bleu1", "bleu2", "bleu3", "bleu4", "bp"), "meteor": ("meteor",), "rouge_l": ("rouge_l",),
           "cider": ("cider",), "spice": ("spice",)}
#: Metrics whose per-image scores are kept (under ``<metric>_per_image``, in the images' sorted order):
#: CIDEr-D's corpus score is the mean of its per-image scores, so a paired difference reads them.
PER_IMAGE = ("cider",)
PER_IMAGE_DIGITS = 4  # fractions rounded to 1e-4 (0.01 CIDEr points): the run records stay small
SPICE_DOWNLOAD_TIMEOUT = 60  # seconds per socket operation while SPICE fetches its CoreNLP jars
#: Words that name nothing in an image: articles, conjunctions, prepositions, copulas, pronouns.
FUNCTION_WORDS = frozenset("a an the and or but of on in at to with without from by for as into onto near "
                           "is are was were be been it its this that these those there their his her".split())
#: The keys :func:`descriptiveness` adds to every model's metrics.
DESCRIPTIVENESS = ("words", "content_words", "grounded_words", "repeated")


def _words(text: str) -> list[str]:
    return re.findall(r"[a-z0-9]+", text.lower())


def mean_words(texts: Sequence[str]) -> float:
    """The mean number of words of ``texts`` (words as :func:`descriptiveness` counts them)."""
    if not texts:
        raise ValueError("no texts to count")
    return sum(len(_words(t)) for t in texts) / len(texts)


def descriptiveness(predictions: Mapping, references: Mapping[object, Sequence[str]]) -> dict[str, float]:
    """How much of its image a caption names (the paper's Fig. 6 claim that longer MDC captions
    are more descriptive), averaged over the images of ``{image_id: caption}``:

    - ``words``: words in the caption;
    - ``content_words``: its distinct words outside :data:`FUNCTION_WORDS`;
    - ``grounded_words``: those of them that occur in one of the image's references;
    - ``repeated``: the fraction of its words that repeat an earlier word of the caption.

    A longer caption that is more descriptive names more grounded words without repeating itself.
    """
    rows = []
    for image_id, caption in predictions.items():
        if not references.get(image_id):
            raise ValueError(f"image {image_id!r} has no reference captions")
        words = _words(caption)
        content = set(words) - FUNCTION_WORDS
        seen = {w for ref in references[image_id] for w in _words(ref)}
        rows.append((len(words), len(content), len(content & seen), 1 - len(set(words)) / max(len(words), 1)))
    if not rows:
        raise ValueError("no captions to measure")
    return {key: sum(r[k] for r in rows) / len(rows) for k, key in enumerate(DESCRIPTIVENESS)}


def brevity_penalty(references: Mapping, captions: Mapping) -> float:
    """BLEU's corpus brevity penalty BP = min(1, exp(1 - r/c)), as pycocoevalcap computes it: c the summed
    length of the captions (``{key: [caption]}``), r the summed length of each caption's closest reference
    (``{key: [references]}``; a tie goes to the shorter), both in whitespace tokens of the PTB-tokenized text.
    BLEU-n is BP times the geometric mean of the n-gram precisions, so BP < 1 says the captions are
    shorter than the references and by how much BLEU is cut for it."""
    c = r = 0
    for key, (caption,) in captions.items():
        n = len(caption.split())
        c += n
        r += min((abs(len(ref.split()) - n), len(ref.split())) for ref in references[key])[1]
    ratio = (c + 1e-15) / (r + 1e-9)  # pycocoevalcap's guards against zero
    return 1.0 if ratio >= 1 else math.exp(1 - 1 / ratio)


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


def ptb_tokenize(captions: Mapping) -> dict:
    """pycocoevalcap's PTB tokenizer (Java) on ``{key: [captions]}``, checked to keep every caption."""
    from pycocoevalcap.tokenizer.ptbtokenizer import PTBTokenizer

    flat = {k: [{"caption": " ".join(c.split())} for c in v] for k, v in captions.items()}  # one line each
    out = PTBTokenizer().tokenize(flat)
    if any(len(out.get(k, ())) != len(v) for k, v in captions.items()):
        raise RuntimeError("PTB tokenizer returned fewer lines than captions")
    return out


def evaluate_captions(captions_by_model: Mapping[str, Mapping], references: Mapping[object, Sequence[str]],
                      metrics: Sequence[str] = tuple(METRICS)) -> dict[str, dict]:
    """:func:`caption_metrics` of several models at once (one tokenizer run, one METEOR process),
    each with its :func:`descriptiveness` (which needs no tokenizer and is always computed), BLEU's
    brevity penalty ``bp`` beside BLEU, and the per-image scores of :data:`PER_IMAGE` (``cider_per_image``,
    in the order of the model's image ids sorted as strings)."""
    unknown = set(metrics) - set(METRICS)
    if unknown:
        raise ValueError(f"unknown metrics {sorted(unknown)}; choose from {list(METRICS)}")
    for name, predictions in captions_by_model.items():
        if not predictions:
            raise ValueError(f"{name or 'predictions'}: no captions to score")
        for image_id in predictions:
            if not references.get(image_id):
                raise ValueError(f"{name or 'predictions'}: image {image_id!r} has no reference captions")
    out = {name: {key: None for keys in METRICS.values() for key in keys} | descriptiveness(predictions, references)
           | {"unavailable": {}} for name, predictions in captions_by_model.items()}

    def unavailable(metric: str, reason: str, names=tuple(out)) -> None:
        for name in names:
            out[name]["unavailable"].update({key: reason for key in METRICS[metric]})

    for metric in [m for m in METRICS if m not in metrics]:
        unavailable(metric, "not requested")
    if not metrics:
        return out
    ids = sorted({i for p in captions_by_model.values() for i in p}, key=str)
    try:
        gts = ptb_tokenize({i: list(references[i]) for i in ids})
        res = ptb_tokenize({(name, i): [c] for name, p in captions_by_model.items() for i, c in p.items()})
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
                        score, per_image = scorer.compute_score({i: gts[i] for i in keys},
                                                                 {i: res[(name, i)] for i in keys})
                except Exception as exn:
                    logger.warning("%s failed for %s: %s", metric, name or "predictions", exn)
                    unavailable(metric, f"{type(exn).__name__}: {exn}", [name])
                    continue
                _record(out[name], metric, score, per_image, {i: gts[i] for i in keys}, {i: res[(name, i)] for i in keys})
        finally:
            _close(scorer)
    return out


def _record(out: dict, metric: str, score, per_image, gts: Mapping, res: Mapping) -> None:
    """Write a scorer's corpus score(s) into one model's ``out``, with BLEU's brevity penalty and the
    per-image scores of :data:`PER_IMAGE`."""
    scores = score if isinstance(score, list) else [score]
    out.update({k: float(s) for k, s in zip(METRICS[metric], scores)})
    if metric == "bleu":
        out["bp"] = brevity_penalty(gts, res)
    if metric in PER_IMAGE:
        out[f"{metric}_per_image"] = [round(float(x), PER_IMAGE_DIGITS) for x in per_image]


def caption_metrics(predictions: Mapping, references: Mapping[object, Sequence[str]],
                    metrics: Sequence[str] = tuple(METRICS)) -> dict:
    """pycocoevalcap's BLEU-1..4, METEOR, ROUGE-L, CIDEr and SPICE of ``{image_id: caption}``
    against ``{image_id: [references]}`` (the predicted images only), PTB-tokenized as the
    COCO caption evaluation does; fractions, as pycocoevalcap returns them.

    A metric that cannot be computed (SPICE offline without its CoreNLP jars, METEOR without
    Java, one not in ``metrics``) is None, with the reason under ``unavailable[name]``, logged.
    """
    return evaluate_captions({"": predictions}, references, metrics)[""]


def on_another_image(captions: Mapping, seed: int = 0) -> dict:
    """``{image_id: caption}`` with every caption moved to another image: a seeded cyclic derangement of the ids
    (sorted as strings), so no caption stays on its own image (given two images or more)."""
    ids = sorted(captions, key=str)
    order = random.Random(seed).sample(ids, len(ids))
    return {order[k]: captions[order[k - 1]] for k in range(len(order))}


def another_image_cider(captions_by_model: Mapping[str, Mapping], references: Mapping[object, Sequence[str]],
                        seed: int = 0) -> dict[str, float | None]:
    """The wrong-image control of each caption set: CIDEr-D of its captions scored against the references of
    another image (:func:`on_another_image`), what a set earns without describing the image it is scored on; a
    captioner that reads its image scores far above it. None where CIDEr cannot be computed."""
    moved = {name: on_another_image(c, seed) for name, c in captions_by_model.items()}
    return {name: s["cider"] for name, s in evaluate_captions(moved, references, ["cider"]).items()}
