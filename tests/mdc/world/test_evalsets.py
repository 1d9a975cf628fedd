"""Evaluation sets derived from held-out scenes: layouts, fields, label semantics, vocabulary."""
from __future__ import annotations

import hashlib
import io
import json
import os
import tarfile
from collections import Counter

import numpy as np
import pytest
from PIL import Image

from mdc.eval.suites import LoadOptions, load_suites
from mdc.world import evalsets, scenes
from mdc.world.text import relation_of, vocabulary, word_tokens
from mdc import get_tokenizer

SIZES = dict(n_probe_train=128, n_probe_test=64, n_items=40, n_caption_train=20)


@pytest.fixture(scope="module")
def out(tmp_path_factory):
    root = tmp_path_factory.mktemp("evalsets")
    summary = evalsets.write_evalsets(str(root), seed=0, image_size=32, **SIZES)
    return str(root), summary


def _load(path):
    with open(path) as f:
        return json.load(f)


def test_summary(out):
    root, summary = out
    assert _load(os.path.join(root, "summary.json")) == json.loads(json.dumps(summary))
    assert len(summary["probe"]) >= 5
    for task, info in summary["probe"].items():
        assert info["chance"] == pytest.approx(1 / info["classes"])
    assert summary["sugarcrepe"]["chance"] == 0.5 and summary["aro"]["vg_relation"] == SIZES["n_items"]


def test_probe_layout_and_balance(out):
    root, summary = out
    for task, info in summary["probe"].items():
        folder = os.path.join(root, "probe", task)
        with open(os.path.join(folder, "classnames.txt")) as f:
            classnames = f.read().splitlines()
        assert len(classnames) == info["classes"] == len(set(classnames))
        for split in ("train", "test"):
            with open(os.path.join(folder, split, "nshards.txt")) as f:
                nshards = int(f.read())
            labels = []
            for s in range(nshards):
                with tarfile.open(os.path.join(folder, split, f"{s}.tar")) as tar:
                    members = {m.name: tar.extractfile(m).read() for m in tar}
                keys = sorted({n.rsplit(".", 1)[0] for n in members})
                assert set(members) == {f"{k}.{e}" for k in keys for e in ("png", "cls")}
                assert Image.open(io.BytesIO(members[f"{keys[0]}.png"])).size == (32, 32)
                labels += [int(members[f"{k}.cls"]) for k in keys]
            assert len(labels) == info[split] and 0 <= min(labels) and max(labels) < len(classnames)
            counts = np.bincount(labels, minlength=len(classnames))
            assert counts.max() - counts.min() <= 1  # exactly balanced


@pytest.mark.parametrize("task", list(evalsets.PROBE_TASKS))
def test_probe_labels_mean_what_they_say(task):
    names = evalsets.PROBE_TASKS[task][0]
    rng = np.random.default_rng(0)
    for label in range(len(names)):
        scene = evalsets._probe_scene(task, label, rng)
        objs = scene["objects"]
        large = [o for o in objs if o["size"] == "large"]
        if task == "count":
            assert len(objs) == label + 1
        elif task == "background":
            assert scene["background"]["kind"] == names[label]
        elif task == "relation":
            assert relation_of(scene, 0, 1) == names[label]
        else:  # attributes of the large object, in class-name word order
            spelled = {"object": ("colour", "shape"), "shape_texture": ("texture", "shape")}.get(task, (task,))
            assert " ".join(large[0][k] for k in spelled) == names[label]
        if task not in ("count", "background"):
            assert len(large) == 1 and objs[0] is large[0]


def test_aro_files(out):
    root, _ = out
    aro = os.path.join(root, "aro")
    common = {"image_id", "image_path", "bbox_x", "bbox_y", "bbox_w", "bbox_h", "true_caption", "false_caption"}
    for name, extra in (("visual_genome_relation", "relation_name"), ("visual_genome_attribution", "attributes")):
        items = _load(os.path.join(aro, f"{name}.json"))
        assert len(items) == SIZES["n_items"]
        for item in items:
            assert set(item) == common | {extra}
            assert item["true_caption"] != item["false_caption"]
            assert sorted(item["true_caption"].split()) == sorted(item["false_caption"].split())  # order only
            assert os.path.isfile(os.path.join(aro, item["image_path"]))
            assert item["bbox_w"] == item["bbox_h"] == 32
        if extra == "attributes":
            assert all(len(i["attributes"]) == 2 and i["attributes"][0] != i["attributes"][1] for i in items)
        else:
            assert {i["relation_name"] for i in items} <= {"to the left of", "to the right of", "above", "below"}
    order = _load(os.path.join(aro, "coco_order_test.json"))
    assert len(order) == SIZES["n_items"]
    assert all(set(o) == {"image", "caption"} and len(o["caption"]) == 5 for o in order)
    assert all(os.path.isfile(os.path.join(aro, o["image"])) for o in order)


def test_load_options_hold_the_defaults_and_name_an_unknown_option(out):
    root, _ = out
    aro = os.path.join(root, "aro")
    paths = ("sugarcrepe_dir", "coco_val2017_dir", "aro_dir", "vg_image_dir", "coco_order_json", "coco_image_dir",
             "flickr_order_json", "flickr_image_dir")
    assert LoadOptions() == LoadOptions(**dict.fromkeys(paths, ""), on_missing="error", attribute_min_count=25,
                                        order_seed=0, tagger="auto")
    with pytest.raises(ValueError, match=r"unknown load_suites option 'aro'; known: \['sugarcrepe_dir'"):
        load_suites(root, aro=aro)
    names = ["aro_relation", "aro_attribute"]
    options = LoadOptions(aro_dir=aro, vg_image_dir=aro, attribute_min_count=1)
    real = load_suites(None, names, options)
    assert [s.data for s in real.values()] == ["real", "real"]
    for by_keyword in (load_suites(None, names, aro_dir=aro, vg_image_dir=aro, attribute_min_count=1),
                       load_suites(root, names, attribute_min_count=1)):  # the same files, read as synthetic
        assert all(by_keyword[n].candidates == real[n].candidates for n in names)
    strict = load_suites(None, ["aro_attribute"], options, attribute_min_count=25)  # a keyword over options
    default = load_suites(None, ["aro_attribute"], aro_dir=aro, vg_image_dir=aro)
    assert strict["aro_attribute"].candidates == default["aro_attribute"].candidates
    assert len(default["aro_attribute"].items) < len(real["aro_attribute"].items)  # ARO's 25 drops rare pairs


def test_sugarcrepe_files(out):
    root, _ = out
    folder = os.path.join(root, "sugarcrepe")
    for name in evalsets.SUGARCREPE_FILES:
        items = _load(os.path.join(folder, f"{name}.json"))
        assert list(items) == [str(i) for i in range(SIZES["n_items"])]
        for item in items.values():
            assert set(item) == {"filename", "caption", "negative_caption"}
            assert item["caption"] != item["negative_caption"]
            assert os.path.isfile(os.path.join(folder, "images", item["filename"]))
            pos, neg = Counter(item["caption"].split()), Counter(item["negative_caption"].split())
            if name.startswith("swap"):
                assert pos == neg  # same words, different binding
            elif name.startswith("add"):
                assert sum(neg.values()) > sum(pos.values())


def _phrases(text: str) -> list[list[str]]:
    """Object phrases of a SugarCrepe caption: the words after an article up to a shape word."""
    out, current = [], None
    for word in text.split():
        if word in ("a", "an"):
            current = []
        elif current is not None:
            current.append(word)
            if word in evalsets.SHAPES:
                out.append(current)
                current = None
    return out


def _true_of(phrase: list[str], scene: dict) -> bool:
    """Whether some object of the scene has the phrase's shape and every attribute it names."""
    for obj in scene["objects"]:
        if obj["shape"] == phrase[-1]:
            return set(phrase[:-1]) <= {evalsets._word(obj, k) for k in ("size", "texture", "colour")}
    return False


@pytest.mark.parametrize("kind", evalsets.SUGARCREPE_FILES)
def test_sugarcrepe_negatives_are_false(kind):
    """Positives hold for the scene; a negative names an absent object, a wrong attribute or relation."""
    for i in range(200):
        rng = np.random.default_rng(i)
        scene = scenes.sample_scene(rng, n_objects=int(rng.integers(2, 5)))
        pos, neg = evalsets._sugar_item(kind, scene, rng)
        assert all(_true_of(p, scene) for p in _phrases(pos)), pos
        if kind == "replace_rel":
            by_colour = {o["colour"]: o for o in scene["objects"]}
            a, b = (by_colour[p[0]] for p in _phrases(neg))
            name = neg.split(f"{a['colour']} {a['shape']} ")[1].split(" a")[0]
            rel = {v: k for k, v in evalsets.ARO_RELATION_NAMES.items()}[name]
            assert rel not in {"left of" if a["x"] < b["x"] else "right of", "above" if a["y"] < b["y"] else "below"}
        else:
            assert not all(_true_of(p, scene) for p in _phrases(neg)), (pos, neg)


def test_karpathy_captions(out):
    root, _ = out
    data = _load(os.path.join(root, "captions", "dataset_scenes.json"))
    splits = Counter(image["split"] for image in data["images"])
    assert splits == {"train": SIZES["n_caption_train"], "val": SIZES["n_items"], "test": SIZES["n_items"]}
    for image in data["images"]:
        assert {"filename", "filepath", "split", "imgid", "sentences"} <= set(image)
        assert os.path.isfile(os.path.join(root, "captions", image["filepath"], image["filename"]))
        assert len(image["sentences"]) >= 5
        assert all(s["tokens"] == word_tokens(s["raw"]) for s in image["sentences"])


def test_vocabulary_covers_every_evalset_text(out):
    root, _ = out
    texts = []
    for name in ("visual_genome_relation", "visual_genome_attribution"):
        for item in _load(os.path.join(root, "aro", f"{name}.json")):
            texts += [item["true_caption"], item["false_caption"]]
    texts += [c for o in _load(os.path.join(root, "aro", "coco_order_test.json")) for c in o["caption"]]
    for folder in ("sugarcrepe", os.path.join("own", "sugarcrepe")):  # the template and in-distribution files
        for name in evalsets.SUGARCREPE_FILES:
            for item in _load(os.path.join(root, folder, f"{name}.json")).values():
                texts += [item["caption"], item["negative_caption"]]
    for name in ("visual_genome_relation", "visual_genome_attribution"):
        texts += [c for item in _load(os.path.join(root, "own", f"{name}.json"))
                  for c in (item["true_caption"], item["false_caption"])]
    texts += [s["raw"] for i in _load(os.path.join(root, "captions", "dataset_scenes.json"))["images"]
              for s in i["sentences"]]
    for task in evalsets.PROBE_TASKS:
        with open(os.path.join(root, "probe", task, "classnames.txt")) as f:
            texts += f.read().splitlines()
    tok = get_tokenizer(context_length=77, vocab=vocabulary())
    for t in texts:
        tok.encode(t)
    assert tok.unknown_count == 0


def _digests(folder):
    out = set()
    for dirpath, _, files in os.walk(folder):
        for name in files:
            path = os.path.join(dirpath, name)
            if name.endswith(".tar"):
                with tarfile.open(path) as tar:
                    out |= {hashlib.sha1(tar.extractfile(m).read()).hexdigest() for m in tar if m.name.endswith(".png")}
            elif name.endswith(".png"):
                with open(path, "rb") as f:
                    out.add(hashlib.sha1(f.read()).hexdigest())
    return out


def test_eval_scenes_are_held_out(out, tmp_path):
    root, _ = out
    scenes.write_shards(str(tmp_path), 300, "alt", seed=0, image_size=32)
    train, held_out = _digests(str(tmp_path)), _digests(root)
    assert len(train) == 300 and len(held_out) > 1000
    assert not train & held_out


def test_same_seed_same_files(tmp_path):
    small = dict(image_size=24, n_probe_train=8, n_probe_test=8, n_items=3, n_caption_train=2)
    a = evalsets.write_evalsets(str(tmp_path / "a"), seed=7, **small)
    b = evalsets.write_evalsets(str(tmp_path / "b"), seed=7, **small)
    assert a == b
    for dirpath, _, files in os.walk(tmp_path / "a"):
        for name in files:
            other = os.path.join(str(tmp_path / "b"), os.path.relpath(os.path.join(dirpath, name), tmp_path / "a"))
            assert open(os.path.join(dirpath, name), "rb").read() == open(other, "rb").read()


def test_the_claims_probe_tasks_get_the_test_images_their_rule_sized(tmp_path, monkeypatch):
    """By default the tasks of the claims' mean4 get PROBE_TEST_ITEMS test images, the others PROBE_TEST_OTHER;
    a count given applies to every task."""
    from reproduce.claims.claim_rows import TASKS

    calls = []
    monkeypatch.setattr(evalsets, "_write_probe", lambda out, task, index, seed, size, sizes: calls.append((task, sizes)))
    kw = dict(seed=0, image_size=16, n_probe_train=2, n_items=1, n_caption_train=0)
    summary = evalsets.write_evalsets(str(tmp_path / "a"), **kw)
    sized = dict(calls)
    calls.clear()
    evalsets.write_evalsets(str(tmp_path / "b"), n_probe_test=3, **kw)
    assert set(evalsets.PROBE_TEST_ITEMS) == set(TASKS)
    assert {t: s["test"] for t, s in sized.items()} == {t: evalsets.PROBE_TEST_ITEMS.get(t, evalsets.PROBE_TEST_OTHER)
                                                         for t in evalsets.PROBE_TASKS}
    assert summary["probe"]["count"]["test"] == 2560 and summary["probe"]["relation"]["test"] == 1000
    assert len(calls) == len(evalsets.PROBE_TASKS) and all(s["test"] == 3 for _, s in calls)
