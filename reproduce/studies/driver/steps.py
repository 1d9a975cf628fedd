"""Steps more than one study runs: repeated words of a captioning run's caption sets (:func:`caption_words`), and
shapes named twice in descriptive captions at each scene's true length (:func:`repetition_step`)."""
from __future__ import annotations

import json
import os
import re

from mdc.eval.metrics import FUNCTION_WORDS


def repetition(texts) -> dict:
    """Mean over ``texts`` of their words, the share of words that repeat an earlier word (as
    ``mdc.eval.metrics.descriptiveness`` counts them) and the share of content words (outside
    ``FUNCTION_WORDS``) that repeat an earlier content word."""
    rows = []
    for text in texts:
        words = re.findall(r"[a-z0-9]+", text.lower())
        content = [w for w in words if w not in FUNCTION_WORDS]
        rows.append((len(words), 1 - len(set(words)) / max(len(words), 1),
                     1 - len(set(content)) / len(content) if content else 0.0))
    return {k: sum(r[i] for r in rows) / max(len(rows), 1) for i, k in
            enumerate(("words", "repeated", "repeated_content"))} | {"captions": len(rows)}


def caption_words(p: dict) -> dict:
    """Repetition (:func:`repetition`) of every caption set of a captioning run and of its test references."""
    with open(os.path.join(p["captioning"], "predictions.json")) as f:
        sets = json.load(f)
    with open(p["captions_json"]) as f:
        images = json.load(f)["images"]
    references = [s["raw"] for im in images if im.get("split") == "test" for s in im["sentences"]]
    return {"sets": {name: repetition(caps.values()) for name, caps in sets.items()},
            "references": repetition(references)}


def repetition_step(p: dict) -> dict:
    """Repetition of descriptive captions at each scene's true length (:mod:`mdc.eval.repetition`)."""
    import mdc
    from mdc.eval.repetition import descriptive_repetition, format_repetition
    from mdc.factory import checkpoint_folder

    out = descriptive_repetition(mdc.load(checkpoint_folder(p["checkpoint"])).eval(), p["n_scenes"], p["seed"])
    print(format_repetition(out))  # the instrument's table with its controls, in the part's log
    return out
