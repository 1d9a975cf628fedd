"""The in-distribution suites: each scene's own descriptive caption, edited into a false negative."""
from __future__ import annotations

import json
import os
import re

import numpy as np
import pytest

from mdc import get_tokenizer
from mdc.eval.suites import OWN_SUITES, load_suites
from mdc.world import caption_edits as E
from mdc.world.render import COLOURS, SHAPES
from mdc.world.scenes import sample_scene
from mdc.world.text import MAX_TOKENS, REL_VERB, SIZE_WORDS, TEXTURE_ADJ, caption, descriptive_plan, relation_of, render_descriptive

N = 120


@pytest.fixture(scope="module")
def items():
    return E.own_items(seed=3, n=N)


def test_the_plan_spells_the_training_caption_exactly():
    """descriptive_plan + render_descriptive is the descriptive style itself: same text, same draws after."""
    for i in range(300):
        rng_a, rng_b = np.random.default_rng([7, i]), np.random.default_rng([7, i])
        scene = sample_scene(np.random.default_rng([8, i]), n_objects=1 + i % 4)
        assert render_descriptive(descriptive_plan(scene, rng_a)) == caption(scene, "descriptive", rng_b)
        assert rng_a.random() == rng_b.random()


def test_positives_are_the_scenes_own_captions(items):
    scenes, by_kind = items
    for kind, rows in by_kind.items():
        for i, (pos, neg, _) in enumerate(rows):
            if kind != "add_att":  # add_att uses the caption's shape-only form, also a training form
                assert pos == caption(scenes[i], "descriptive", np.random.default_rng([3, E.STREAM_OWN + 1, i]))
            assert pos != neg


def _words(text):
    return re.findall(r"[a-z]+", text)


@pytest.mark.parametrize("kind", ["relation", "attribute", "replace_att", "replace_obj", "swap_att", "swap_obj"])
def test_equal_length_edits_keep_the_word_count(items, kind):
    for pos, neg, _ in items[1][kind]:
        assert len(_words(pos)) == len(_words(neg)), (pos, neg)


def test_swaps_exchange_every_mention(items):
    """A swap changes attribute words only, and every mention: in the negative each shape keeps one
    colour throughout (no self-contradiction), and for colour and shape swaps that colour is wrong."""
    scenes, by_kind = items
    attribute_words = {*COLOURS, *SHAPES, *(w for ws in SIZE_WORDS.values() for w in ws),
                       *(w for ws in TEXTURE_ADJ.values() for w in ws)}
    pairs = lambda t: re.findall(rf"\b({'|'.join(COLOURS)}) ({'|'.join(SHAPES)})\b", t)  # noqa: E731
    for kind in ("swap_att", "swap_obj", "relation", "attribute"):
        for i, (pos, neg, extra) in enumerate(by_kind[kind]):
            changed = {a for a, b in zip(_words(pos), _words(neg)) if a != b}
            assert changed and changed <= attribute_words, (pos, neg)
            colour_of = {}
            for colour, shape in pairs(neg):
                assert colour_of.setdefault(shape, colour) == colour, neg  # one colour per shape throughout
            truth = {(o["colour"], o["shape"]) for o in scenes[i]["objects"]}
            if kind in ("swap_att", "swap_obj") or extra.get("attributes", [""])[0] in COLOURS:
                assert not set(pairs(neg)) <= truth  # some colour sits on the wrong shape: false
            else:
                assert set(pairs(neg)) <= truth  # relation, size and texture swaps leave colour-shape pairs alone


def test_negatives_are_false_for_the_scene(items):
    scenes, by_kind = items
    for i, scene in enumerate(scenes):
        colours, shapes = {o["colour"] for o in scene["objects"]}, {o["shape"] for o in scene["objects"]}
        for kind in ("replace_att", "add_att", "add_obj"):
            neg = by_kind[kind][i][1]
            assert set(_words(neg)) & (set(COLOURS) - colours), (kind, neg)  # an absent colour is named
        assert set(_words(by_kind["replace_obj"][i][1])) & (set(SHAPES) - shapes)
        pos, neg, extra = by_kind["replace_rel"][i]
        verbs = {v: r for r, vs in REL_VERB.items() for v in vs}
        said = [m for m in re.finditer(r"the (?:\w+ )?(\w+) (is [\w ]+?) the (?:\w+ )?(\w+)\.", neg)]
        objects = {o["shape"]: j for j, o in enumerate(scene["objects"])}
        wrong = [m for m in said if verbs[m.group(2)] != relation_of(scene, objects[m.group(1)], objects[m.group(3)])]
        assert len(wrong) == 1, neg
        pos, neg, extra = by_kind["relation"][i]
        assert extra["relation_name"] in REL_VERB


def test_every_caption_fits_the_descriptive_context(items):
    tok = get_tokenizer()
    for rows in items[1].values():
        for pos, neg, _ in rows:
            for text in (pos, neg):
                assert len(tok.encode(text)) + 2 <= MAX_TOKENS["descriptive"], text


def test_files_are_read_as_the_own_suites_and_are_deterministic(tmp_path):
    a, b = str(tmp_path / "a"), str(tmp_path / "b")
    assert E.write_own_suites(a, seed=1, n=12, image_size=32)["relation"] == 12
    E.write_own_suites(b, seed=1, n=12, image_size=32)
    for rel in ("own/visual_genome_relation.json", "own/sugarcrepe/swap_att.json"):
        assert open(os.path.join(a, rel)).read() == open(os.path.join(b, rel)).read()
    suites = load_suites(a, "own")
    assert set(suites) == set(OWN_SUITES)
    assert all(len(s.items) == 12 and os.path.isfile(s.items[0]["image_path"]) for s in suites.values())
    with open(os.path.join(a, "own", "visual_genome_attribution.json")) as f:
        assert all(len(it["attributes"]) == 2 for it in json.load(f))
