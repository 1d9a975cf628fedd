"""The caption sets of Table 3: the paper's, and those at matched length (per image), ARC greedy beside beam."""
from PIL import Image

import mdc
from conftest import caption_items, small_model
from mdc.data.transforms import image_transform
from mdc.eval import captioning as cap


def _items(tmp_path, n=3):
    return caption_items(tmp_path, n, lambda i: (70 * i % 255, 40, 180))


def _one(model, item, **kw):
    x = image_transform(model.config.image_size, train=False)(Image.open(item["image_path"]).convert("RGB"))
    return mdc.generate(model.eval(), x[None], **kw)[0]


def test_mdc_at_a_per_image_length_is_mdc_at_that_length_image_by_image(tmp_path):
    items, model = _items(tmp_path), small_model("mdc")
    lengths = {0: 3, 1: 6, 2: 3}
    out = cap.generate_captions(model, items, lengths=(4,), per_image={"arc": lengths, "ref": {0: 2, 1: 2, 2: 5}},
                                batch_size=2)
    assert list(out) == ["mdc-4", "mdc-arc", "mdc-ref"]
    assert all(out["mdc-arc"][it["image_id"]] == _one(model, it, length=lengths[it["image_id"]]) for it in items)


def test_arc_greedy_and_beam_with_the_end_held_back(tmp_path):
    items, model = _items(tmp_path), small_model("arc")
    minimum = {0: 5, 1: 8, 2: 6}
    out = cap.generate_captions(model, items, beam_size=2, arc_max_length=8, greedy=True, per_image={"ref": minimum})
    assert list(out) == ["arc-greedy", "arc-beam2", "arc-beam2-ref"]
    for it in items:
        i = it["image_id"]
        assert out["arc-greedy"][i] == _one(model, it, length=8, beam_size=1)
        assert out["arc-beam2-ref"][i] == _one(model, it, length=8, beam_size=2, min_length=minimum[i])


def test_reference_lengths_are_the_median_in_tokens(tmp_path):
    tok = small_model("mdc").tokenizer
    items = [{"image_id": 7, "references": ["a b c", "a b c d e", "a", "a b"]}]  # tokens: 3, 5, 1, 2 -> lower median 2
    assert cap.reference_lengths(items, tok, 22) == {7: len(tok.encode("a b"))}
    assert cap.reference_lengths(items, tok, 1) == {7: 1}
