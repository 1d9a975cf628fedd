"""Captioning evaluation: pycocoevalcap metrics, fine-tuning, generation, the LLM judge, loaders, figure."""
import json
import math

import numpy as np
import pytest
from PIL import Image

import pycocoevalcap.meteor.meteor as meteor_module
from mdc.data.formats import load_karpathy_test
from mdc.data.transforms import image_transform
from mdc.eval import captioning as cap
from mdc.eval.metrics import on_another_image
from mdc.eval.judge import JUDGE_PROMPT, llm_judge, parse_choice
from mdc.plots import plot_captions
from conftest import caption_items, small_model

PREDICTIONS = {1: "A red circle left of a blue square.", 2: "a green star above the triangle",
               3: "two blue squares, below a cross"}
REFERENCES = {1: ["a red circle left of a blue square", "A red circle and a blue square."],
              2: ["a green star above a small yellow triangle", "a star above a triangle", "green star"],
              3: ["two blue squares below a striped cross", "blue squares under a cross"]}


def _items(tmp_path, n=4):
    return caption_items(tmp_path, n, lambda i: (60 * i % 255, 90, 200), size=(40, 32))


# ------------------------------------------------------------------ metrics
def _pycocoevalcap(*scorers):
    """pycocoevalcap's own corpus scores of PREDICTIONS, called directly: {our name: score}."""
    from pycocoevalcap.tokenizer.ptbtokenizer import PTBTokenizer

    tok = PTBTokenizer()
    gts = tok.tokenize({i: [{"caption": r} for r in refs] for i, refs in REFERENCES.items()})
    res = tok.tokenize({i: [{"caption": c}] for i, c in PREDICTIONS.items()})
    out = {}
    for names, scorer in scorers:
        score = scorer.compute_score(gts, res)[0]
        out |= dict(zip(names, score if isinstance(score, list) else [score]))
    return out


def test_caption_metrics_equal_pycocoevalcap():
    from pycocoevalcap.bleu.bleu import Bleu
    from pycocoevalcap.cider.cider import Cider
    from pycocoevalcap.rouge.rouge import Rouge

    expected = _pycocoevalcap((["bleu1", "bleu2", "bleu3", "bleu4"], Bleu(4)), (["rouge_l"], Rouge()),
                              (["cider"], Cider()))
    got = cap.caption_metrics(PREDICTIONS, REFERENCES, metrics=["bleu", "rouge_l", "cider"])
    assert {k: got[k] for k in expected} == pytest.approx(expected, rel=1e-12)
    assert 0 < got["bleu4"] < got["bleu1"] < 1 and got["cider"] > 0
    assert got["meteor"] is None and got["spice"] is None
    assert got["unavailable"] == {"meteor": "not requested", "spice": "not requested"}
    assert 0 < got["bp"] <= 1 and len(got["cider_per_image"]) == len(PREDICTIONS)


def test_brevity_penalty_and_per_image_cider_are_pycocoevalcaps():
    """BLEU's corpus brevity penalty BP = min(1, exp(1 - r/c)) (r: each caption's closest reference length, c:
    the captions' length, PTB tokens, summed) equals pycocoevalcap's own; the per-image CIDEr-D scores are
    pycocoevalcap's and average to the corpus CIDEr."""
    from pycocoevalcap.bleu.bleu_scorer import BleuScorer
    from pycocoevalcap.cider.cider import Cider
    from pycocoevalcap.tokenizer.ptbtokenizer import PTBTokenizer

    tok = PTBTokenizer()
    gts = tok.tokenize({i: [{"caption": r} for r in refs] for i, refs in REFERENCES.items()})
    short = {1: "a red circle", 2: "a green star above the triangle", 3: "two squares"}
    res = tok.tokenize({i: [{"caption": c}] for i, c in short.items()})
    scorer = BleuScorer(n=4)
    for i in sorted(short):
        scorer += (res[i][0], gts[i])
    scorer.compute_score(option="closest")
    expected = math.exp(1 - scorer._reflen / scorer._testlen)
    got = cap.evaluate_captions({"short": short, "full": PREDICTIONS}, REFERENCES, metrics=["bleu", "cider"])
    assert got["short"]["bp"] == pytest.approx(expected, rel=1e-9) and expected < 0.8
    assert got["full"]["bp"] == 1.0  # as long as its closest references
    ids = sorted(short, key=str)
    cider = Cider().compute_score({i: gts[i] for i in ids}, {i: res[i] for i in ids})[1]
    assert got["short"]["cider_per_image"] == pytest.approx(list(cider), abs=1e-4)
    assert np.mean(got["short"]["cider_per_image"]) == pytest.approx(got["short"]["cider"], abs=1e-4)
    none = cap.evaluate_captions({"short": short}, REFERENCES, metrics=["cider"])["short"]
    assert none["bp"] is None and none["unavailable"]["bp"] == "not requested"


def test_descriptiveness_counts_grounded_and_repeated_words():
    refs = {1: ["a red square above a blue circle", "two shapes on white"], 2: ["a green star"]}
    got = cap.descriptiveness({1: "a red red square and a yellow cross", 2: "A green, green star."}, refs)
    # 1: 8 words; content {red, square, yellow, cross}; grounded {red, square}; repeats: red, a -> 2/8
    # 2: 4 words; content {green, star}, both grounded; repeats: green -> 1/4
    assert got == pytest.approx({"words": 6.0, "content_words": 3.0, "grounded_words": 2.0,
                                 "repeated": (2 / 8 + 1 / 4) / 2})
    with pytest.raises(ValueError, match="image 3"):
        cap.descriptiveness({3: "a cat"}, refs)
    assert cap.evaluate_captions({"m": {2: "a green star"}}, refs, metrics=[])["m"]["grounded_words"] == 2.0

@pytest.mark.slow
def test_meteor_equals_pycocoevalcap(monkeypatch):  # METEOR's Java process takes ~10 s to start
    meteor = meteor_module.Meteor()  # one process for both sides
    expected = _pycocoevalcap((["meteor"], meteor))
    monkeypatch.setattr(meteor_module, "Meteor", lambda: meteor)
    got = cap.caption_metrics(PREDICTIONS, REFERENCES, metrics=["meteor"])
    assert got["meteor"] == pytest.approx(expected["meteor"], rel=1e-12) and 0 < got["meteor"] < 1
    assert meteor.meteor_p.poll() is not None  # its Java process was stopped


def test_failing_metric_is_reported_not_raised(monkeypatch, caplog):
    def no_java(*args):
        raise FileNotFoundError("java: not found")

    class Broken:
        __init__ = no_java

    monkeypatch.setattr(meteor_module, "Meteor", Broken)
    got = cap.caption_metrics(PREDICTIONS, REFERENCES, metrics=["bleu", "meteor", "cider"])
    assert got["meteor"] is None and "java: not found" in got["unavailable"]["meteor"]
    assert got["bleu4"] > 0 and got["cider"] > 0 and "meteor" in caplog.text
    assert set(got["unavailable"]) == {"meteor", "rouge_l", "spice"}  # the last two were not requested

    from pycocoevalcap.tokenizer.ptbtokenizer import PTBTokenizer

    monkeypatch.setattr(PTBTokenizer, "tokenize", no_java)  # Java missing: nothing is on COCO's scale
    got = cap.caption_metrics(PREDICTIONS, REFERENCES, metrics=["bleu", "cider"])
    assert got["bleu4"] is None and got["cider"] is None
    assert "PTB tokenizer failed (FileNotFoundError: java: not found)" in got["unavailable"]["bleu4"]


def test_metric_failing_for_one_model_and_bad_input(monkeypatch):
    from pycocoevalcap.cider import cider

    real = cider.Cider.compute_score

    def flaky(self, gts, res):
        if any("circle" in c[0] for c in res.values()):
            raise RuntimeError("boom")
        return real(self, gts, res)

    monkeypatch.setattr(cider.Cider, "compute_score", flaky)
    got = cap.evaluate_captions({"a": PREDICTIONS, "b": {i: PREDICTIONS[i] for i in (2, 3)}}, REFERENCES, metrics=["cider"])
    assert got["a"]["cider"] is None and "boom" in got["a"]["unavailable"]["cider"] and got["b"]["cider"] > 0
    with pytest.raises(ValueError, match="image 9 has no reference"):
        cap.caption_metrics({9: "a cat"}, REFERENCES)
    with pytest.raises(ValueError, match="unknown metrics"):
        cap.caption_metrics(PREDICTIONS, REFERENCES, metrics=["bleu", "wer"])


# ------------------------------------------------------------------ fine-tuning and generation
def test_finetune_lowers_the_loss(tmp_path):
    import torch

    items = _items(tmp_path)
    model = small_model("arc")
    images = torch.stack([image_transform(32, train=False)(Image.open(it["image_path"])) for it in items])
    tokens = model.tokenizer([it["references"][0] for it in items])
    before = model.loss(images, tokens).item()
    model, log = cap.finetune(model, items, steps=30, batch_size=4, lr=2e-3, seed=0)
    assert model.loss(images, tokens).item() < before - 0.5 and not model.training
    assert len(log["loss"]) == 30 and log["text"]["captions"] == 120
    torch.manual_seed(0)
    again = cap.finetune(small_model("arc"), items, steps=3, batch_size=4, lr=2e-3, seed=0)[1]["loss"]
    torch.manual_seed(0)
    assert again == cap.finetune(small_model("arc"), items, steps=3, batch_size=4, lr=2e-3, seed=0)[1]["loss"]
    mdc_log = cap.finetune(small_model("mdc"), items, steps=2, batch_size=2, lr=1e-3)[1]
    assert len(mdc_log["loss"]) == 2


def test_generate_captions_names_and_shapes(tmp_path):
    items = _items(tmp_path, 3)
    out = cap.generate_captions(small_model("mdc"), items, lengths=(3, 5), batch_size=2)
    assert list(out) == ["mdc-3", "mdc-5"] and list(out["mdc-3"]) == [0, 1, 2]
    assert all(len(c.split()) <= 5 for c in out["mdc-5"].values())
    arc = cap.generate_captions(small_model("arc"), items, beam_size=2, arc_max_length=4)
    assert list(arc) == ["arc-beam2"] and len(arc["arc-beam2"]) == 3
    with pytest.raises(ValueError, match="length must lie in"):
        cap.generate_captions(small_model("mdc"), items, lengths=(30,))
    with pytest.raises(ValueError, match="'mdc' or 'arc' model"):
        cap.generate_captions(small_model("clip"), items)


def test_caption_options_hold_the_defaults_and_name_an_unknown_option(tmp_path):
    assert cap.FinetuneOptions(steps=5) == cap.FinetuneOptions(5, 32, 1e-5, 0.01, None, 1.0, 0, "cpu", 4096)
    with pytest.raises(TypeError):
        cap.FinetuneOptions()  # steps has no default
    assert cap.CaptionOptions() == cap.CaptionOptions(finetune_steps=0, finetune_batch_size=32, finetune_lr=1e-5,
                                                      lengths=(10, 15, 20), beam_size=6, batch_size=32, device="cpu",
                                                      seed=0, save_dir=None)
    items = _items(tmp_path, 2)
    with pytest.raises(ValueError, match=r"unknown finetune option 'step'; known: \['steps'"):
        cap.finetune(small_model("arc"), items, step=3)
    with pytest.raises(ValueError, match="unknown captioning option 'finetune_step'"):
        cap.caption_checkpoint(str(tmp_path), "mdc", items, items, finetune_step=3)
    small_model("mdc").save(tmp_path / "mdc")
    options = cap.CaptionOptions(finetune_steps=2, finetune_batch_size=2, lengths=(3,), batch_size=2,
                                 save_dir=str(tmp_path / "finetuned"))
    captions, info = cap.caption_checkpoint(str(tmp_path / "mdc"), "mdc", items, items, options)
    again, info_again = cap.caption_checkpoint(str(tmp_path / "mdc"), "mdc", items, items, options, save_dir=None)
    assert list(captions) == ["mdc-3", "mdc-ref"] and captions == again  # and at the references' length
    assert info["finetune"]["steps"] == 2 and info["finetune"]["loss"] == info_again["finetune"]["loss"]
    matched, _ = cap.caption_checkpoint(str(tmp_path / "mdc"), "mdc", items, items, lengths=(3,), batch_size=2,
                                        match={"arc": {it["image_id"]: "a b" for it in items}})
    assert list(matched) == ["mdc-3", "mdc-arc", "mdc-ref"]
    stopped = cap.caption_checkpoint(str(tmp_path / "mdc"), "mdc", items, items, options, save_dir=None,
                                     val_items=items, finetune_steps=4, finetune_eval_every=2, matched_length=False)
    assert list(stopped[0]) == ["mdc-3"]
    assert {"val", "best_step", "stopped", "steps_taken", "eval_every", "patience"} <= set(stopped[1]["finetune"])
    assert info["finetuned"] == str(tmp_path / "finetuned" / "mdc") and info_again["finetuned"] is None


def test_load_captioner_names_wrong_checkpoints(tmp_path):
    for objective in ("mdc", "arc", "clip"):
        small_model(objective).save(tmp_path / objective)
    assert cap.load_captioner(str(tmp_path / "mdc"), "mdc").config.objective == "mdc"
    with pytest.raises(ValueError, match=r"arc_checkpoint = .*mdc.* holds an 'mdc' captioner, expected 'arc'"):
        cap.load_captioner(str(tmp_path / "mdc"), "arc", "arc_checkpoint")
    with pytest.raises(ValueError, match=r"mdc_checkpoint = .*clip.* CLIP model"):
        cap.load_captioner(str(tmp_path / "clip"), "mdc", "mdc_checkpoint")
    with pytest.raises(ValueError, match=r"mdc_checkpoint = .*nope.*not found"):
        cap.load_captioner(str(tmp_path / "nope"), "mdc", "mdc_checkpoint")


# ------------------------------------------------------------------ loaders
def test_load_karpathy_test(tmp_path, caplog):
    (tmp_path / "val2014").mkdir()
    Image.new("RGB", (8, 8)).save(tmp_path / "val2014" / "a.jpg")
    records = [{"image": "val2014/a.jpg", "caption": [" A dog. ", "a cat"]},
               {"image": "val2014/gone.jpg", "caption": "one caption"}]
    path = tmp_path / "coco_karpathy_test.json"
    path.write_text(json.dumps(records))
    with pytest.raises(ValueError, match=r"coco_karpathy_test\.json.*1.*gone\.jpg"):
        load_karpathy_test(str(path), str(tmp_path))
    items = load_karpathy_test(str(path), str(tmp_path), on_missing="skip")
    assert items == [{"image_id": "val2014/a.jpg", "image_path": str(tmp_path / "val2014" / "a.jpg"),
                      "references": ["A dog.", "a cat"]}]
    assert items.total == 2 and len(items.missing) == 1 and "skipped 1 of 2" in caplog.text
    assert cap.load_caption_items(str(path), "karpathy_test", str(tmp_path), on_missing="skip") == items
    path.write_text(json.dumps([{"image": "val2014/a.jpg", "caption": []}]))
    with pytest.raises(ValueError, match=r"item 0 field 'caption'"):
        load_karpathy_test(str(path), str(tmp_path))
    with pytest.raises(ValueError, match="captions_format"):
        cap.load_caption_items(str(path), "flickr", str(tmp_path))
    with pytest.raises(ValueError, match=r"image_root .*nowhere.*not found"):
        cap.load_caption_items(str(path), "karpathy", str(tmp_path / "nowhere"))


# ------------------------------------------------------------------ LLM judge
def test_parse_choice():
    for answer, letter in [("B", "B"), ("b", "B"), ("(C)", "C"), ("**D**", "D"), ("Answer: C", "C"),
                           ("answer: c", "C"), ("Caption B is best", "B"), ("The best caption is (A).", "A"),
                           ("I cannot tell", None), ("(A) or (B)", None), ("E", None),
                           ("A man riding a horse", None), ("", None)]:
        assert parse_choice(answer, 4) == letter, answer


def test_llm_judge_against_a_fake_server(tmp_path, fake_judge):
    url, seen = fake_judge
    items = _items(tmp_path, 4)
    captions = {name: {it["image_id"]: f"{name} caption {it['image_id']}" for it in items}
                for name in ("mdc-10", "mdc-15", "mdc-20", "arc-beam6")}
    out = llm_judge(items, captions, endpoint=url, model="judge", seed=3, workers=1)
    assert (out["images"], out["valid"], out["invalid"], out["failed"]) == (4, 3, 1, 0)
    said = ["A", "B", None, "B"]  # the server's answers in turn; the third is unparseable
    assert [a["choice"] for a in out["answers"]] == [a["order"][s] if s else None for a, s in zip(out["answers"], said)]
    assert sum(out["counts"].values()) == 3 and sum(out["selection_rate"].values()) == pytest.approx(1.0)
    path, body = seen[0]
    assert path == "/v1/chat/completions" and body["model"] == "judge"
    image, text = body["messages"][0]["content"]
    assert image["image_url"]["url"].startswith("data:image/png;base64,")
    assert text["text"].startswith(JUDGE_PROMPT) and "(D) " in text["text"]
    orders = [tuple(a["order"].values()) for a in out["answers"]]
    assert len(set(orders)) > 1  # shuffled per image
    assert orders == [tuple(a["order"].values()) for a in llm_judge(items, captions, endpoint=url, model="judge",
                                                                     seed=3)["answers"]]  # seeded


def test_llm_judge_skipped_or_failing(tmp_path):
    items = _items(tmp_path, 2)
    captions = {"mdc-10": {0: "a", 1: "b"}, "arc-beam6": {0: "c", 1: "d"}}
    out = llm_judge(items, captions, endpoint="", model="judge")
    assert out["selection_rate"] is None and "no judge endpoint" in out["reason"] and out["images"] == 0
    down = llm_judge(items, captions, endpoint="http://127.0.0.1:9/v1", model="judge", timeout=2)
    assert down["failed"] == 2 and down["selection_rate"] is None and "first error" in down["reason"]


# ------------------------------------------------------------------ tables and the figure
def test_table3_rows_and_figure(tmp_path):
    results = {"dataset": {"name": "coco"}, "judge": {"selection_rate": {"mdc-10": 0.25, "arc-beam6": 0.75}},
               "metrics": {"mdc-10": {"bleu4": 0.2, "meteor": 0.1, "cider": 0.6, "spice": None, "rouge_l": 0.4,
                                      "grounded_words": 2.5, "repeated": 0.125, "words": 9.5, "bp": 0.75,
                                      "cider_another_image": 0.05},
                           "arc-beam6": {"bleu4": 0.1, "meteor": 0.2, "cider": 0.5, "spice": 0.1, "rouge_l": 0.3}}}
    rows = cap.table3_rows(results)
    assert [r["method"] for r in rows] == ["ARC (beam 6)", "MDC-10"]
    assert rows[1] == {"method": "MDC-10", "length_coco": 10, "words": 9.5, "bp": 75.0, "coco_bleu4": 20.0, "coco_meteor": 10.0,
                       "coco_cider": 60.0, "coco_spice": None, "coco_rougeL": 40.0, "coco_llm_judge": 25.0,
                       "grounded_words": 2.5, "repeated": 12.5, "coco_cider_another_image": 5.0}
    assert rows[0]["grounded_words"] is None and rows[0]["bp"] is None  # results written before the columns existed
    assert rows[0]["coco_cider_another_image"] is None
    matched = {"metrics": {n: {"cider": 0.5} for n in ("mdc-ref", "arc-beam6-ref", "mdc-arc", "arc-greedy",
                                                       "mdc-15", "arc-beam6")}, "dataset": {"name": "coco"}}
    assert [r["method"] for r in cap.table3_rows(matched)] == [
        "ARC (greedy)", "ARC (beam 6)", "ARC (beam 6, ref. length)", "MDC-15", "MDC (ARC's length)", "MDC (ref. length)"]
    assert cap.paper_sets(matched["metrics"]) == ["mdc-15", "arc-beam6"]
    assert "flickr_bleu4" in cap.table3_rows(results, "flickr30k")[0]
    items = _items(tmp_path, 3)
    picked = cap.pick_examples(items, {"mdc-10": {i: "a caption " * 9 for i in range(3)},
                                       "arc-beam6": {i: "x" for i in range(3)}}, k=2)
    examples = picked.pop("items")  # what the results keep: the figure is redrawn from them alone
    assert [set(it) for it in examples] == [{"image_id", "image_path", "references", "captions", "thumbnail"}] * 2
    assert [e["captions"]["arc-beam6"] for e in examples] == picked["captions_by_model"]["arc-beam6"]
    thumbs = cap.example_images(examples)
    assert [t.size for t in thumbs] == [im.size for im in picked["images"]]  # small images stay whole
    assert all(np.array_equal(np.asarray(t), np.asarray(im.convert("RGB"))) for t, im in zip(thumbs, picked["images"]))
    fig = plot_captions(**picked, path=str(tmp_path / "fig6.png"))
    assert len(fig.axes) == 2 and (tmp_path / "fig6.png").is_file() and (tmp_path / "fig6.pdf").is_file()  # the images
    assert [t.get_text() for t in fig.texts].count("ARC (beam 6):") == 2  # a row of captions per image


def test_the_wrong_image_control_moves_every_caption_and_scores_far_below_its_own_image():
    """another_image_cider: each caption scored against another image's references (a seeded derangement) —
    the same captions, none on its own image, and a captioner that describes its images falls far below."""
    moved = on_another_image(PREDICTIONS, seed=0)
    assert sorted(moved) == sorted(PREDICTIONS) and sorted(moved.values()) == sorted(PREDICTIONS.values())
    assert all(moved[i] != PREDICTIONS[i] for i in PREDICTIONS)
    assert moved == on_another_image(PREDICTIONS, seed=0) != on_another_image(PREDICTIONS, 3)
    control = cap.another_image_cider({"full": PREDICTIONS}, REFERENCES, seed=0)["full"]
    own = cap.evaluate_captions({"full": PREDICTIONS}, REFERENCES, metrics=["cider"])["full"]["cider"]
    assert control < 0.2 * own
