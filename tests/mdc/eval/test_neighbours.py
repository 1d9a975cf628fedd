"""The neighbour-use instrument: its items point at the words they name, a decoder that reads the neighbour is
told apart from one that does not, ARC's substitution split, and results that do not depend on the batch."""
import json
from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import mdc
from conftest import VOCAB, small_model
from mdc.eval import neighbours as nb
from mdc.tokenizer import Tokenizer
from mdc.world.graphs import sample_scene
from mdc.world.render import COLOURS, SHAPES
from mdc.world.streams import stream_rng
from mdc.world.text import SIZE_WORDS, TEXTURE_ADJ, vocabulary

pytestmark = pytest.mark.usefixtures("one_thread")  # fast on shared cores
WORLD = Tokenizer(64, vocabulary())  # the shipped models' tokenizer
WORDS = {"colour": lambda o: (o["colour"],), "size": lambda o: SIZE_WORDS[o["size"]],
         "texture": lambda o: TEXTURE_ADJ[o["texture"]]}


def _word(tok, row, pos) -> str:
    return tok.decode([int(row[pos])])


def test_items_point_at_each_objects_attribute_and_shape_words_in_every_mention():
    kinds = ("colour", "size", "texture")
    data = nb.make_items(WORLD, 60, seed=3, kinds=kinds, image_size=16)
    assert data["dropped"] == dict.fromkeys(kinds, 0) and data["images"].shape == (len(data["texts"]), 3, 16, 16)
    for kind in kinds:
        items = data[kind]
        assert len(items["tokens"]) == 60
        for i in range(60):
            s = int(items["scene"][i])
            scene = sample_scene(stream_rng(3, nb.STREAM_NEIGHBOURS, s))
            row, attr, shape = items["tokens"][i], int(items["attr"][i]), int(items["shape"][i])
            obj = next(o for o in scene["objects"] if o["shape"] == _word(WORLD, row, shape))  # shapes are unique
            assert _word(WORLD, row, attr) in WORDS[kind](obj) and attr < shape
            assert all(_word(WORLD, row, p) == _word(WORLD, row, attr) for p in items["attr_more"][i].nonzero())
            assert all(_word(WORLD, row, p) == obj["shape"] for p in items["shape_more"][i].nonzero())
            changed = (items["swapped"][i] != row).nonzero().flatten().tolist()
            assert changed == sorted([attr, *items["attr_more"][i].nonzero().flatten().tolist()])
            new = _word(WORLD, items["swapped"][i], attr)
            assert new not in WORDS[kind](obj) and (kind != "colour" or new not in [o["colour"] for o in scene["objects"]])
    colour = data["colour"]
    assert colour["attr_more"].any() and colour["shape_more"].any()  # long-form relation mentions occur
    per_scene = torch.bincount(colour["scene"]).tolist()  # every object of a scene once (the last scene cut)
    assert all(k == len(sample_scene(stream_rng(3, nb.STREAM_NEIGHBOURS, s))["objects"])
               for s, k in enumerate(per_scene[:-1]))


def test_words_outside_the_vocabulary_are_dropped_and_counted():
    tok = Tokenizer(64, VOCAB)  # the test captions' vocabulary: some colours and shapes missing
    data = nb.make_items(tok, 40, seed=0, image_size=8)
    items = data["colour"]
    assert data["dropped"]["colour"] > 0 and len(items["tokens"]) == 40 - data["dropped"]["colour"]
    for i in range(len(items["tokens"])):
        assert _word(tok, items["tokens"][i], int(items["attr"][i])) in COLOURS
        assert _word(tok, items["tokens"][i], int(items["shape"][i])) in SHAPES


class Oracle(nn.Module):
    """A hand-built captioner that knows each scene's caption (it recognises the scene by its image) and answers
    at a position by ``rule(tokens, truth, j)``: MDC's logits at j, ARC's for the token after j."""

    def __init__(self, data, rule, causal=False):
        super().__init__()
        self.tokenizer, self.causal, self.rule, self.images = WORLD, causal, rule, data["images"]
        self.truth = WORLD.tokenize(data["texts"])[0]  # [S, L]
        self.config = SimpleNamespace(image_size=data["images"].shape[-1])
        self.unused = nn.Parameter(torch.zeros(1))
        assert len(self.images.flatten(1).unique(dim=0)) == len(self.images)  # each scene's image is its own

    def context(self, images):  # the scene each row's image shows [R]
        return (images[:, None] == self.images[None]).flatten(2).all(-1).float().argmax(1)

    def hidden(self, tokens, scenes):  # [R, L, V] one-hot answers
        truth = self.truth[scenes][:, : tokens.shape[1]]
        wrong = torch.full_like(tokens, WORLD.encode("the")[0])
        answers = torch.stack([torch.where(self.rule(tokens, truth, j), truth[:, j + self.causal], wrong[:, j])
                               for j in range(tokens.shape[1] - self.causal)], 1)
        return F.one_hot(answers, WORLD.vocab_size).float()

    def head(self, h):
        return h


def _neighbour_visible(tokens, truth, j):
    """Right: the true word iff the word on its partner's side (a colour's next, a shape's previous) is shown."""
    colour = torch.isin(truth[:, j], torch.tensor(WORLD.encode(" ".join(COLOURS))))
    side = torch.where(colour, j + 1, j - 1).clamp(0, tokens.shape[1] - 1)
    shown = tokens.gather(1, side[:, None])[:, 0] != WORLD.mask_id
    follows = tokens.gather(1, side[:, None])[:, 0] == truth.gather(1, side[:, None])[:, 0]  # and is the true word
    return shown & follows


def test_a_decoder_that_reads_the_neighbour_shows_a_difference_and_one_that_ignores_it_none():
    data = nb.make_items(WORLD, 24, seed=1, image_size=16)
    reads = nb.neighbour_use(Oracle(data, _neighbour_visible), n_items=24, seed=1, batch_size=7)
    ignores = nb.neighbour_use(Oracle(data, lambda tokens, truth, j: torch.ones(len(tokens), dtype=torch.bool)),
                               n_items=24, seed=1, batch_size=7)
    for r in ("0.25", "0.75", "0.95"):
        for name in ("colour_given_shape", "shape_given_colour"):
            own = reads["measures"][name][r]["own"]
            assert (own["visible"], own["hidden"], own["difference"]) == (1.0, 0.0, 1.0) and own["n"] == 24
            assert own["interval"][0] > 0.9 and "attention" not in own  # no decoder, no attention
            flat = ignores["measures"][name][r]["own"]
            assert (flat["visible"], flat["hidden"], flat["difference"], flat["interval"]) == (1.0, 1.0, 0.0, [0.0, 0.0])
            assert ignores["measures"][name][r]["other_image"]["visible"] < 0.5  # another image, another answer
        after = reads["measures"]["shape_after_colour"][r]["own"]
        assert (after["true"], after["substituted"]) == (1.0, 0.0)


def test_arcs_substitution_split_on_a_stub_that_follows_the_attribute():
    data = nb.make_items(WORLD, 30, seed=2, image_size=16)
    follows = lambda tokens, truth, j: tokens[:, j] == truth[:, j]  # noqa: E731  next word right iff this one is
    out = nb.neighbour_use(Oracle(data, follows, causal=True), n_items=30, seed=2, batch_size=8)
    assert out["objective"] == "arc" and list(out["measures"]) == ["shape_after_colour"]
    own = out["measures"]["shape_after_colour"]["teacher_forced"]["own"]
    assert (own["true"], own["substituted"], own["difference"], own["n"]) == (1.0, 0.0, 1.0, 30)
    other = out["measures"]["shape_after_colour"]["teacher_forced"]["other_image"]
    assert other["true"] < 0.5  # another scene's caption: another shape


def _close(a, b):
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(_close(a[k], b[k]) for k in a)
    if isinstance(a, list):
        return len(a) == len(b) and all(_close(x, y) for x, y in zip(a, b))
    return a == pytest.approx(b, abs=1e-5) if isinstance(a, float) else a == b


@pytest.mark.parametrize("objective", ("mdc", "arc"))
def test_results_are_plain_json_and_do_not_depend_on_the_batch_size(objective):
    model = small_model(objective, vocab=vocabulary(), context_length=64)
    one = nb.neighbour_use(model, n_items=9, seed=0, batch_size=2, ratios=(0.5,), kinds=("colour", "size"))
    two = nb.neighbour_use(model, n_items=9, seed=0, batch_size=16, ratios=(0.5,), kinds=("colour", "size"))
    assert json.loads(json.dumps(one)) == one and _close(one, two)
    measures = one["measures"]
    if objective == "arc":
        assert set(measures) == {"shape_after_colour", "shape_after_size"}
        return
    assert set(measures) == {f"{a}_{b}" for k in ("colour", "size")
                             for a, b in ((f"{k}_given", "shape"), ("shape_given", k), ("shape_after", k))}
    attention = measures["colour_given_shape"]["0.5"]["own"]["attention"]
    layers = model.config.text_layers
    assert 0 < attention["uniform"] < 1 and all(len(attention[c][k]) == layers for c in ("visible", "hidden")
                                                for k in ("mean", "max_head"))
    assert all(0 <= m <= x <= 1 for m, x in zip(attention["visible"]["mean"], attention["visible"]["max_head"]))
    text = nb.format_neighbour_use(one)
    assert "colour_given_shape: visible - hidden" in text and "other_image" in text


def test_the_interval_resamples_scenes_and_refuses_nothing_it_cannot_compute():
    import numpy as np

    assert nb.paired_interval(np.full(6, 0.5), np.arange(6)) == [0.5, 0.5]
    lo, hi = nb.paired_interval(np.array([1.0, 1.0, 0.0, 0.0]), np.array([0, 0, 1, 1]), seed=0)
    assert lo == 0.0 and hi == 1.0  # two scenes: each resample is all of one, all of the other, or both
    with pytest.raises(ValueError):
        nb.neighbour_use(small_model(), n_items=0)


@pytest.mark.slow
def test_the_shipped_arc_follows_the_colour_it_is_given():
    model = mdc.create_model("mini", objective="arc", pretrained="synthetic")
    out = nb.neighbour_use(model, n_items=200, seed=0)["measures"]["shape_after_colour"]["teacher_forced"]
    assert out["own"]["difference"] > 0.3 and out["own"]["interval"][0] > 0.2  # the positive control works
    assert abs(out["other_image"]["difference"]) < out["own"]["difference"]
