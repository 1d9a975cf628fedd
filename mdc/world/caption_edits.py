"""Compositionality suites in the language the models learned: each scene's own descriptive caption,
edited into its negative the way SugarCrepe edits COCO captions and ARO swaps inside a caption.

The template suites of :mod:`mdc.world.evalsets` write their items in phrasings no descriptive model
saw in training ("the red circle is to the left of the blue square"). Here the positive is the scene's
caption in the ``descriptive`` style, drawn exactly as a training caption is
(:func:`mdc.world.text.descriptive_plan`), and the negative is that caption with one edit made to the
plan's words, so every mention changes together (a colour appears in the object list and, in the
long form, in the relation sentences too) and no negative contradicts itself:

- ``relation`` (VG-Relation): subject and object of one relation sentence swapped (equal length);
- ``attribute`` (VG-Attribution): two objects' sizes, or else textures (whichever differ; colours
  when neither does) swapped, every mention (equal length);
- ``replace_att`` / ``replace_obj``: one object's colour / shape replaced by one absent from the scene
  (equal length); ``replace_rel``: one relation sentence's verb replaced by a relation false in sign
  (a verb of equal length when there is one);
- ``swap_att`` / ``swap_obj``: two objects' colours / shapes swapped, every mention (equal length);
- ``add_att``: an absent colour added to one shape-only mention of a relation sentence (the caption's
  shape-only form, one of the two forms training uses); ``add_obj``: an object of absent colour and
  shape added to the object list, the count word raised with it.

Scenes have 2 or 3 objects (shapes and colours are unique within a scene), so every caption, the
added object included, fits the descriptive style's 64 tokens. Randomness: scene ``i`` from stream
``STREAM_OWN``, its caption from ``STREAM_OWN + 1`` and sub-task ``k``'s edit from ``STREAM_OWN + 2 + k``
(:mod:`mdc.world.streams`). Layout under ``out`` (the formats of the template suites, read by
:func:`mdc.eval.suites.load_suites` as the ``own_*`` suites)::

    own/visual_genome_relation.json, own/visual_genome_attribution.json   ARO; paths relative to own/
    own/sugarcrepe/{add_att,...,swap_obj}.json                               filenames relative to own/images/
    own/images/*.png
"""
from __future__ import annotations

import copy
import json
import os

from mdc.world.render import COLOURS, SHAPES, render
from mdc.data.writer import png_bytes
from mdc.world.scenes import sample_scene
from mdc.world.streams import STREAM_OWN, stream_rng
from mdc.world.text import (COUNT_WORDS, DESCRIPTIVE_RELATION, REL_VERB, RELATIONS, SIZE_WORDS, TEXTURE_ADJ,
                            descriptive_plan, pick, relation_of, render_descriptive)

OWN_SUGARCREPE = ("add_att", "add_obj", "replace_att", "replace_obj", "replace_rel", "swap_att", "swap_obj")
EDITS = ("relation", "attribute", *OWN_SUGARCREPE)  # sub-task k draws its edits from STREAM_OWN + 2 + k
OWN_OBJECTS = (2, 3)


def _two(plan: dict, rng) -> tuple[int, int]:
    """Two distinct objects of the scene (indices)."""
    i, j = rng.permutation(len(plan["words"]))[:2].tolist()
    return i, j


def _swap(plan: dict, i: int, j: int, kind: str) -> dict:
    """The plan with objects ``i`` and ``j``'s ``kind`` words swapped (every mention)."""
    out = copy.deepcopy(plan)
    out["words"][i][kind], out["words"][j][kind] = plan["words"][j][kind], plan["words"][i][kind]
    return out


def _absent(scene: dict, kind: str, rng) -> str:
    present = {o[kind] for o in scene["objects"]}
    return pick(rng, [v for v in (SHAPES if kind == "shape" else COLOURS) if v not in present])


def _relation_edit(scene: dict, plan: dict, rng, replace: bool) -> tuple[dict, str]:
    """One relation sentence with subject and object swapped, or (``replace``) its verb replaced by one of
    a relation false in sign on its axis; and the sentence's canonical relation."""
    r = int(rng.integers(len(plan["relations"])))
    a, verb, b = plan["relations"][r]
    true = relation_of(scene, a, b)
    out = copy.deepcopy(plan)
    if not replace:
        out["relations"][r] = (b, verb, a)
        return out, true
    oa, ob = scene["objects"][a], scene["objects"][b]
    holds = {"left of" if oa["x"] < ob["x"] else "right of", "above" if oa["y"] < ob["y"] else "below"}
    verbs = [v for rel in RELATIONS if rel not in holds for v in REL_VERB[rel]]
    same = [v for v in verbs if len(v.split()) == len(verb.split())]
    out["relations"][r] = (a, pick(rng, same or verbs), b)
    return out, true


def _attribute(plan: dict, scene: dict, rng) -> tuple[dict, list[str]]:
    """Two objects' sizes or textures (those that differ; colours when neither does) swapped."""
    i, j = _two(plan, rng)
    oi, oj = scene["objects"][i], scene["objects"][j]
    kinds = [k for k in ("size", "texture") if oi[k] != oj[k]] or ["colour"]
    kind = pick(rng, kinds)
    return _swap(plan, i, j, kind), [plan["words"][i][kind], plan["words"][j][kind]]


def _add_att(scene: dict, plan: dict, rng) -> tuple[str, str]:
    """(caption in its shape-only form, the same with an absent colour before one relation mention)."""
    plan = {**plan, "short": True}
    pos = render_descriptive(plan)
    a, verb, b = plan["relations"][int(rng.integers(len(plan["relations"])))]
    w, colour = plan["words"], _absent(scene, "colour", rng)
    sentence = DESCRIPTIVE_RELATION.format(a=w[a]["shape"], rel=verb, b=w[b]["shape"])
    na, nb = (f"{colour} {w[a]['shape']}", w[b]["shape"]) if rng.random() < 0.5 else \
        (w[a]["shape"], f"{colour} {w[b]['shape']}")
    return pos, pos.replace(sentence, DESCRIPTIVE_RELATION.format(a=na, rel=verb, b=nb), 1)


def _add_obj(scene: dict, plan: dict, rng) -> dict:
    """The plan with an object of absent colour and shape listed at a random place, the count raised."""
    out = copy.deepcopy(plan)
    size, texture = pick(rng, list(SIZE_WORDS)), pick(rng, list(TEXTURE_ADJ))
    out["words"].append({"size": pick(rng, SIZE_WORDS[size]), "texture": pick(rng, TEXTURE_ADJ[texture]),
                         "colour": _absent(scene, "colour", rng), "shape": _absent(scene, "shape", rng)})
    out["order"].insert(int(rng.integers(len(plan["order"]) + 1)), len(plan["words"]))
    out["count"] = COUNT_WORDS[len(out["words"]) - 1]
    return out


def edit(kind: str, scene: dict, plan: dict, rng) -> tuple[str, str, dict]:
    """(caption, negative caption, extra fields of the item) of sub-task ``kind`` (:data:`EDITS`)."""
    pos = render_descriptive(plan)
    if kind in ("relation", "replace_rel"):
        neg, rel = _relation_edit(scene, plan, rng, replace=kind == "replace_rel")
        return pos, render_descriptive(neg), {"relation_name": rel}
    if kind == "attribute":
        neg, words = _attribute(plan, scene, rng)
        return pos, render_descriptive(neg), {"attributes": words}
    if kind in ("replace_att", "replace_obj"):
        k = "colour" if kind == "replace_att" else "shape"
        neg = copy.deepcopy(plan)
        neg["words"][int(rng.integers(len(plan["words"])))][k] = _absent(scene, k, rng)
        return pos, render_descriptive(neg), {}
    if kind in ("swap_att", "swap_obj"):
        return pos, render_descriptive(_swap(plan, *_two(plan, rng), "colour" if kind == "swap_att" else "shape")), {}
    if kind == "add_att":
        return (*_add_att(scene, plan, rng), {})
    if kind == "add_obj":
        return pos, render_descriptive(_add_obj(scene, plan, rng)), {}
    raise ValueError(f"unknown edit {kind!r}; expected one of {EDITS}")


def own_items(seed: int, n: int) -> tuple[list[dict], dict[str, list[tuple[str, str, dict]]]]:
    """The ``n`` scenes and, per sub-task of :data:`EDITS`, its ``n`` (caption, negative, extra) items."""
    scenes = []
    for i in range(n):
        rng = stream_rng(seed, STREAM_OWN, i)
        scenes.append(sample_scene(rng, n_objects=int(rng.choice(OWN_OBJECTS))))
    plans = [descriptive_plan(s, stream_rng(seed, STREAM_OWN + 1, i)) for i, s in enumerate(scenes)]
    items = {kind: [edit(kind, s, p, stream_rng(seed, STREAM_OWN + 2 + k, i))
                    for i, (s, p) in enumerate(zip(scenes, plans))] for k, kind in enumerate(EDITS)}
    return scenes, items


def _dump(path: str, obj) -> None:
    with open(path, "w") as f:
        json.dump(obj, f, indent=1)


def write_own_suites(out: str, seed: int, n: int, image_size: int = 64) -> dict:
    """Write the in-distribution suites under ``out/own`` (module docstring); returns their sizes."""
    root = os.path.join(out, "own")
    os.makedirs(os.path.join(root, "images"), exist_ok=True)
    os.makedirs(os.path.join(root, "sugarcrepe"), exist_ok=True)
    scenes, items = own_items(seed, n)
    for i, scene in enumerate(scenes):
        with open(os.path.join(root, "images", f"{i:06d}.png"), "wb") as f:
            f.write(png_bytes(render(scene, image_size)))
    box = lambda i: {"image_id": i, "image_path": f"images/{i:06d}.png", "bbox_x": 0, "bbox_y": 0,  # noqa: E731
                     "bbox_w": image_size, "bbox_h": image_size}
    for kind, file in (("relation", "visual_genome_relation.json"), ("attribute", "visual_genome_attribution.json")):
        _dump(os.path.join(root, file), [{**box(i), "true_caption": pos, "false_caption": neg, **extra}
                                         for i, (pos, neg, extra) in enumerate(items[kind])])
    for kind in OWN_SUGARCREPE:
        _dump(os.path.join(root, "sugarcrepe", f"{kind}.json"),
              {str(i): {"filename": f"{i:06d}.png", "caption": pos, "negative_caption": neg}
               for i, (pos, neg, _) in enumerate(items[kind])})
    return {**{kind: n for kind in EDITS}, "chance": 0.5, "style": "descriptive"}
