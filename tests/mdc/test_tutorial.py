"""What the tutorials rest on: the sampler's trace, the tutorial helpers (mdc.tutorial), their figures."""
import math

import numpy as np
import pytest
import torch
from PIL import Image

import mdc
from conftest import small_model
from mdc.plots import plot_elbo_spread, plot_unmasking
from mdc.tutorial import (SPREAD_MODES, TUTORIAL_CONFIG, caption_variants, describes, elbo_spread, has_variants,
                          normalise, scene_data, steps_per_caption, train_tiny, unmasking_steps, write_example_dataset)


# ------------------------------------------------------------------------------ the sampler's trace
def test_trace_records_the_sampler_path_without_changing_it(images):
    model = small_model().eval()
    plain = mdc.generate(model, images, length=7, return_tokens=True)
    trace = []
    traced = mdc.generate(model, images, length=7, return_tokens=True, trace=trace)
    assert torch.equal(plain, traced) and len(trace) == 7
    tok = model.tokenizer
    seen = torch.zeros_like(plain, dtype=torch.bool)
    for step in trace:
        assert (step["revealed"].sum(1) == 1).all()  # Eq. 6: one position per step
        assert not (step["revealed"] & seen).any()  # never the same position twice
        seen |= step["revealed"]
        masked = step["confidence"] >= 0  # positions still masked at that step
        assert (step["revealed"] <= masked).all()
        best = step["confidence"].max(1).values  # the revealed one is the most confident
        assert torch.equal(step["confidence"][step["revealed"]], best)
        assert torch.equal(step["tokens"][step["revealed"]], plain[step["revealed"]])
    assert torch.equal(trace[-1]["tokens"], plain) and not (plain == tok.mask_id).any()
    order = unmasking_steps(trace, tok, row=1)
    assert [s["step"] for s in order] == list(range(1, 8)) and sorted(s["position"] for s in order) == list(range(1, 8))
    assert all(0 < s["confidence"] <= 1 for s in order)


def test_trace_counts_steps_of_parallel_decoding(images):
    model = small_model().eval()
    for k in (2, 3, 7):
        trace = []
        mdc.generate(model, images, length=7, tokens_per_step=k, trace=trace)
        assert len(trace) == math.ceil(7 / k)
        assert (steps_per_caption(trace) == math.ceil(7 / k)).all()
    trace = []
    mdc.generate(model, images, length=7, threshold=1e-6, trace=trace)  # every position beats it: one step
    assert len(trace) == 1 and (steps_per_caption(trace) == 1).all()


def test_trace_is_only_for_the_unmasking_sampler(images):
    with pytest.raises(ValueError, match="trace records MDC"):
        mdc.generate(small_model("arc").eval(), images, length=5, trace=[])


def test_unmasking_figure(images, tmp_path):
    model = small_model().eval()
    trace = []
    mdc.generate(model, images[:1], length=6, trace=trace)
    fig = plot_unmasking(trace, model.tokenizer, path=str(tmp_path / "unmask"))
    assert (tmp_path / "unmask.png").stat().st_size > 1000 and fig._repr_png_()[:4] == b"\x89PNG"
    text = {t.get_text() for t in fig.axes[0].texts}
    assert len(text) >= 1 and all("\n" in t for t in text)  # token and its confidence per revealed cell


# ------------------------------------------------------------------------------ data and training
def test_scene_data_is_seeded_held_out_and_normalised_like_the_eval_transform():
    a, b = scene_data(6, "reference"), scene_data(6, "reference")
    assert a.captions == b.captions and torch.equal(a.images, b.images) and len(a) == 6
    held = scene_data(6, "reference", held_out=True)
    assert held.scenes != a.scenes
    assert all(1 <= len(s["objects"]) <= 2 for s in a.scenes)
    assert a.images.shape == (6, 3, 32, 32) and a.pixels.shape == (6, 32, 32, 3) and a.pixels.dtype == np.uint8
    transform = mdc.image_transform(32)
    assert torch.allclose(a.images[0], transform(Image.fromarray(a.pixels[0])), atol=1e-6)
    assert torch.equal(normalise(a.pixels[:2]), a.images[:2])
    tokens = mdc.get_tokenizer("tiny", context_length=TUTORIAL_CONFIG["context_length"]).tokenize(
        scene_data(200, "descriptive").captions)[1]
    assert tokens.truncated == 0 and tokens.unknown == 0  # the 40-token context holds every caption


def test_train_tiny_is_deterministic_and_learns(one_thread):
    data = scene_data(64, "reference")
    m1, l1 = train_tiny(data, steps=12, batch_size=16, lr=3e-3, vision_layers=1, text_layers=1)
    m2, l2 = train_tiny(data, steps=12, batch_size=16, lr=3e-3, vision_layers=1, text_layers=1)
    assert l1 == l2 and not m1.training
    assert all(torch.equal(p, q) for p, q in zip(m1.state_dict().values(), m2.state_dict().values()))
    assert np.mean(l1[-3:]) < l1[0]
    arc, _ = train_tiny(data, "arc", steps=2, batch_size=8, vision_layers=1, text_layers=1)
    assert arc.config.objective == "arc" and arc.config.image_size == 32


def test_caption_variants_are_the_benchmarks_hard_negatives():
    data = scene_data(40, held_out=True)
    scene = next(s for s in data.scenes if has_variants(s))
    (a, b) = scene["objects"]
    for style in ("descriptive", "reference"):
        v = caption_variants(scene, style)
        true = v["true"]
        assert describes(scene, true) or style == "reference"  # a reference caption may leave out size, texture
        assert len(set(v.values())) == 5  # every negative differs from the truth and from each other
        assert sorted(v["colour swap"].split()) == sorted(true.split())  # same words, colours exchanged
        for kind in ("relation swap", "colour replaced", "shape replaced"):  # one word, or a shape named twice
            changed = [(x, y) for x, y in zip(true.split(), v[kind].split()) if x != y]
            assert len(true.split()) == len(v[kind].split()) and 1 <= len(changed) <= 2, (kind, changed)
        replaced = {y for x, y in zip(true.split(), v["colour replaced"].split()) if x != y}
        assert replaced and not replaced & {a["colour"], b["colour"]}
    with pytest.raises(ValueError, match="two-object scene whose objects differ"):
        caption_variants(next(s for s in data.scenes if len(s["objects"]) == 1))


def test_describes_checks_every_attribute_word_of_a_scene():
    data = scene_data(20, held_out=True)
    scene, text = next((s, c) for s, c in zip(data.scenes, data.captions) if len(s["objects"]) == 1)
    assert describes(scene, text)
    colour = scene["objects"][0]["colour"]
    assert not describes(scene, text.replace(colour, "nocolour"))


def test_elbo_spread_pairing_shrinks_the_noise_of_differences(images):
    model = small_model().eval()
    pairs = [["a red circle left of a blue square", "a blue square left of a red circle"]] * 2
    spread = elbo_spread(model, images[:2], pairs, sizes=(2, 8), seeds=range(4))
    assert spread["sizes"] == [2, 8] and set(spread) == {"sizes", *SPREAD_MODES}
    assert all(len(spread[m][w]) == 2 for m in SPREAD_MODES for w in ("caption", "difference"))
    assert spread["stratified + paired"]["difference"][1] < spread["stratified"]["difference"][1]
    fig = plot_elbo_spread(spread)
    assert len(fig.axes) == 2 and fig._repr_png_()[:4] == b"\x89PNG"


def test_example_dataset_is_a_coco_captions_file(tmp_path):
    from mdc.data.formats import load_coco_captions, load_image

    paths = write_example_dataset(str(tmp_path), n_train=5, n_val=2, captions_per_image=3)
    train = load_coco_captions(paths["train"], paths["images"])
    val = load_coco_captions(paths["val"], paths["images"])
    assert len(train) == 5 and len(val) == 2 and all(len(it["references"]) == 3 for it in train)
    assert {it["image_id"] for it in train}.isdisjoint(it["image_id"] for it in val)
    assert load_image(train[0]).size == (64, 64)
