"""Readers of the real benchmark formats, on tiny fixtures written in the published layouts."""
import io
import json
import re
import sys
import types

import numpy as np
import pytest
from PIL import Image

from mdc.data.aro_sugarcrepe import (
    ARO_SYMMETRIC_RELATIONS, TIES_WIN, correct_and_ties, load_order_suite, load_sugarcrepe, load_vg_attribution, load_vg_relation,
    perturb_caption, vg_attribution_accuracy, vg_relation_accuracy,
)
from mdc.data.tagger import _spacy_nlp, builtin_word_classes, resolve_tagger, word_classes
from mdc.data.formats import (
    build_probe_dataset, load_coco_captions, load_image, load_image_folder, load_karpathy,
    load_wds_classification,
)
from mdc.data.writer import write_tar
from mdc.eval import accuracy


def normalise_caption(caption: str, max_words: int = 30) -> list[str]:
    """Lowercase, punctuation to spaces (apostrophes and hyphens kept), first ``max_words`` words: the words
    the order suite's and the built-in tagger's tests name."""
    return re.sub(r"[^a-z0-9'\- ]+", " ", caption.lower()).split()[:max_words]


def order_accuracy(items, true_scores, perturbed_scores) -> float:
    """ARO's order accuracy as Table 2 scores it (mdc.eval.suites, mdc.eval.compositionality): the true caption
    first, :func:`correct_and_ties` with ``ties_win``, a perturbation that is the true caption's very string
    (``identical``) no competitor."""
    scores = np.concatenate([np.asarray(true_scores, dtype=np.float64)[:, None],
                             np.asarray(perturbed_scores, dtype=np.float64)], 1)  # [N, 5], the true caption first
    same = np.array([[False, *item["identical"]] for item in items], dtype=bool)  # [N, 5]
    return float(correct_and_ties(scores, same, ties_win=True)[0].mean())


def _image(path, size=(40, 30), color=(200, 10, 10)):
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.new("RGB", size, color).save(path)
    return path


def _json(path, obj):
    path.write_text(json.dumps(obj))
    return str(path)


# ------------------------------------------------------------------ SugarCrepe
def test_sugarcrepe(tmp_path):
    _image(tmp_path / "val2017" / "000000085329.jpg")
    for name in ("add_att", "add_obj", "replace_att", "replace_obj", "replace_rel", "swap_att", "swap_obj"):
        _json(tmp_path / f"{name}.json", {"0": {"filename": "000000085329.jpg", "caption": "a red bus",
                                                "negative_caption": f"a {name} bus"}})
    data = load_sugarcrepe(str(tmp_path), str(tmp_path / "val2017"))
    assert len(data) == 7 and data["swap_obj"][0]["negative_caption"] == "a swap_obj bus"
    assert load_image(data["add_att"][0]).size == (40, 30)

    _json(tmp_path / "swap_obj.json", {"0": {"filename": "000000085329.jpg", "caption": "x"}})
    with pytest.raises(ValueError, match=r"swap_obj\.json.*'0'.*negative_caption"):
        load_sugarcrepe(str(tmp_path), str(tmp_path / "val2017"))
    _json(tmp_path / "swap_obj.json", {"7": {"filename": "nope.jpg", "caption": "x", "negative_caption": "y"}})
    with pytest.raises(ValueError, match=r"swap_obj\.json.*'7'.*nope\.jpg"):
        load_sugarcrepe(str(tmp_path), str(tmp_path / "val2017"))


def test_sugarcrepe_missing_images_error_or_skip(tmp_path, caplog):
    _image(tmp_path / "val2017" / "a.jpg")
    items = {str(i): {"filename": "a.jpg" if i % 2 == 0 else f"gone{i}.jpg", "caption": "a red bus",
                      "negative_caption": "a blue bus"} for i in range(6)}
    _json(tmp_path / "add_att.json", items)
    with pytest.raises(ValueError, match=r"add_att\.json.*'1'.*gone1\.jpg.*on_missing='skip'"):
        load_sugarcrepe(str(tmp_path), str(tmp_path / "val2017"), subsets=["add_att"])
    got = load_sugarcrepe(str(tmp_path), str(tmp_path / "val2017"), subsets=["add_att"], on_missing="skip")["add_att"]
    assert [it["id"] for it in got] == ["0", "2", "4"]
    assert got.total == 6 and len(got.missing) == 3 and got.missing[0].endswith("gone1.jpg")
    assert "skipped 3 of 6 items" in caplog.text and "gone1.jpg" in caplog.text
    with pytest.raises(ValueError, match="on_missing"):
        load_sugarcrepe(str(tmp_path), str(tmp_path / "val2017"), subsets=["add_att"], on_missing="ignore")


def test_sugarcrepe_columns_are_item_weighted():
    """A SugarCrepe column pools its sub-files' items (mdc.eval.accuracy.item_outcomes, as Table 2 reads them)."""
    def subset(flags):
        return {"records": {"correct": {"exact": accuracy.encode_outcomes(flags)}, "ids": list(range(len(flags))),
                            "clusters": [str(i) for i in range(len(flags))]}}

    results = {"columns": {}, "sugarcrepe_subsets": {"add_att": subset([True] * 3), "add_obj": subset([False]),
                                                     "swap_att": subset([True, False])}}
    pooled = lambda column: float(accuracy.item_outcomes(results, column, "exact")[0].mean())  # noqa: E731
    with pytest.raises(KeyError, match="no sub-file"):
        pooled("sugarcrepe_replace")
    assert pooled("sugarcrepe_add") == pytest.approx(3 / 4) and pooled("sugarcrepe_swap") == 0.5
    outcomes, _, files, _ = accuracy.item_outcomes(results, "sugarcrepe_add", "exact", macro=True)
    assert outcomes[np.array(files) == "add_obj"].mean() == 0.0


# ------------------------------------------------------------------ ARO
def _vg_record(image, **extra):
    return {"image_path": image, "bbox_x": 5, "bbox_y": 4, "bbox_w": 20, "bbox_h": 10,
            "true_caption": "the cat is on the mat", "false_caption": "the mat is on the cat", **extra}


def test_vg_relation_and_attribution(tmp_path):
    _image(tmp_path / "images" / "1.jpg")
    rel = _json(tmp_path / "visual_genome_relation.json",
                [_vg_record("1.jpg", relation_name="on"), _vg_record("1.jpg", relation_name="on"),
                 _vg_record("1.jpg", relation_name="wearing"), _vg_record("1.jpg", relation_name="next to")])
    items = load_vg_relation(rel, str(tmp_path / "images"))
    assert items[0]["bbox"] == (5, 4, 20, 10) and load_image(items[0]).size == (20, 10)
    macro, per = vg_relation_accuracy(items, [True, False, True, False])
    assert "next to" in ARO_SYMMETRIC_RELATIONS and per == {"on": 0.5, "wearing": 1.0} and macro == 0.75

    att = _json(tmp_path / "visual_genome_attribution.json",
                [_vg_record("1.jpg", attributes=["red", "small"])] * 3 + [_vg_record("1.jpg", attributes=["a", "b"])])
    items = load_vg_attribution(att, str(tmp_path / "images"))
    macro, per = vg_attribution_accuracy(items, [True, True, False, False], min_count=2)
    assert per == {"red_small": pytest.approx(2 / 3)} and macro == pytest.approx(2 / 3)

    no_bbox_h = _vg_record("1.jpg", relation_name="on")
    del no_bbox_h["bbox_h"]
    bad = _json(tmp_path / "bad.json", [_vg_record("1.jpg", relation_name="on"), no_bbox_h])
    with pytest.raises(ValueError, match=r"bad\.json.*item 1.*bbox_h"):
        load_vg_relation(bad, str(tmp_path / "images"))
    missing = _json(tmp_path / "missing.json", [_vg_record("2.jpg", relation_name="on")])
    with pytest.raises(ValueError, match=r"missing\.json.*item 0.*2\.jpg"):
        load_vg_relation(missing, str(tmp_path / "images"))


def test_order_suite(tmp_path):
    _image(tmp_path / "val2014" / "a.jpg")
    caps = ["A man riding a red bike down the busy street.", "Two small dogs play in the green grass",
            "a cat", "A woman holding an umbrella next to a tall building", "People walk."]
    path = _json(tmp_path / "coco_karpathy_test.json", [{"image": "val2014/a.jpg", "caption": caps}])
    items = load_order_suite(path, str(tmp_path), seed=0, tagger="builtin")
    assert items.tagger == "builtin" and len(items) == 5
    assert items[0]["caption"] == "a man riding a red bike down the busy street"
    for item, cap in zip(items, caps):
        words = sorted(normalise_caption(cap))
        assert len(item["perturbed"]) == 4
        assert all(sorted(p.split()) == words for p in item["perturbed"])
        assert item["identical"] == [p == item["caption"] for p in item["perturbed"]]
    assert items == load_order_suite(path, str(tmp_path), seed=0, tagger="builtin")
    reseeded = load_order_suite(path, str(tmp_path), seed=1, tagger="builtin")
    assert any(a["perturbed"] != b["perturbed"] for a, b in zip(items, reseeded))
    assert any(p != items[0]["caption"] for p in items[0]["perturbed"])

    true = np.zeros(5)
    perturbed = -np.ones((5, 4))
    perturbed[1, 2] = 0.0  # a tie with a different caption: correct, as ARO's argmax (true caption first) has it
    perturbed[3, 1] = 0.5  # beaten: wrong
    perturbed[np.array([it["identical"] for it in items])] = 0.0  # ties with the same string: correct too
    assert order_accuracy(items, true, perturbed) == pytest.approx(4 / 5)
    scores = np.concatenate([true[:, None], perturbed], 1)  # ARO's own evaluate_scores: argmax == 0
    assert order_accuracy(items, true, perturbed) == float(np.mean(np.argmax(scores, -1) == 0))

    with pytest.raises(ValueError, match=r"coco_karpathy_test\.json.*item 0.*'caption'"):
        load_order_suite(_json(tmp_path / "coco_karpathy_test.json", [{"image": "val2014/a.jpg"}]), str(tmp_path),
                         tagger="builtin")


def _pieces(text):
    """Words and punctuation marks, whatever the spacing between them."""
    return sorted(re.findall(r"\w+|[^\w\s]", text))


def test_tie_rules_are_stated_once_and_match_each_benchmark_s_own_scorer():
    assert accuracy.correct_and_ties is correct_and_ties and accuracy.TIES_WIN is TIES_WIN
    assert TIES_WIN == ("aro_coco_order", "aro_flickr30k_order")
    scores = np.array([[0.0, -1.0], [0.0, 0.0], [0.0, 1.0]])  # [N, 2], the true caption first: wins, ties, loses
    correct, ties = correct_and_ties(scores)
    assert correct.tolist() == [True, False, False] and ties.tolist() == [False, True, False]
    assert correct.tolist() == (scores[:, 0] > scores[:, 1]).tolist()  # SugarCrepe: pos_score > neg_score
    assert correct.tolist() == (np.argmax(scores[:, ::-1], 1) == 1).tolist()  # ARO's VG sets: false caption first
    correct, ties = correct_and_ties(scores, ties_win=True)
    assert correct.tolist() == [True, True, False] and ties.tolist() == [False, True, False]
    assert correct.tolist() == (np.argmax(scores, 1) == 0).tolist()  # ARO's order sets: true caption first


def test_order_perturbations_are_built_from_the_raw_caption_as_aro_does(tmp_path):
    """ARO perturbs the raw caption (its tokens: case kept for the tagger, punctuation and clitics
    tokens of their own), then normalises each perturbation like the true caption (lowercase,
    . ! " ( ) * # : ; ~ dropped, 30 words): the perturbations keep the raw caption's words, commas,
    apostrophes and hyphens, and a hyphenated word stays whole in the trigram shuffles (nltk's tokens)."""
    caps = ["A man, wearing a T-shirt, rides his bike down the street.", "Two dogs' toys lie on the man's bed!",
            "A black-and-white photo of a double-decker bus (in London).", "The cat is sitting on a laptop; it's asleep.",
            "A dog, sleeping.", " ".join(["a red bus"] * 12) + "."]
    path = _json(tmp_path / "coco_karpathy_test.json", [{"image": "a.jpg", "caption": caps}])
    items = load_order_suite(path, None, seed=0, tagger="builtin")
    assert [it["caption"] for it in items[:5]] == [
        "a man, wearing a t-shirt, rides his bike down the street", "two dogs' toys lie on the man's bed",
        "a black-and-white photo of a double-decker bus in london", "the cat is sitting on a laptop it's asleep",
        "a dog, sleeping"]
    for item in items[:5]:
        for p in item["perturbed"]:
            assert p == p.lower() and not set('.!"()*#:;~') & set(p)
            assert _pieces(p) == _pieces(item["caption"]), (p, item["caption"])  # the same words and marks
    for p in items[0]["perturbed"][2:] + items[2]["perturbed"][2:]:
        assert {"t-shirt"} <= set(p.split()) or {"black-and-white", "double-decker"} <= set(p.split())
    assert items[4]["perturbed"][0] == "a dog , sleeping" and items[4]["identical"][0]  # one noun: unmoved
    long = items[5]
    assert len(long["caption"].split()) == 30 and all(len(p.split()) <= 30 for p in long["perturbed"])
    shuffled = [{p for item in load_order_suite(path, None, seed=s, tagger="builtin")[:5] for p in item["perturbed"]}
                for s in range(2)]
    assert any("," in p and p.index(",") != items[0]["caption"].index(",") for p in shuffled[0] | shuffled[1])


def _classes(caption):
    words = normalise_caption(caption)
    return dict(zip(words, builtin_word_classes(words)))


@pytest.mark.parametrize("caption, expected", [
    # closed-class words and irregular participles are not nouns
    ("a table made of wood set for two people sitting together", dict(
        made="other", set="other", two="other", sitting="other", together="other", table="noun", wood="noun")),
    ("a picture taken from a bridge built over the river", dict(taken="other", built="other", picture="noun")),
    # -y adjectives; -y nouns stay nouns
    ("a baby and a puppy on a sunny grassy hill under a cloudy sky", dict(
        baby="noun", puppy="noun", sunny="adj", grassy="adj", cloudy="adj", sky="noun", hill="noun")),
    ("a snowy road in a busy city next to a family", dict(snowy="adj", busy="adj", city="noun", family="noun")),
    # unlisted -s verbs vs plural nouns
    ("a man leans on a bench while a bird perches on a branch", dict(
        leans="other", perches="other", man="noun", bench="noun", bird="noun", branch="noun")),
    ("two boys sit on a bus with their bags", dict(boys="noun", sit="other", bus="noun", bags="noun")),
    # homographs decided by their neighbours
    ("a surfer rides the waves as a boy waves", dict(rides="other")),
    ("a cat on top of a stop sign in front of a parking lot", dict(
        top="noun", stop="noun", sign="noun", front="noun", parking="noun", lot="noun")),
    ("a man standing in the living room is dressed in white", dict(
        standing="other", living="noun", white="noun", dressed="other")),
    ("the sky is blue and a red bus is parked", dict(blue="adj", red="adj", parked="other")),
    ("a bus that is red and white", dict(red="adj", white="adj")),
])
def test_builtin_tagger_fixed_words(caption, expected):
    got = _classes(caption)
    assert {w: got[w] for w in expected} == expected
    words = normalise_caption("a surfer rides the waves as a boy waves")
    assert builtin_word_classes(words)[4] == "noun" and builtin_word_classes(words)[-1] == "other"


class _FakeToken:
    def __init__(self, text):
        self.text, self.tag_ = text, {"dog": "NN", "red": "JJ", "runs": "NN"}.get(text, "DT")


def _fake_spacy(monkeypatch, installed=True):
    """A stand-in spaCy whose tagger calls 'runs' a noun (the built-in tagger would not)."""
    spacy, tokens = types.ModuleType("spacy"), types.ModuleType("spacy.tokens")
    nlp = lambda doc: [_FakeToken(w) for w in (doc.split() if isinstance(doc, str) else doc.words)]  # noqa: E731
    nlp.vocab = object()

    def load(name):
        if not installed:
            raise OSError(f"[E050] Can't find model '{name}'")
        assert name == "en_core_web_sm"
        return nlp

    spacy.load, spacy.tokens = load, tokens
    tokens.Doc = lambda vocab, words: types.SimpleNamespace(words=words)
    monkeypatch.setitem(sys.modules, "spacy", spacy)
    monkeypatch.setitem(sys.modules, "spacy.tokens", tokens)
    _spacy_nlp.cache_clear()
    return nlp


@pytest.fixture
def clear_spacy_cache():
    _spacy_nlp.cache_clear()
    yield
    _spacy_nlp.cache_clear()


def test_spacy_tags_are_used_when_importable(monkeypatch, clear_spacy_cache, tmp_path):
    _fake_spacy(monkeypatch)
    words = ["a", "red", "dog", "runs"]
    assert resolve_tagger("auto") == "spacy" and word_classes(words) == ["other", "adj", "noun", "noun"]
    assert builtin_word_classes(words)[3] == "other"
    # the noun shuffle moves 'runs' only because spaCy calls it a noun
    shuffled = {tuple(perturb_caption(words, np.random.default_rng(s))[0]) for s in range(20)}
    assert ("a", "red", "runs", "dog") in shuffled
    path = _json(tmp_path / "test.json", [{"image": "a.jpg", "caption": ["A red dog runs."]}])
    assert load_order_suite(path, None).tagger == "spacy"


def test_without_spacy_auto_falls_back_with_a_warning(monkeypatch, clear_spacy_cache, tmp_path):
    _fake_spacy(monkeypatch, installed=False)  # spaCy without the model
    assert resolve_tagger("auto") == "builtin"
    with pytest.raises(ValueError, match="en_core_web_sm"):
        resolve_tagger("spacy")
    with pytest.raises(ValueError, match="tagger must be one of"):
        resolve_tagger("nltk")
    monkeypatch.setitem(sys.modules, "spacy", None)  # spaCy itself absent
    _spacy_nlp.cache_clear()
    path = _json(tmp_path / "test.json", [{"image": "a.jpg", "caption": ["A red dog runs."]}])
    with pytest.warns(UserWarning, match="built-in tagger"):
        assert load_order_suite(path, None).tagger == "builtin"


# ------------------------------------------------------------------ captioning
def test_karpathy_and_coco_captions(tmp_path):
    _image(tmp_path / "val2014" / "COCO_val2014_1.jpg")
    _image(tmp_path / "val2014" / "COCO_val2014_2.jpg")
    karpathy = {"images": [
        {"filepath": "val2014", "filename": "COCO_val2014_1.jpg", "split": "test", "imgid": 0, "cocoid": 1,
         "sentences": [{"raw": "A dog.", "tokens": ["a", "dog"]}, {"raw": "A brown dog."}]},
        {"filepath": "val2014", "filename": "COCO_val2014_2.jpg", "split": "train", "imgid": 1, "cocoid": 2,
         "sentences": [{"raw": "A cat."}]}]}
    path = _json(tmp_path / "dataset_coco.json", karpathy)
    test = load_karpathy(path, str(tmp_path))
    assert test == [{"image_id": 1, "image_path": str(tmp_path / "val2014" / "COCO_val2014_1.jpg"),
                     "references": ["A dog.", "A brown dog."]}]
    assert [x["image_id"] for x in load_karpathy(path, str(tmp_path), split=("train", "test"))] == [1, 2]
    del karpathy["images"][0]["sentences"][1]["raw"]
    with pytest.raises(ValueError, match=r"dataset_coco\.json.*0\.sentences\[1\].*'raw'"):
        load_karpathy(_json(tmp_path / "dataset_coco.json", karpathy), str(tmp_path))

    _image(tmp_path / "flickr" / "1000.jpg")
    flickr = _json(tmp_path / "dataset_flickr30k.json", {"images": [
        {"filename": "1000.jpg", "split": "test", "imgid": 7, "sentences": [{"raw": "Kids run."}]}]})
    assert load_karpathy(flickr, str(tmp_path / "flickr"))[0]["image_id"] == 7

    official = {"images": [{"id": 1, "file_name": "COCO_val2014_1.jpg"}, {"id": 2, "file_name": "COCO_val2014_2.jpg"}],
                "annotations": [{"id": 10, "image_id": 2, "caption": "A cat."},
                                {"id": 11, "image_id": 1, "caption": "A dog."},
                                {"id": 12, "image_id": 2, "caption": "A small cat."}]}
    path = _json(tmp_path / "captions_val2014.json", official)
    out = load_coco_captions(path, str(tmp_path / "val2014"))
    assert [(x["image_id"], x["references"]) for x in out] == [(1, ["A dog."]), (2, ["A cat.", "A small cat."])]
    official["images"].append({"id": 3, "file_name": "COCO_val2014_3.jpg"})
    with pytest.raises(ValueError, match=r"captions_val2014\.json.*images\[2\].*COCO_val2014_3\.jpg"):
        load_coco_captions(_json(tmp_path / "captions_val2014.json", official), str(tmp_path / "val2014"))
    del official["annotations"][0]["caption"]
    with pytest.raises(ValueError, match=r"annotations\[0\].*'caption'"):
        load_coco_captions(_json(tmp_path / "captions_val2014.json", official), str(tmp_path / "val2014"))


# ------------------------------------------------------------------ linear probes
def _wds_folder(root, split, labels):
    (root / split).mkdir(parents=True)
    (root / split / "nshards.txt").write_text("2\n")
    for shard in range(2):
        members = []
        for i, label in enumerate(labels):
            buf = io.BytesIO()
            Image.new("RGB", (8, 8), (label * 40, 0, 0)).save(buf, "PNG" if shard else "JPEG")
            members += [(f"s{shard}_{i}.{'png' if shard else 'jpg'}", buf.getvalue()),
                        (f"s{shard}_{i}.cls", str(label).encode())]
        write_tar(str(root / split / f"{shard}.tar"), members)


def test_wds_classification_folder(tmp_path):
    root = tmp_path / "wds_cifar"
    _wds_folder(root, "test", [0, 2, 1])
    (root / "classnames.txt").write_text("plane\ncar\nbird\n")
    ds = load_wds_classification(str(root), "test")
    pairs = list(ds)
    assert [label for _, label in pairs] == [0, 2, 1, 0, 2, 1] and ds.classnames == ["plane", "car", "bird"]
    assert pairs[0][0].size == (8, 8)
    ds = build_probe_dataset("wds/cifar10", str(root), "test", transform=lambda im: np.asarray(im).shape)
    assert next(iter(ds))[0] == (8, 8, 3)
    with pytest.raises(ValueError, match=r"train.*nshards\.txt"):
        load_wds_classification(str(root), "train")


def test_image_folder(tmp_path):
    _image(tmp_path / "folder" / "dog" / "b.png")
    _image(tmp_path / "folder" / "cat" / "a.jpg")
    _image(tmp_path / "folder" / "cat" / "c.jpeg")
    (tmp_path / "folder" / "cat" / "notes.txt").write_text("not an image")
    ds = load_image_folder(str(tmp_path / "folder"))
    assert ds.classnames == ["cat", "dog"] and len(ds) == 3
    assert [ds[i][1] for i in range(3)] == [0, 0, 1] and ds[2][0].size == (40, 30)
    with pytest.raises(ValueError, match="nowhere"):
        load_image_folder(str(tmp_path / "nowhere"))


def test_clip_benchmark_dataset_missing_root_is_a_clear_error(tmp_path):
    with pytest.raises(ValueError, match=r"food101.*" + str(tmp_path / "food")):
        build_probe_dataset("food101", str(tmp_path / "food"), "train", transform=None)
    (tmp_path / "cifar").mkdir()
    with pytest.raises(ValueError, match=r"cifar10.*" + str(tmp_path / "cifar")):
        build_probe_dataset("cifar10", str(tmp_path / "cifar"), "test", transform=None)
    with pytest.raises(ValueError, match="unknown probe dataset"):
        build_probe_dataset("mnist", str(tmp_path), "test")
