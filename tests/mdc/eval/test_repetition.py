"""The descriptive-repetition instrument: its object-list parser on hand-written captions, the references
control at the world's ceiling, and an end-to-end call on tiny untrained captioners of both objectives."""
import json

import pytest
from conftest import small_model

import mdc
from mdc.eval import repetition as rep
from mdc.tokenizer import Tokenizer
from mdc.world.text import vocabulary

pytestmark = pytest.mark.usefixtures("one_thread")  # fast on shared cores
WORLD = Tokenizer(64, vocabulary())  # the shipped models' tokenizer
SCENE = {"objects": [{"shape": "heart", "colour": "red"}, {"shape": "star", "colour": "purple"}]}


def test_the_parser_reads_the_object_list_only():
    caption = ("a black background with two objects: a little striped red heart and a little spotted purple star. "
               "the heart is to the left of the star. the red heart is above the purple star.")
    assert rep.object_list(caption) == {"shapes": ["heart", "star"], "pairs": [("red", "heart"), ("purple", "star")]}
    twice = "two objects on a gray background : a big red heart , a blue heart . the heart is below the star ."
    assert rep.object_list(twice) == {"shapes": ["heart", "heart"], "pairs": [("red", "heart"), ("blue", "heart")]}
    # size and texture words between colour and shape still pair them; any other word breaks the pair
    between = "one object: a red little striped big spotted heart, a purple solid star and a green big dark star"
    assert rep.object_list(between)["pairs"] == [("red", "heart"), ("purple", "star")]
    for none in ("a red heart and a purple star", "two objects: a red thing. a red heart", "objects :"):
        assert rep.object_list(none) is None


def test_the_measures_of_hand_written_captions():
    captions = ["two objects: a red heart and a big red heart. the heart", "two objects: a purple striped star",
                "a red heart left of a purple star", "two objects: a blue heart and a purple star"]
    m, rows = rep.view_measures(captions, [SCENE] * 4, lengths=[5, 5, 4, 5], target=[5] * 4)
    assert m["shape_twice"] == m["shape_twice_many"] == 0.25 and m["no_list"] == 0.25
    assert m["n_pairs"] == 5 and m["pairs_exist"] == pytest.approx(4 / 5)  # red heart x2, purple star x2; blue heart
    assert m["pairs_exist_caption"] == pytest.approx((1 + 1 + 0.5) / 3)
    assert m["objects_named"] == pytest.approx(5 / 4) and m["objects_true"] == 2 and m["exact_length"] == 0.75
    assert [r["share"] for r in rows] == [1.0, 1.0, None, 0.5]


def test_the_references_are_the_ceiling_over_real_scenes():
    data = rep.make_scenes(WORLD, 400, seed=0, image_size=8, context_length=64)
    assert data["dropped"] == 0 and len(data["texts"]) == 400 == len(data["images"])  # descriptive fits 64 tokens
    assert data["lengths"] == [len(WORLD.encode(t)) for t in data["texts"]]
    twice = [t for t, s in zip(data["texts"], data["scenes"]) if len({o["shape"] for o in s["objects"]})
             < len(s["objects"])]
    assert not twice, f"the world now holds a shape twice in a scene, the instrument's ceiling is gone: {twice[:2]}"
    # the true texts, and the same decoded from their tokens as a model's captions are (" : ", " . ")
    decoded = [WORLD.decode(WORLD.encode(t)) for t in data["texts"]]
    for texts in (data["texts"], decoded):
        m, rows = rep.view_measures(texts, data["scenes"])
        assert m["shape_twice"] == 0 and m["pairs_exist"] == 1 and m["pairs_exist_caption"] == 1
        assert m["no_list"] == 0 and m["objects_named"] == m["objects_true"]
        assert [r["pairs"] for r in rows] == [len(s["objects"]) for s in data["scenes"]]


@pytest.mark.parametrize("objective", ("mdc", "arc"))
def test_an_untrained_captioner_end_to_end(objective):
    model = small_model(objective, vocab=vocabulary(), context_length=48)  # some descriptive captions do not fit
    out = rep.descriptive_repetition(model, n_scenes=8, seed=1, batch_size=3, beam_size=2)
    assert json.loads(json.dumps(out)) == out and out["objective"] == objective
    assert out["dropped"] > 0 and out["n_scenes"] + out["dropped"] == 8
    assert out["lengths"]["max"] <= 46 and 0 < out["lengths"]["mean"] <= out["lengths"]["max"]
    assert set(out["views"]) == set(rep.VIEWS) and len(out["examples"]) == min(4, out["n_scenes"])
    for view, m in out["views"].items():
        assert m["exact_length"] == 1.0, view  # every caption has its scene's true length
        for key in ("shape_twice", "no_list", "pairs_exist", "pairs_exist_caption", "shape_twice_many"):
            assert m[key] is None or 0 <= m[key] <= 1, (view, key)
        assert 0 <= m["objects_named"] and 1 <= m["objects_true"] <= 4
    for d in out["differences"].values():
        assert d["n"] == 0 or (-1 <= d["difference"] <= 1 and d["interval"][0] <= d["interval"][1])
    again = rep.descriptive_repetition(model, n_scenes=8, seed=1, batch_size=64, beam_size=2)
    assert again == out  # nothing depends on the batch size
    assert "own - other_image" in rep.format_repetition(out)
    with pytest.raises(ValueError):
        rep.descriptive_repetition(model, n_scenes=0)


def test_scene_captions_decode_with_the_decoder_asked_and_a_drawing_one_does_not_depend_on_the_batch():
    model = small_model("mdc", vocab=vocabulary(), context_length=64)
    data = rep.make_scenes(model.tokenizer, 6, seed=2, image_size=model.config.image_size, context_length=64)
    images, lengths = data["images"], data["lengths"]
    margin, _ = rep.scene_captions(model, images, lengths, batch_size=4, decoder="margin")
    for i in (0, 5):  # each as generate writes it alone
        assert margin[i] == mdc.generate(model, images[i:i + 1], lengths[i], decoder="margin")[0]
    drawn = [rep.scene_captions(model, images, lengths, batch_size=b, seed=3, decoder="ancestral")[0] for b in (1, 64)]
    assert drawn[0] == drawn[1] != rep.scene_captions(model, images, lengths, seed=4, decoder="ancestral")[0]
    arc = small_model("arc", vocab=vocabulary(), context_length=64)
    with pytest.raises(ValueError, match="options of MDC's decoders"):
        rep.scene_captions(arc, images, lengths, decoder="margin")
    own, counts = rep.scene_captions(arc, images, [None] * 6, beam_size=2)  # its own [EOT], up to the context
    assert own[2] == mdc.generate(arc, images[2:3], 62, beam_size=2)[0] and max(counts) <= 62
