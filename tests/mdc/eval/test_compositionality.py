"""Compositionality evaluation: the aggregation by hand, intervals, and end-to-end on tiny synthetic sets."""
import json
import warnings

import numpy as np
import pytest
import torch
from PIL import Image

import mdc.eval.compositionality as C
from mdc.eval import suite_scoring
from mdc.eval import accuracy
from conftest import small_model
from mdc.data.transforms import image_transform


def bootstrap_ci(correct, clusters=None, groups=None, resamples: int = 1000, seed=0, level: float = 0.95):
    """Percentile cluster-bootstrap interval of one accuracy, from the resamples Table 2's intervals use."""
    return accuracy.interval(accuracy.resample_stats(correct, clusters, groups, resamples, seed)[:, 0], level)


def _suite(name, groups, K=2, identical=None, data="synthetic", **item_fields):
    items = [{"id": i, "image_path": None, **{k: v[i] for k, v in item_fields.items()}} for i in range(len(groups))]
    cands = [[f"true {i}"] + [f"false {i} {k}" for k in range(1, K)] for i in range(len(groups))]
    return C.Suite(name, data, items, cands, list(groups), [f"{name}.json"], total=len(groups) + 1, missing=1,
                   chance=0.2 if K == 5 else 0.5, identical=identical)


def _scored(suite, heuristic, tokens, exact=None):
    scores = {"heuristic": np.array(heuristic, dtype=float)}
    if exact is not None:
        scores["exact"] = np.array(exact, dtype=float)
    return C.SuiteScores(suite, scores, np.array(tokens))


def test_correct_ties_and_length_normalisation():
    scores = np.array([[-3.0, -5.0, -5.0], [-4.0, -4.0, -5.0], [-6.0, -2.0, -5.0], [-4.0, -4.0, -1.0]])
    correct, ties = accuracy.correct_and_ties(scores)
    assert correct.tolist() == [True, False, False, False]
    assert ties.tolist() == [False, True, False, False]  # the last is beaten anyway: not lost by its tie
    # order task: a perturbation that is the true caption's very string is not a competitor
    scores = np.array([[-1.0, -2.0, -1.0, -3.0, -3.0], [-1.0, -2.0, -1.0, -3.0, -3.0]])
    identical = np.zeros((2, 5), bool)
    identical[0, 2] = True
    correct, ties = accuracy.correct_and_ties(scores, identical)
    assert correct.tolist() == [True, False] and ties.tolist() == [False, True]
    # ARO's order tasks (true caption first, np.argmax takes the first maximum): a tie at the top is correct
    correct, ties = accuracy.correct_and_ties(scores, identical, ties_win=True)
    assert correct.tolist() == [True, True] and ties.tolist() == [False, True]
    assert correct.tolist() == (np.argmax(scores, 1) == 0).tolist()
    assert accuracy.TIES_WIN == ("aro_coco_order", "aro_flickr30k_order")
    # heuristic/elbo divide by the caption tokens, exact also counts [EOT], cosine is unchanged
    s = C.SuiteScores(None, {"heuristic": np.array([[-6.0, -8.0]]), "exact": np.array([[-6.0, -8.0]]),
                             "cosine": np.array([[0.3, 0.2]])}, np.array([[3, 4]]))
    assert s.normalised("heuristic").tolist() == [[-2.0, -2.0]]  # a tie: an error
    assert s.normalised("exact").tolist() == [[-1.5, -1.6]]
    assert s.normalised("cosine").tolist() == [[0.3, 0.2]]


def test_aggregation_matches_a_hand_computation():
    relation = _suite("aro_relation", ["on", "on", "left of"], relation_name=["on", "on", "left of"])
    attribute = _suite("aro_attribute", ["red_blue"] * 2 + ["wet_dry"] * 3,
                       attributes=[("red", "blue")] * 2 + [("wet", "dry")] * 3)
    identical = np.zeros((2, 5), bool)
    identical[1, 3] = True
    order = _suite("aro_coco_order", ["", ""], K=5, identical=identical)
    for item, row in zip(order.items, identical):
        item["identical"] = row[1:].tolist()
    add_att, add_obj = _suite("sugarcrepe/add_att", [""] * 2), _suite("sugarcrepe/add_obj", [""] * 4)
    scored = {
        "aro_relation": _scored(relation, [[-1, -2], [-2, -1], [-1, -2]], [[2, 2]] * 3),  # on: 1/2, left of: 1/1
        "aro_attribute": _scored(attribute, [[-1, -2], [-2, -1], [-1, -2], [-1, -2], [-1, -2]], [[2, 2]] * 5),
        "aro_coco_order": _scored(order, [[0, -1, -1, -1, -1], [0, -1, -1, 0, -1]], [[5] * 5] * 2),
        # the negatives are longer: raw log-likelihood favours the true caption, per token it does not
        "sugarcrepe/add_att": _scored(add_att, [[-4, -4], [-4, -6]], [[2, 2], [2, 4]], exact=[[-4, -4], [-4, -6]]),
        "sugarcrepe/add_obj": _scored(add_obj, [[-4, -6]] * 4, [[2, 4]] * 4, exact=[[-3, -6]] * 4),
    }
    scored["aro_relation"].scores["exact"] = scored["aro_relation"].scores["heuristic"]
    for name in ("aro_attribute", "aro_coco_order"):
        scored[name].scores["exact"] = scored[name].scores["heuristic"]
    res = C.summarise(scored, attribute_min_count=2, resamples=200)
    col, sub = res["columns"], res["sugarcrepe_subsets"]
    h = {c: e["scores"]["heuristic"] for c, e in col.items()}
    assert h["aro_relation"]["accuracy"] == pytest.approx(0.75)  # macro (1/2 + 1) / 2, not 2/3
    assert h["aro_relation"]["per_group"] == {"left of": 1.0, "on": 0.5}
    assert h["aro_attribute"]["accuracy"] == pytest.approx(0.75)  # (1/2 + 3/3) / 2, not 4/5
    assert h["aro_coco_order"]["accuracy"] == 1.0  # the tie with an identical string is ignored
    add_att = sub["add_att"]["scores"]["heuristic"]
    assert add_att["accuracy"] == 0.5 and add_att["ties"] == 1
    assert h["sugarcrepe_add"]["accuracy"] == pytest.approx(5 / 6)  # item-weighted, not (1/2 + 1) / 2
    assert h["sugarcrepe_add"]["accuracy_lengthnorm"] == 0.0  # -2 vs -1.5 per token: all wrong
    assert col["sugarcrepe_add"]["scores"]["exact"]["accuracy_lengthnorm"] == pytest.approx(4 / 6)  # -3/3 > -6/5
    assert h["sugarcrepe_add"]["ties_lengthnorm"] == 1
    assert set(col) == {"aro_relation", "aro_attribute", "aro_coco_order", "sugarcrepe_add"}
    assert col["sugarcrepe_add"]["items"] == 6 and col["sugarcrepe_add"]["total"] == 8
    assert col["sugarcrepe_add"]["missing"] == 2 and col["aro_coco_order"]["chance"] == 0.2
    assert col["aro_relation"]["chance"] == 0.5 and col["aro_relation"]["candidates"] == 2
    assert res["table2"]["heuristic"]["aro_relation"] == pytest.approx(0.75)
    assert res["table2"]["exact_lengthnorm"]["sugarcrepe_add"] == pytest.approx(4 / 6)
    for entry in col.values():
        for s in entry["scores"].values():
            lo, hi = s["ci"]
            assert lo <= s["accuracy"] + 1e-12 and s["accuracy"] <= hi + 1e-12
    empty = _suite("aro_coco_order", [], K=5, identical=np.zeros((0, 5), bool))  # every image absent
    res_empty = C.summarise({"aro_coco_order": _scored(empty, np.zeros((0, 5)), np.zeros((0, 5), int))}, resamples=10)
    assert np.isnan(res_empty["columns"]["aro_coco_order"]["scores"]["heuristic"]["accuracy"])
    assert "| chance | 50 | 50 | 20 | 50 |" in C.markdown_table(res) and "paper" not in C.markdown_table(res)
    assert "add_obj" in C.markdown_table(res, section="sugarcrepe_subsets")


def test_bootstrap_interval_contains_the_estimate_and_shrinks():
    rng = np.random.default_rng(0)
    widths = []
    for n in (40, 4000):
        correct = rng.random(n) < 0.7
        lo, hi = bootstrap_ci(correct, resamples=300, seed=1)
        assert lo <= correct.mean() <= hi
        widths.append(hi - lo)
    assert widths[1] < widths[0] / 4  # ~ 1/sqrt(n): 10x narrower
    assert bootstrap_ci(correct, resamples=300, seed=1) == bootstrap_ci(correct, resamples=300, seed=1)
    # macro: the point estimate is the mean of group accuracies; the interval re-runs that mean
    groups = ["a"] * 10 + ["b"] * 90
    correct = np.array([True] * 10 + [False] * 90)
    lo, hi = bootstrap_ci(correct, groups=groups, resamples=300)
    assert lo == hi == 0.5  # every resample: (1 + 0) / 2
    assert np.isnan(bootstrap_ci([], resamples=10)[0])


def test_groups_are_fixed_once_and_not_refiltered_per_resample():
    """ARO drops attribute pairs under 25 items once, from the file. A pair with exactly the minimum
    count must stay in every resample (re-applying the filter per resample dropped it from ~45%)."""
    groups = ["red_blue"] * 5 + ["wet_dry"] * 5
    correct = np.array([1] * 5 + [0] * 5)
    stats = accuracy.resample_stats(correct, groups=groups, resamples=400, seed=0)[:, 0]
    assert (stats == 0.5).all()  # both pairs in every resample: (1 + 0) / 2


def test_the_image_is_the_resampling_unit():
    """Items of one image (COCO-Order's five captions) are drawn together: with outcomes constant within
    each of two images, every resample is 0, 1/2 or 1; drawn one by one, almost never."""
    correct = np.array([1] * 5 + [0] * 5)
    clusters = ["a.jpg"] * 5 + ["b.jpg"] * 5
    by_image = accuracy.resample_stats(correct, clusters, resamples=400, seed=0)[:, 0]
    assert set(np.round(by_image, 9)) <= {0.0, 0.5, 1.0}
    by_item = accuracy.resample_stats(correct, resamples=400, seed=0)[:, 0]
    assert np.isin(np.round(by_item, 9), [0.0, 0.5, 1.0]).mean() < 0.5
    # paired: the image's share, accuracy with - without it, from the same resamples
    d, lo, hi = accuracy.paired_difference(correct, np.zeros(10), clusters, resamples=400)
    assert d == 0.5 and lo == 0.0 and hi == 1.0
    assert accuracy.decode_outcomes(accuracy.encode_outcomes([True, False, True])).tolist() == [True, False, True]


def test_clustered_items_widen_the_interval_on_a_synthetic_suite():
    """1000 images x 5 captions, the captions of an image mostly sharing their outcome (an image that is
    hard is hard for all five): the item bootstrap's interval is ~1.9x too narrow here."""
    rng = np.random.default_rng(0)
    image_p = rng.beta(0.5, 0.5, size=1000)  # each image's chance of a correct caption
    correct = rng.random((1000, 5)) < image_p[:, None]
    clusters = np.repeat(np.arange(1000), 5)
    lo_c, hi_c = bootstrap_ci(correct.ravel(), clusters, resamples=1000)
    lo_i, hi_i = bootstrap_ci(correct.ravel(), resamples=1000)
    assert 1.6 < (hi_c - lo_c) / (hi_i - lo_i) < 2.2


def test_methods_must_fit_the_objective():
    assert C.resolve_methods("mdc") == ["elbo", "heuristic"] and C.resolve_methods("clip") == ["cosine"]
    assert C.resolve_methods("arc", "exact") == ["exact"]
    with pytest.raises(ValueError, match=r"'elbo'.*'arc'"):
        C.resolve_methods("arc", ["elbo"])
    with pytest.raises(ValueError, match=r"'cosine'.*'mdc'"):
        C.resolve_methods("mdc", "cosine")
    with pytest.raises(ValueError, match="unknown method 'bleu'"):
        C.resolve_methods("mdc", ["bleu"])
    assert C.variants(["elbo", "heuristic"]) == ["elbo", "elbo_trained_t", "heuristic"]
    assert C.variants(["elbo"], elbo_trained_t=False) == ["elbo"]
    assert small_model("mdc", mask_ratio=0.75).config.masking.trained_window == (0.75, 0.75)


def test_items_are_cropped_to_their_box(tmp_path):
    image = np.zeros((20, 40, 3), np.uint8)
    image[:, 20:] = 255  # right half white
    Image.fromarray(image).save(tmp_path / "a.png")
    items = [{"image_path": str(tmp_path / "a.png"), "bbox": (20, 0, 20, 20)}, {"image_path": str(tmp_path / "a.png")}]
    crops = suite_scoring._ImageCache(items, lambda im: torch.from_numpy(np.array(im)))  # one read, two crops
    crop, whole = (crops.batch([k])[0] for k in crops.keys)
    assert crop.shape == (20, 20, 3) and crop.min() == 255 and whole.shape == (20, 40, 3)


def test_load_suites_and_clear_errors(evalsets, tmp_path):
    suites = C.load_suites(evalsets, tagger="builtin", attribute_min_count=1)
    assert set(suites) == set(C.SUITES) - {"aro_flickr30k_order"}  # the synthetic world has no Flickr30k
    assert len(suites["aro_coco_order"].items) == 30 and len(suites["aro_coco_order"].candidates[0]) == 5
    assert suites["aro_coco_order"].tagger == "builtin" and suites["aro_relation"].data == "synthetic"
    assert list(C.load_suites(evalsets, ["sugarcrepe"], tagger="builtin")) == list(C.SUGARCREPE)
    with pytest.raises(ValueError, match=r"sugarcrepe_dir: .*nowhere does not exist"):
        C.load_suites(None, sugarcrepe_dir=str(tmp_path / "nowhere"), coco_val2017_dir=str(tmp_path))
    with pytest.raises(ValueError, match="aro_dir is set but vg_image_dir is empty"):
        C.load_suites(None, aro_dir=str(tmp_path))
    with pytest.raises(ValueError, match=r"visual_genome_relation\.json: file not found"):
        C.load_suites(None, aro_dir=str(tmp_path), vg_image_dir=str(tmp_path))
    with pytest.raises(ValueError, match="'aro_flickr30k_order' was asked for but has no data"):
        C.load_suites(evalsets, ["aro_flickr30k_order"])
    with pytest.raises(ValueError, match="both synthetic .* and real"):
        C.load_suites(evalsets, ["aro_coco_order"], coco_order_json=f"{evalsets}/aro/coco_order_test.json",
                      coco_image_dir=f"{evalsets}/aro", tagger="builtin")
    with pytest.raises(ValueError, match="unknown suite"):
        C.load_suites(evalsets, ["winoground"])
    real = C.load_suites(None, ["aro_coco_order"], coco_order_json=f"{evalsets}/aro/coco_order_test.json",
                         coco_image_dir=f"{evalsets}/aro", tagger="builtin")
    assert real["aro_coco_order"].data == "real"
    real = C.load_suites(None, aro_dir=f"{evalsets}/aro", vg_image_dir=f"{evalsets}/aro",
                         sugarcrepe_dir=f"{evalsets}/sugarcrepe", coco_val2017_dir=f"{evalsets}/sugarcrepe/images")
    assert set(real) == {"aro_relation", "aro_attribute", *C.SUGARCREPE}


def test_suites_count_missing_and_excluded_items(tmp_path):
    Image.new("RGB", (8, 8)).save(tmp_path / "1.jpg")
    box = dict(bbox_x=0, bbox_y=0, bbox_w=8, bbox_h=8, true_caption="the cat is on the mat",
               false_caption="the mat is on the cat")
    relation = [dict(box, image_path="1.jpg", relation_name="on"),
                dict(box, image_path="1.jpg", relation_name="next to"),  # symmetric
                dict(box, image_path="2.jpg", relation_name="on")]  # absent
    pairs = (["red", "blue"], ["red", "blue"], ["big", "small"])
    attribution = [dict(box, image_path="1.jpg", attributes=a) for a in pairs]
    for name, data in (("visual_genome_relation.json", relation), ("visual_genome_attribution.json", attribution)):
        (tmp_path / name).write_text(json.dumps(data))
    suites = C.load_suites(None, aro_dir=str(tmp_path), vg_image_dir=str(tmp_path), on_missing="skip",
                           attribute_min_count=2)
    rel, att = suites["aro_relation"], suites["aro_attribute"]
    assert (len(rel.items), rel.total, rel.missing, rel.excluded) == (1, 3, 1, 1)
    assert (len(att.items), att.total, att.missing, att.excluded) == (2, 3, 0, 1) and att.groups == ["red_blue"] * 2
    assert rel.items[0]["bbox"] == (0, 0, 8, 8)
    assert rel.candidates == [["the cat is on the mat", "the mat is on the cat"]]
    order = [{"image": name, "caption": ["a red cat on a mat", "a mat under a cat"]} for name in ("1.jpg", "2.jpg")]
    (tmp_path / "test.json").write_text(json.dumps(order))
    suite = C.load_suites(None, coco_order_json=str(tmp_path / "test.json"), coco_image_dir=str(tmp_path),
                          on_missing="skip", tagger="builtin")["aro_coco_order"]
    assert (len(suite.items), suite.total, suite.missing) == (2, 4, 2)  # an absent image drops its captions


def test_order_images_keeps_the_first_images_captions_unchanged(evalsets):
    full = C.load_suites(evalsets, ["aro_coco_order"], tagger="builtin")["aro_coco_order"]
    part = C.load_suites(evalsets, ["aro_coco_order"], tagger="builtin", order_images=2)["aro_coco_order"]
    first = list(dict.fromkeys(full.clusters))[:2]
    assert len(set(part.clusters)) == 2 and set(part.clusters) == set(first)
    assert (len(part.items), part.total, part.excluded) == (10, full.total, len(full.items) - 10)  # 5 captions an image
    # the kept items are the full suite's first ones, with their candidates, names and identical flags
    assert part.keys() == full.keys()[:10] and part.candidates == full.candidates[:10]
    assert (part.identical == full.identical[:10]).all()
    more = C.load_suites(evalsets, ["aro_coco_order"], tagger="builtin", order_images=99)["aro_coco_order"]
    assert more.excluded == 0 and more.keys() == full.keys()
    with pytest.raises(ValueError, match="order_images: at least 1 image"):
        C.load_suites(evalsets, ["aro_coco_order"], order_images=0)


def test_own_items_keeps_each_in_distribution_file_s_first_items_and_nothing_else(evalsets):
    full = C.load_suites(evalsets, ["own", "aro_relation"])
    part = C.load_suites(evalsets, ["own", "aro_relation"], own_items=3)
    for name, suite in part.items():
        whole = full[name]
        if not name.startswith("own"):  # the template suites keep every item
            assert suite.keys() == whole.keys() and suite.excluded == whole.excluded
            continue
        assert (len(suite.items), suite.total, suite.excluded) == (3, whole.total, len(whole.items) - 3), name
        assert suite.keys() == whole.keys()[:3] and suite.candidates == whole.candidates[:3]
        assert suite.groups == whole.groups[:3] and suite.clusters == whole.clusters[:3]
    with pytest.raises(ValueError, match="own_items: at least 1 item"):
        C.load_suites(evalsets, ["own"], own_items=0)


@pytest.mark.parametrize("objective", ["mdc", "arc", "clip"])
def test_end_to_end_on_synthetic_sets(evalsets, objective, tmp_path):
    suites = C.load_suites(evalsets, ["aro_relation", "aro_attribute", "aro_coco_order", "sugarcrepe"],
                           tagger="builtin", attribute_min_count=1)
    model, transform = small_model(objective), image_transform(32, train=False)
    methods = C.resolve_methods(objective)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # long synthetic captions exceed the tiny model's context
        scored = {n: C.score_suite(model, transform, s, methods, num_samples=2, batch_size=4)
                  for n, s in suites.items()}
    variants = list(C.method_variants(model, methods)) + [f"{v}_debiased" for v in C.variants(methods)
                                                          if objective != "clip" and v != "heuristic"]
    for name, s in scored.items():
        N, K = len(suites[name].items), len(suites[name].candidates[0])
        assert set(s.scores) == set(variants) and s.tokens.shape == (N, K) and (s.tokens > 0).all()
        assert all(a.shape == (N, K) and np.isfinite(a).all() for a in s.scores.values())
    res = C.summarise(scored, settings={"methods": methods}, attribute_min_count=1, resamples=50)
    order = res["columns"]["aro_coco_order"]
    assert order["images"] == order["items"] // 5 and order["ties"] == "win"  # five captions per image
    assert res["columns"]["sugarcrepe_add"]["images"] < res["columns"]["sugarcrepe_add"]["items"]  # shared images
    for column in res["columns"]:  # the records recompute every accuracy
        for v in variants:
            correct, clusters, groups, _ = accuracy.item_outcomes(res, column, v)
            assert len(correct) == len(clusters) == res["columns"][column]["items"]
            point = accuracy._point(correct[None].astype(float), groups)[0]
            assert point == pytest.approx(res["columns"][column]["scores"][v]["accuracy"])
            if column.startswith("sugarcrepe"):
                groups = accuracy.item_outcomes(res, column, v, macro=True)[2]
                assert np.mean([res["sugarcrepe_subsets"][f]["scores"][v]["accuracy"] for f in set(groups)]) == \
                    pytest.approx(res["columns"][column]["scores"][v]["accuracy_macro"])
                assert accuracy.over_seeds([res, res], column, v, resamples=20)[0] == pytest.approx(point)
    assert set(res["columns"]) == {"aro_relation", "aro_attribute", "aro_coco_order", "sugarcrepe_add",
                                   "sugarcrepe_replace", "sugarcrepe_swap"}
    assert set(res["table2"]) == {f"{v}{s}" for v in variants for s in ("", "_lengthnorm")}
    assert res["columns"]["aro_coco_order"]["tagger"] == "builtin"
    for entry in [*res["columns"].values(), *res["sugarcrepe_subsets"].values()]:
        for s in entry["scores"].values():
            assert 0.0 <= s["accuracy"] <= 1.0 and 0.0 <= s["accuracy_lengthnorm"] <= 1.0
    if objective == "mdc":  # keyed ELBO noise: an item's scores do not depend on the batch it is in
        rel = suites["aro_relation"]
        again = C.score_suite(model, transform, rel, ["elbo"], num_samples=2, batch_size=5, elbo_trained_t=False)
        np.testing.assert_allclose(again.scores["elbo"], scored["aro_relation"].scores["elbo"], rtol=1e-5, atol=1e-5)
        assert not np.allclose(scored["aro_relation"].scores["elbo"], scored["aro_relation"].scores["elbo_trained_t"])
    path = C.save_item_scores(str(tmp_path / "item_scores.npz"), scored)
    with np.load(path) as saved:
        assert saved["aro_relation/ids"].tolist() == [str(i["id"]) for i in suites["aro_relation"].items]
        np.testing.assert_array_equal(saved[f"aro_relation/{methods[0]}"], scored["aro_relation"].scores[methods[0]])


def test_elbo_and_its_trained_t_variant_are_scored_in_one_call():
    scoring = C.method_variants(small_model("mdc"), "auto")  # trained window (0.5, 1.0) by default
    calls = {tuple(v for v, _ in names): kw["elbo"].windows if "elbo" in kw else None
             for kw, names in suite_scoring._calls(scoring)}
    assert calls[("elbo", "elbo_trained_t")] == ((0.0, 1.0), (0.5, 1.0))
    assert calls[("elbo_blind", "elbo_trained_t_blind")] == ((0.0, 1.0), (0.5, 1.0))
    assert calls[("heuristic",)] is None


def test_a_method_that_does_not_fit_the_checkpoint_is_an_error(evalsets):
    suite = C.load_suites(evalsets, ["aro_relation"])["aro_relation"]
    with pytest.raises(ValueError, match=r"'exact'.*'clip'"):
        C.score_suite(small_model("clip"), image_transform(32, train=False), suite, ["exact"])
