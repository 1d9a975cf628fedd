"""Captions of synthetic scenes: the word lists, the templates and the three caption styles.

Styles:

- ``alt`` (the CC12M analogue): short and partial. It names one to three of the objects, each
  with a random subset of its attributes, sometimes inside web filler ("stock image of",
  "hd wallpaper"), sometimes with an unrelated word, and rarely with a wrong colour.
- ``descriptive`` (the Recap-DataComp analogue): long and complete. The object count, the
  background, every object with all of its attributes, and the relation between each pair of
  consecutively mentioned objects (a chain through all objects). Scenes with four objects name
  objects in relations by their shape only (shapes are unique within a scene) and use the
  shortest relation verbs, which keeps every descriptive caption within 64 tokens.
- ``reference`` (the COCO analogue): one clean sentence naming every object by colour and shape,
  with optional size/texture and relation. ``references`` gives several paraphrases of one
  scene from distinct templates; they serve as captioning references.

Every literal a caption can contain lives in the module-level word lists and templates below,
so :func:`vocabulary` derives the compact vocabulary from them without sampling.
"""
from __future__ import annotations

import re
from functools import lru_cache

from mdc.tokenizer import compact_vocab
from mdc.world.render import BACKGROUNDS, COLOURS, SHAPES, SIZES, TEXTURES

# ----------------------------------------------------------------- word lists (one entry per value)
SIZE_WORDS = {"small": ("small", "little"), "large": ("large", "big")}
TEXTURE_ADJ = {"plain": ("plain", "solid"), "striped": ("striped",), "dotted": ("dotted", "spotted"),
               "checked": ("checked",)}
TEXTURE_WITH = {"plain": "with no pattern", "striped": "with stripes", "dotted": "with dots",
                "checked": "with checks"}
BACKGROUND_WORDS = {"gray": ("gray", "grey"), "white": ("white",), "black": ("black", "dark"),
                    "noisy": ("noisy",), "gradient": ("gradient",)}
COUNT_WORDS = ("one", "two", "three", "four")
RELATIONS = ("left of", "right of", "above", "below")  # canonical names in scene graphs
INVERSE = {"left of": "right of", "right of": "left of", "above": "below", "below": "above"}
REL_VERB = {"left of": ("is left of", "is to the left of"),
            "right of": ("is right of", "is to the right of"),
            "above": ("is above", "is over"), "below": ("is below", "is under")}
REL_PREP = {"left of": ("to the left of", "left of"), "right of": ("to the right of", "right of"),
            "above": ("above",), "below": ("below", "under")}
ALT_REL = {"left of": ("left of", "next to"), "right of": ("right of", "next to"),
           "above": ("above", "over"), "below": ("below", "under")}
REGIONS = {("top", "left"): "in the top left corner", ("top", "center"): "at the top",
           ("top", "right"): "in the top right corner", ("middle", "left"): "on the left",
           ("middle", "center"): "in the center", ("middle", "right"): "on the right",
           ("bottom", "left"): "in the bottom left corner", ("bottom", "center"): "at the bottom",
           ("bottom", "right"): "in the bottom right corner"}
ARTICLES = ("a", "an")
JOINERS = (", ", " and ")
ALT_PREFIXES = ("photo of", "stock image of", "illustration of", "vector illustration of", "close up of",
                "clipart of", "picture of", "icon of")
ALT_SUFFIXES = ("stock photo", "free vector", "hd wallpaper", "royalty free", "isolated",
                "- stock image", "| free download", "for kids")
ALT_JUNK = ("vintage", "abstract", "modern", "minimal", "logo", "pattern", "design", "art", "cute",
            "template", "#design", "#art")
ALT_BACKGROUND = ("on {bg} background", "on a {bg} background")

# ----------------------------------------------------------------------------------- templates
DESCRIPTIVE_ONE = ("a single object on a {bg} background: {objs} {region}.",
                   "a {bg} background with one object: {objs} {region}.",
                   "one object on a {bg} background: {objs} {region}.")
DESCRIPTIVE_MANY = ("{count} objects on a {bg} background: {objs}.",
                    "a {bg} background with {count} objects: {objs}.",
                    "{count} shapes on a {bg} background: {objs}.",
                    "an image of {count} objects on a {bg} background: {objs}.")
DESCRIPTIVE_RELATION = "the {a} {rel} the {b}."
REFERENCE_ONE = ("{objs} on a {bg} background", "{objs} {region}", "there is {objs} on a {bg} background",
                 "a {bg} background with {objs}", "an image of {objs} {region}",
                 "a picture of {objs} on a {bg} background")
REFERENCE_MANY = ("{objs} on a {bg} background", "a {bg} background with {objs}",
                  "{pair}{rest}", "there are {count} shapes: {objs}", "{count} objects, {objs}",
                  "{pair} on a {bg} background{rest}")
REFERENCE_REST = ", with {objs}"
# evaluation-set captions (ARO, SugarCrepe)
ARO_RELATION = "the {a} is {rel} the {b}"
ARO_RELATION_NAMES = {"left of": "to the left of", "right of": "to the right of", "above": "above",
                      "below": "below"}
ARO_ATTRIBUTION = "the {a} and the {b}"
SUGAR_BACKGROUND = "{objs} on a {bg} background"

STYLES = ("alt", "descriptive", "reference")
MAX_OBJECTS = len(COUNT_WORDS)
#: Context lengths (SOT and EOT included) that hold every caption of a style (checked by tests).
MAX_TOKENS = {"alt": 32, "descriptive": 64, "reference": 32}


# ------------------------------------------------------------------------------------- helpers
def pick(rng, options):
    """A uniformly random element of ``options`` (one draw from ``rng``; none for a single option)."""
    return options[int(rng.integers(len(options)))] if len(options) > 1 else options[0]


def with_article(phrase: str) -> str:
    """``a``/``an`` + phrase."""
    return f"{ARTICLES[phrase[0] in 'aeiou']} {phrase}"


def join_list(phrases: list[str]) -> str:
    """``x``, ``x and y``, ``x, y and z``."""
    comma, conjunction = JOINERS
    return phrases[0] if len(phrases) == 1 else comma.join(phrases[:-1]) + conjunction + phrases[-1]


def relation_of(scene: dict, i: int, j: int) -> str:
    """Canonical relation of object ``i`` (subject) to object ``j`` (object)."""
    for rel in scene["relations"]:
        if rel["subject"] == i and rel["object"] == j:
            return rel["relation"]
    raise KeyError((i, j))


def region_of(obj: dict) -> str:
    """Phrase for the third of the image (rows x columns) holding the object's centre."""
    col = ("left", "center", "right")[min(2, int(obj["x"] * 3))]
    row = ("top", "middle", "bottom")[min(2, int(obj["y"] * 3))]
    return REGIONS[(row, col)]


def object_phrase(obj: dict, rng, size=True, texture=True, colour=True, with_form=False) -> str:
    """Noun phrase without article, e.g. ``large striped red circle`` or ``red circle with dots``."""
    words = []
    if size:
        words.append(pick(rng, SIZE_WORDS[obj["size"]]))
    if texture and not with_form:
        words.append(pick(rng, TEXTURE_ADJ[obj["texture"]]))
    if colour:
        words.append(obj["colour"])
    words.append(obj["shape"])
    if texture and with_form:
        words.append(TEXTURE_WITH[obj["texture"]])
    return " ".join(words)


def _background_word(scene, rng) -> str:
    return pick(rng, BACKGROUND_WORDS[scene["background"]["kind"]])


# -------------------------------------------------------------------------------------- styles
def _alt(scene: dict, rng) -> str:
    objs = scene["objects"]
    k = min(len(objs), int(rng.choice([1, 2, 3], p=[0.55, 0.35, 0.10])))
    chosen = rng.permutation(len(objs))[:k].tolist()
    phrases = []
    for i in chosen:
        o = dict(objs[i])
        if rng.random() < 0.05:  # label noise: a wrong colour
            o["colour"] = pick(rng, [c for c in COLOURS if c != o["colour"]])
        p = object_phrase(o, rng, size=rng.random() < 0.25, texture=rng.random() < 0.25,
                          colour=rng.random() < 0.7)
        phrases.append(with_article(p) if rng.random() < 0.5 else p)
    if k == 2 and rng.random() < 0.35:
        body = f"{phrases[0]} {pick(rng, ALT_REL[relation_of(scene, *chosen)])} {phrases[1]}"
    else:
        body = join_list(phrases)
    if rng.random() < 0.35:
        body = f"{pick(rng, ALT_PREFIXES)} {body}"
    if rng.random() < 0.2:
        body += " " + pick(rng, ALT_BACKGROUND).format(bg=_background_word(scene, rng))
    if rng.random() < 0.15:
        body += " " + pick(rng, ALT_SUFFIXES)
    if rng.random() < 0.1:
        junk = pick(rng, ALT_JUNK)
        body = f"{junk} {body}" if rng.random() < 0.5 else f"{body} {junk}"
    return body


def descriptive_plan(scene: dict, rng) -> dict:
    """Every random choice of the scene's descriptive caption, as data :func:`render_descriptive`
    writes out: ``words`` [n] per object its size, texture and colour words and its shape, ``order``
    the listing order, ``relations`` [(subject, verb, object)] (object indices), ``short`` whether
    relations name objects by shape only. Editing the plan's words edits every mention at once."""
    objs = scene["objects"]
    order = rng.permutation(len(objs)).tolist()
    words = [None] * len(objs)
    for i in order:
        o = objs[i]
        words[i] = {"size": pick(rng, SIZE_WORDS[o["size"]]), "texture": pick(rng, TEXTURE_ADJ[o["texture"]]),
                    "colour": o["colour"], "shape": o["shape"]}
    plan = {"words": words, "order": order, "bg": _background_word(scene, rng), "relations": [], "short": True}
    if len(objs) == 1:
        plan |= {"template": pick(rng, DESCRIPTIVE_ONE), "region": region_of(objs[0])}
        return plan
    plan |= {"template": pick(rng, DESCRIPTIVE_MANY), "count": COUNT_WORDS[len(objs) - 1]}
    compact = len(objs) == MAX_OBJECTS  # shape-only names and the shortest verbs: fits 64 tokens
    plan["short"] = compact or rng.random() < 0.5  # refer by shape only (unique within a scene)
    for a, b in zip(order[:-1], order[1:]):
        if rng.random() < 0.5:
            a, b = b, a
        verbs = REL_VERB[relation_of(scene, a, b)]
        plan["relations"].append((a, verbs[0] if compact else pick(rng, verbs), b))
    return plan


def render_descriptive(plan: dict) -> str:
    """The descriptive caption a :func:`descriptive_plan` spells (its words as they stand)."""
    w = plan["words"]
    listed = join_list([with_article(" ".join(w[i][k] for k in ("size", "texture", "colour", "shape")))
                        for i in plan["order"]])
    if "region" in plan:
        return plan["template"].format(bg=plan["bg"], objs=listed, region=plan["region"])
    text = [plan["template"].format(count=plan["count"], bg=plan["bg"], objs=listed)]
    name = (lambda i: w[i]["shape"]) if plan["short"] else (lambda i: f"{w[i]['colour']} {w[i]['shape']}")
    text += [DESCRIPTIVE_RELATION.format(a=name(a), rel=rel, b=name(b)) for a, rel, b in plan["relations"]]
    return " ".join(text)


def _descriptive(scene: dict, rng) -> str:
    return render_descriptive(descriptive_plan(scene, rng))


def _reference(scene: dict, rng, template: str) -> str:
    objs = scene["objects"]
    order = rng.permutation(len(objs)).tolist()
    phrases = [with_article(object_phrase(objs[i], rng, size=rng.random() < 0.3, texture=rng.random() < 0.3,
                                          with_form=rng.random() < 0.5)) for i in order]
    fields = {"objs": join_list(phrases), "bg": _background_word(scene, rng),
              "count": COUNT_WORDS[len(objs) - 1], "region": region_of(objs[0])}
    if len(objs) > 1:
        rel = pick(rng, REL_PREP[relation_of(scene, order[0], order[1])])
        fields["pair"] = f"{phrases[0]} {rel} {phrases[1]}"
        fields["rest"] = REFERENCE_REST.format(objs=join_list(phrases[2:])) if len(objs) > 2 else ""
    return template.format(**fields)


def caption(scene: dict, style: str, rng) -> str:
    """One caption of ``scene`` in ``style`` (``alt``, ``descriptive`` or ``reference``)."""
    if style == "alt":
        return _alt(scene, rng)
    if style == "descriptive":
        return _descriptive(scene, rng)
    if style == "reference":
        return _reference(scene, rng, pick(rng, _reference_templates(scene)))
    raise ValueError(f"unknown caption style {style!r}; expected one of {STYLES}")


def _reference_templates(scene: dict) -> tuple[str, ...]:
    return REFERENCE_ONE if len(scene["objects"]) == 1 else REFERENCE_MANY


def references(scene: dict, rng, k: int = 5) -> list[str]:
    """``k`` paraphrased reference captions of ``scene``, each from a different template."""
    templates = _reference_templates(scene)
    if not 1 <= k <= len(templates):
        raise ValueError(f"k must be in [1, {len(templates)}]; got {k}")
    return [_reference(scene, rng, templates[t]) for t in rng.permutation(len(templates))[:k]]


def word_tokens(text: str) -> list[str]:
    """Lower-case word tokens without punctuation (the Karpathy split's ``tokens`` field)."""
    return re.findall(r"[a-z0-9]+", text.lower())


# ---------------------------------------------------------------------------------- vocabulary
def _fragments() -> list[str]:
    """Every literal a caption can contain: attribute values, word lists and templates."""
    out = [*SHAPES, *COLOURS, *SIZES, *TEXTURES, *BACKGROUNDS, *COUNT_WORDS, *RELATIONS, *ARTICLES,
           *JOINERS, *ALT_PREFIXES, *ALT_SUFFIXES, *ALT_JUNK, *ALT_BACKGROUND, *REGIONS.values(),
           *TEXTURE_WITH.values(), *ARO_RELATION_NAMES.values(), *DESCRIPTIVE_ONE, *DESCRIPTIVE_MANY,
           DESCRIPTIVE_RELATION, *REFERENCE_ONE, *REFERENCE_MANY, REFERENCE_REST, ARO_RELATION,
           ARO_ATTRIBUTION, SUGAR_BACKGROUND]
    for table in (SIZE_WORDS, TEXTURE_ADJ, BACKGROUND_WORDS, REL_VERB, REL_PREP, ALT_REL):
        for words in table.values():
            out.extend(words)
    return [re.sub(r"\{\w+\}", " ", s) for s in out]


@lru_cache(maxsize=1)
def vocabulary() -> tuple[int, ...]:
    """Sorted CLIP BPE ids of every word and punctuation mark the world can emit (SOT/EOT included)."""
    return compact_vocab(_fragments())
