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
import os
import re
import socket
from typing import Mapping, Sequence

logger = logging.getLogger(__name__)

#: pycocoevalcap scorers -> the names they report under.
METRICS = {"bleu": ("bleu1", "bleu2", "bleu3", "bleu4"), "meteor": ("meteor",), "rouge_l": ("rouge_l",),
           "cider": ("cider",), "spice": ("spice",)}
SPICE_DOWNLOAD_TIMEOUT = 60  # seconds per socket operation while SPICE fetches its CoreNLP jars
#: Words that name nothing in an image: articles, conjunctions, prepositions, copulas, pronouns.
FUNCTION_WORDS = frozenset("a an the and or but of on in at to with without from by for as into onto near "
                           "is are was were be been it its this that these those there their his her".split())
#: The keys :func:`descriptiveness` adds to every model's metrics.
DESCRIPTIVENESS = ("words", "content_words", "grounded_words", "repeated")


def _words(text: str) -> list[str]:
    return re.findall(r"[a-z0-9]+", text.lower())


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
    each with its :func:`descriptiveness` (which needs no tokenizer and is always computed)."""
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
