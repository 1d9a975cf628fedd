"""Compositionality benchmarks as published: SugarCrepe, ARO (VG-Relation, VG-Attribution,
COCO-Order, Flickr30k-Order), with their accuracy rules.

Tie rules, each benchmark's own, stated once here (:data:`TIES_WIN`, :func:`correct_and_ties`;
:mod:`mdc.eval.accuracy` uses them): SugarCrepe counts ``pos_score > neg_score`` (a tie is an error);
ARO takes ``np.argmax`` over the candidates, which returns the first maximum, so VG-Relation and
VG-Attribution (false caption listed first, correct = argmax == 1) count a tie as an error and
COCO/Flickr30k-Order (true caption first, correct = argmax == 0) count a tie as correct.

Items are dicts with ``image_path`` (and ``bbox`` for ARO's VG sets); open images with
``mdc.data.formats.load_image``. Missing fields raise ValueError naming file, item and field;
missing images raise too, or with ``on_missing="skip"`` drop the item (see
:class:`mdc.data.formats.Items`: ``total`` and ``missing`` say how many were evaluated).
"""
from __future__ import annotations

import os
import re
import warnings
from typing import Sequence

import numpy as np

from mdc.data.formats import ImageLookup, Items, read_json, require
from mdc.data.tagger import SPACY_MODEL, resolve_tagger, split_caption, tag_caption, word_classes

# ------------------------------------------------------------------------------ tie rules
TIES_WIN = ("aro_coco_order", "aro_flickr30k_order")  # ARO: true caption first, argmax takes the first maximum


def correct_and_ties(scores: np.ndarray, identical: np.ndarray | None = None,
                     ties_win: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """Per item [N]: whether the true caption (column 0 of ``scores`` [N, K]) wins, and whether the
    item is decided by a tie (its true caption equals its best competitor's score, none higher).
    ``ties_win`` (ARO's order tasks, :data:`TIES_WIN`): true >= every competitor wins; else (SugarCrepe,
    VG-Relation, VG-Attribution) true > every competitor. ``identical`` [N, K] marks candidates that
    are the true caption's very string: not competitors."""
    true, others = scores[:, :1], scores[:, 1:]  # [N, 1], [N, K-1]
    same = np.zeros_like(others, dtype=bool) if identical is None else identical[:, 1:]
    strict = ((true > others) | same).all(1)
    weak = ((true >= others) | same).all(1)
    return (weak if ties_win else strict), weak & ~strict


# ------------------------------------------------------------------------------ SugarCrepe
SUGARCREPE_SUBSETS = ("add_att", "add_obj", "replace_att", "replace_obj", "replace_rel", "swap_att", "swap_obj")
SUGARCREPE_COLUMNS = {"add": ("add_att", "add_obj"),
                      "replace": ("replace_att", "replace_obj", "replace_rel"),
                      "swap": ("swap_att", "swap_obj")}


def load_sugarcrepe(root_json_dir: str, image_dir: str, subsets: Sequence[str] = SUGARCREPE_SUBSETS,
                    on_missing: str = "error") -> dict[str, Items]:
    """``{subset: [{id, image_path, caption, negative_caption}]}`` from ``<subset>.json`` files,
    each ``{"<idx>": {"filename", "caption", "negative_caption"}}``; images are COCO val2017."""
    out = {}
    for subset in subsets:
        path = os.path.join(root_json_dir, f"{subset}.json")
        data = read_json(path, root=dict)
        lookup = ImageLookup(image_dir, path, on_missing)
        items = []
        for key, record in data.items():
            require(record, ["filename", "caption", "negative_caption"], path, key)
            image = lookup(record["filename"], key)
            if image is not None:
                items.append({"id": key, "image_path": image, "caption": record["caption"],
                              "negative_caption": record["negative_caption"]})
        out[subset] = lookup.items(items, len(data))
    return out


# ------------------------------------------------------------------------------ ARO: VG
# The relations ARO's published evaluation (the VG-Relation notebook of
# mertyg/vision-language-models-are-bows) drops before macro-averaging VG-Relation:
# relations whose swapped caption is not necessarily false.
ARO_SYMMETRIC_RELATIONS = frozenset([
    "adjusting", "attached to", "between", "bigger than", "biting", "boarding", "brushing", "chewing",
    "cleaning", "climbing", "close to", "coming from", "coming out of", "contain", "crossing", "dragging",
    "draped over", "drinking", "drinking from", "driving", "driving down", "driving on", "eating from",
    "eating in", "enclosing", "exiting", "facing", "filled with", "floating in", "floating on", "flying",
    "flying above", "flying in", "flying over", "flying through", "full of", "going down", "going into",
    "going through", "grazing in", "growing in", "growing on", "guiding", "hanging from", "hanging in",
    "hanging off", "hanging over", "higher than", "holding onto", "hugging", "in between", "jumping off",
    "jumping on", "jumping over", "kept in", "larger than", "leading", "leaning over", "leaving", "licking",
    "longer than", "looking in", "looking into", "looking out", "looking over", "looking through",
    "lying next to", "lying on top of", "making", "mixed with", "mounted on", "moving", "on the back of",
    "on the edge of", "on the front of", "on the other side of", "opening", "painted on", "parked at",
    "parked beside", "parked by", "parked in", "parked in front of", "parked near", "parked next to",
    "perched on", "petting", "piled on", "playing", "playing in", "playing on", "playing with", "pouring",
    "reaching for", "reading", "reflected on", "riding on", "running in", "running on", "running through",
    "seen through", "sitting behind", "sitting beside", "sitting by", "sitting in front of", "sitting near",
    "sitting next to", "sitting under", "skiing down", "skiing on", "sleeping in", "sleeping on",
    "smiling at", "sniffing", "splashing", "sprinkled on", "stacked on", "standing against",
    "standing around", "standing behind", "standing beside", "standing in front of", "standing near",
    "standing next to", "staring at", "stuck in", "surrounding", "swimming in", "swinging", "talking to",
    "topped with", "touching", "traveling down", "traveling on", "tying", "typing on", "underneath",
    "wading in", "waiting for", "walking across", "walking by", "walking down", "walking next to",
    "walking through", "working in", "working on", "worn on", "wrapped around", "wrapped in",
    "by", "of", "near", "next to", "with", "beside", "on the side of", "around",
])
VG_FIELDS = ("image_path", "bbox_x", "bbox_y", "bbox_w", "bbox_h", "true_caption", "false_caption")


def _load_vg(json_path: str, image_dir: str, label_field: str, on_missing: str) -> Items:
    data = read_json(json_path, root=list)
    lookup = ImageLookup(image_dir, json_path, on_missing)
    items = []
    for index, record in enumerate(data):
        require(record, (*VG_FIELDS, label_field), json_path, index)
        image = lookup(record["image_path"], index)
        if image is not None:
            items.append({"id": index, "image_path": image, "bbox": tuple(record[f"bbox_{k}"] for k in "xywh"),
                          "true_caption": record["true_caption"], "false_caption": record["false_caption"],
                          label_field: record[label_field]})
    return lookup.items(items, len(data))


def load_vg_relation(json_path: str, image_dir: str, on_missing: str = "error") -> Items:
    """``visual_genome_relation.json`` -> ``[{id, image_path, bbox, true_caption, false_caption,
    relation_name}]``; ``load_image(item)`` crops to ``bbox`` = (x, y, w, h)."""
    return _load_vg(json_path, image_dir, "relation_name", on_missing)


def load_vg_attribution(json_path: str, image_dir: str, on_missing: str = "error") -> Items:
    """``visual_genome_attribution.json`` -> ``[{id, image_path, bbox, true_caption,
    false_caption, attributes}]`` (``attributes``: the two swapped attributes)."""
    return _load_vg(json_path, image_dir, "attributes", on_missing)


def _macro(groups: Sequence, correct: Sequence[bool], min_count: int) -> tuple[float, dict]:
    correct = np.asarray(correct, dtype=bool)
    if len(groups) != len(correct):
        raise ValueError(f"{len(groups)} items but {len(correct)} correctness flags")
    per_group = {}
    for g in sorted(set(groups)):
        mask = np.array([x == g for x in groups])
        if mask.sum() >= min_count:
            per_group[g] = float(correct[mask].mean())
    return (float(np.mean(list(per_group.values()))) if per_group else float("nan")), per_group


def vg_relation_accuracy(items: Sequence[dict], correct: Sequence[bool]) -> tuple[float, dict[str, float]]:
    """ARO's VG-Relation number: mean over relations of per-relation accuracy, relations in
    ``ARO_SYMMETRIC_RELATIONS`` excluded. Returns (macro accuracy, {relation: accuracy})."""
    keep = [i for i, item in enumerate(items) if item["relation_name"] not in ARO_SYMMETRIC_RELATIONS]
    flags = np.asarray(correct, dtype=bool)
    if len(items) != len(flags):
        raise ValueError(f"{len(items)} items but {len(flags)} correctness flags")
    return _macro([items[i]["relation_name"] for i in keep], flags[keep], min_count=1)


def vg_attribution_accuracy(items: Sequence[dict], correct: Sequence[bool],
                            min_count: int = 25) -> tuple[float, dict[str, float]]:
    """ARO's VG-Attribution number: mean over attribute pairs (``"a_b"`` from ``attributes``)
    of per-pair accuracy, pairs with fewer than ``min_count`` items dropped (ARO uses 25).
    Returns (macro accuracy, {pair: accuracy})."""
    return _macro([f"{item['attributes'][0]}_{item['attributes'][1]}" for item in items], correct, min_count)


# ------------------------------------------------------------------------------ ARO: Order
PERTURBATIONS = ("shuffle_nouns_and_adj", "shuffle_allbut_nouns_and_adj", "shuffle_within_trigrams",
                 "shuffle_trigrams")


def aro_caption(text: str, max_words: int = 30) -> str:
    """ARO's caption normalisation, of the true caption and of every perturbation (its ``pre_caption``):
    lowercase; the characters . ! " ( ) * # : ; ~ become spaces; runs of whitespace one space; the
    ends stripped; the first ``max_words`` space-separated words. Commas, apostrophes, hyphens and
    slashes stay, so "A man, wearing a T-shirt." is "a man, wearing a t-shirt"."""
    text = re.sub(r"\s{2,}", " ", re.sub(r'[.!"()*#:;~]', " ", text.lower())).rstrip("\n").strip(" ")
    return " ".join(text.split(" ")[:max_words])


def same_caption(a: str, b: str) -> bool:
    """The same words and punctuation marks in the same order, whatever the spacing between them
    ("a dog, sleeping" and "a dog , sleeping"): one caption to a tokenizer that splits punctuation
    off, as CLIP's BPE does."""
    return re.findall(r"\w+|[^\w\s]", a) == re.findall(r"\w+|[^\w\s]", b)


def _trigrams(words: list[str]) -> list[list[str]]:
    return [words[i:i + 3] for i in range(0, len(words), 3)]


def _class_shuffles(words: list[str], classes: list[str], rng: np.random.Generator) -> list[list[str]]:
    """ARO's first two perturbations: nouns among nouns and adjectives among adjectives; the rest among itself."""
    out = []
    shuffled = list(words)
    for cls in ("noun", "adj"):
        idx = [i for i, c in enumerate(classes) if c == cls]
        for i, j in zip(idx, rng.permutation(idx)):
            shuffled[i] = words[j]
    out.append(shuffled)
    shuffled = list(words)
    idx = [i for i, c in enumerate(classes) if c == "other"]
    for i, j in zip(idx, rng.permutation(idx)):
        shuffled[i] = words[j]
    out.append(shuffled)
    return out


def _trigram_shuffles(words: list[str], rng: np.random.Generator) -> list[list[str]]:
    """ARO's last two perturbations: the words inside each consecutive trigram; the trigrams' order."""
    trigrams = _trigrams(words)
    return [[w for tri in trigrams for w in rng.permutation(tri).tolist()],
            [w for k in rng.permutation(len(trigrams)) for w in trigrams[k]]]


def perturb_caption(words: Sequence[str], rng: np.random.Generator,
                    classes: Sequence[str] | None = None) -> list[list[str]]:
    """ARO's four order perturbations of a word list, in ``PERTURBATIONS`` order; each is a
    permutation of ``words``: nouns shuffled among nouns and adjectives among adjectives;
    all other words shuffled among themselves; words shuffled inside each consecutive
    trigram; the trigrams' order shuffled. ``classes``: 'noun' | 'adj' | 'other' per word
    (default: :func:`word_classes` with ``tagger="auto"``)."""
    words = list(words)
    classes = word_classes(words) if classes is None else list(classes)
    if len(classes) != len(words):
        raise ValueError(f"got {len(classes)} word classes for {len(words)} words")
    return _class_shuffles(words, classes, rng) + _trigram_shuffles(words, rng)


def order_perturbations(caption: str, rng: np.random.Generator, tagger: str = "auto",
                        max_words: int = 30) -> tuple[str, list[str]]:
    """ARO's COCO/Flickr30k-Order candidates of one raw caption: (true caption, [4 perturbations]).

    As ARO builds them: the noun/adjective and the other-word shuffles permute the raw caption's
    tokens as spaCy tokenises and tags it (:func:`mdc.data.tagger.tag_caption`: case kept for the
    tagger, punctuation marks and clitics such as 's tokens of their own, hyphens split off); the
    trigram shuffles permute its ``nltk.word_tokenize``-style tokens (:func:`split_caption` with
    ``hyphens=False``: "t-shirt" whole). Each shuffle is joined with spaces and then normalised and
    truncated like the true caption (:func:`aro_caption`), so a perturbation holds the raw caption's
    words and punctuation less ARO's dropped characters (up to truncation: ARO truncates after
    shuffling, and counts a spaced-out comma as a word)."""
    tokens, classes = tag_caption(caption, tagger)
    shuffles = _class_shuffles(tokens, classes, rng) + _trigram_shuffles(split_caption(caption, hyphens=False), rng)
    return aro_caption(caption, max_words), [aro_caption(" ".join(s), max_words) for s in shuffles]


def load_order_suite(karpathy_test_json: str, image_dir: str | None, seed: int = 0, max_words: int = 30,
                     on_missing: str = "error", tagger: str = "auto") -> Items:
    """COCO-Order / Flickr30k-Order from ARO's Karpathy test file (``[{image, caption: [5]}]``).

    One item per caption: ``{id, image_path, caption, perturbed: [4 captions], identical:
    [4 bools]}``, built from the raw caption as ARO builds them (:func:`order_perturbations`): the
    perturbations shuffle the raw caption's tokens, then the true caption and each perturbation are
    normalised as ARO normalises them (:func:`aro_caption`: lowercase, . ! " ( ) * # : ; ~ dropped,
    commas and apostrophes kept, ``max_words`` = 30 words). Randomness is seeded per caption from
    (seed, image index, caption index): the suite does not depend on iteration order.

    Tokens, nouns and adjectives come from :func:`mdc.data.tagger.tag_caption` (``tagger``): spaCy's
    ``en_core_web_sm`` tokens and tags, as ARO, when installed (``pip install spacy && python -m spacy
    download en_core_web_sm``; "auto" uses it when it imports), else the built-in tokenizer and tagger
    (:func:`mdc.data.tagger.token_classes`; "auto" warns), which agree with spaCy on most but not all
    words, so the first two perturbations then differ somewhat from ARO's. The returned
    :class:`Items` has ``tagger`` ("spacy" or "builtin").
    ``identical[k]`` flags a perturbation that is the true caption (short captions), whatever its
    spacing around punctuation (:func:`same_caption`: "a dog , sleeping" is "a dog, sleeping").
    ``image_dir=None`` builds the captions without looking for images (``image_path`` None);
    ``total`` counts captions, and a missing image (``on_missing="skip"``) drops all of its captions.
    """
    used = resolve_tagger(tagger)
    if used == "builtin" and tagger == "auto":
        warnings.warn(f"{karpathy_test_json}: spaCy's {SPACY_MODEL} is not installed; tagging nouns and "
                      f"adjectives with the built-in tagger, an approximation of ARO's (pip install spacy && "
                      f"python -m spacy download {SPACY_MODEL} for ARO's exact perturbations)", stacklevel=2)
    data = read_json(karpathy_test_json, root=list)
    lookup = ImageLookup(image_dir or "", karpathy_test_json, on_missing)
    items, total = [], 0
    for index, record in enumerate(data):
        require(record, ["image", "caption"], karpathy_test_json, index)
        captions = [record["caption"]] if isinstance(record["caption"], str) else record["caption"]
        total += len(captions)
        path = lookup(record["image"], index) if image_dir is not None else None
        if path is None and image_dir is not None:
            continue
        for c, caption in enumerate(captions):
            true, perturbed = order_perturbations(caption, np.random.default_rng((seed, index, c)), used, max_words)
            items.append({"id": f"{index}.{c}", "image_path": path, "caption": true, "perturbed": perturbed,
                          "identical": [same_caption(p, true) for p in perturbed]})
    out = lookup.items(items, total)
    out.tagger = used
    return out

