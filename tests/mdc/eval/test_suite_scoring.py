"""Image-free baselines of the compositionality scores: blind and debiased variants, the warning, macro averages."""
import warnings
from collections import Counter

import numpy as np
import PIL.Image
import pytest
import torch

import mdc
import mdc.eval.compositionality as C
from mdc.eval import suite_scoring
from mdc.eval import accuracy
from conftest import small_model
from mdc.data.formats import load_image
from mdc.data.transforms import image_transform
from mdc.distribution import encode_null
from mdc.eval.suites import reference_images


def _score(model, suite, methods, **kw):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # long synthetic captions exceed the tiny model's context
        return C.score_suite(model.eval(), image_transform(32, train=False), suite, methods, num_samples=2,
                             batch_size=4, elbo_trained_t=False, **kw)


def test_every_likelihood_variant_gets_a_blind_baseline_of_the_right_kind():
    plain, guided = small_model(), small_model(cond_drop_prob=0.1)
    assert C.method_variants(plain, "auto")["heuristic_blind"]["image"] == "marginal"
    assert C.method_variants(guided, "auto")["heuristic_blind"]["image"] == "null"  # its learned null condition
    assert C.method_variants(small_model("arc"), "auto")["exact_blind"] == {"method": "exact", "image": "marginal"}
    assert set(C.method_variants(small_model("clip"), "auto")) == {"cosine"}  # not a likelihood
    cfg = C.with_blind(guided, {"cfg@2": dict(method="heuristic", guidance="cfg", guidance_scale=2.0)})
    assert cfg["cfg@2_blind"]["image"] == "marginal"  # a guided score's null is part of its rule: other images


def test_blind_scores_ignore_the_image_and_the_heuristic_is_not_debiased(evalsets):
    """The heuristic's blind score reveals in its own order, so raw - blind would subtract two scores
    of different orders: no debiased heuristic. The ELBO's pair shares its masked copies: debiased."""
    suite = C.load_suites(evalsets, ["aro_relation"])["aro_relation"]
    model = small_model(cond_drop_prob=0.1)
    out = _score(model, suite, ["heuristic", "elbo"], debias_alpha=0.5)
    assert set(out.scores) == {"heuristic", "heuristic_blind", "elbo", "elbo_blind", "elbo_debiased"}
    np.testing.assert_allclose(out.scores["elbo_debiased"], out.scores["elbo"] - 0.5 * out.scores["elbo_blind"])
    noise = torch.randn(len(suite.items), 3, 32, 32)  # any images: the null condition does not look at them
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        blind = mdc.score_candidates(model, noise, suite.candidates, "heuristic", encode=encode_null)
    np.testing.assert_allclose(out.scores["heuristic_blind"], blind.double().numpy(), rtol=1e-6, atol=1e-6)
    assert not np.allclose(out.scores["heuristic"], out.scores["heuristic_blind"])


def test_the_marginal_is_a_log_mean_exp_over_other_images_whatever_the_batch(evalsets):
    """log p(t) ~ log (1/K) sum_k p(t | i_k) over K reference images of the suite, never the item's own."""
    suite = C.load_suites(evalsets, ["aro_relation"])["aro_relation"]
    model = small_model("arc")
    a = _score(model, suite, ["exact"], blind_images=3)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        b = C.score_suite(model, image_transform(32, train=False), suite, ["exact"], batch_size=5, blind_images=3)
        pool, chosen = reference_images(suite, 3)
        assert chosen.shape == (len(suite.items), 3) and len(pool) == 4
        assert all(suite.clusters[pool[j]] != suite.clusters[i] for i, row in enumerate(chosen) for j in row)
        images = torch.stack([image_transform(32, train=False)(load_image(suite.items[p])) for p in pool])
        per_image = torch.stack([mdc.score_candidates(model, images[torch.as_tensor(chosen[:, k])], suite.candidates,
                                                      "exact").double() for k in range(3)])
    np.testing.assert_allclose(a.scores["exact_blind"], (per_image.logsumexp(0) - np.log(3)).numpy(), rtol=1e-5)
    np.testing.assert_allclose(a.scores["exact_blind"], b.scores["exact_blind"], rtol=1e-6, atol=1e-6)
    assert a.methods["exact_blind"] == "exact"  # length normalisation counts [EOT] for every exact variant
    np.testing.assert_allclose(a.normalised("exact_blind"), a.scores["exact_blind"] / (a.tokens + 1))


def test_the_null_condition_needs_a_model_trained_with_one(images):
    with pytest.raises(ValueError, match="cond_drop_prob > 0; this model has no learned null condition"):
        mdc.score(small_model(), images, ["a red circle"] * len(images), "heuristic", encode=encode_null)
    with pytest.raises(ValueError, match="either guidance or encode"):
        mdc.score(small_model(cond_drop_prob=0.1), images, ["a"] * len(images), "heuristic", guidance="cfg",
                  guidance_scale=2.0, encode=encode_null)


def _pairs(name, true_wins, blind_wins, same=0):
    n = len(true_wins)
    cands = [["a red circle", "a circle red" if i < same else "a blue square"] for i in range(n)]
    suite = C.Suite(name, "synthetic", [{"id": i} for i in range(n)], cands, [""] * n, [name], n)
    scores = {v: np.array([[0.0, -1.0] if w else [-1.0, 0.0] for w in wins])
              for v, wins in (("exact", true_wins), ("exact_blind", blind_wins))}
    return C.SuiteScores(suite, scores, np.full((n, 2), 3), methods={"exact": "exact", "exact_blind": "exact"})


def test_a_blind_accuracy_far_from_chance_is_flagged_and_sugarcrepe_has_its_macro_average():
    scored = {"sugarcrepe/add_att": _pairs("sugarcrepe/add_att", [1, 1, 1, 1], [1, 1, 1, 1], same=3),  # text decides
              "sugarcrepe/add_obj": _pairs("sugarcrepe/add_obj", [1, 0], [1, 0])}
    res = C.summarise(scored, resamples=20)
    add = res["columns"]["sugarcrepe_add"]
    assert add["scores"]["exact_blind"]["far_from_chance"] and not add["scores"]["exact"].get("far_from_chance")
    assert add["scores"]["exact"]["accuracy"] == pytest.approx(5 / 6)  # items pooled
    assert add["scores"]["exact"]["accuracy_macro"] == pytest.approx((1.0 + 0.5) / 2)  # the sub-files' mean
    assert res["sugarcrepe_subsets"]["add_obj"]["scores"]["exact_blind"]["far_from_chance"] is False  # 50%: chance
    assert add["same_words"] == 3 and res["sugarcrepe_subsets"]["add_obj"]["same_words"] == 0
    assert accuracy.same_words([["the horse eats the grass", "The grass eats the horse."], ["a b", "a c"]]) == 1


def test_guided_compositionality_reports_each_setting_blind_and_debiased(evalsets):
    from mdc.eval.guidance_sweeps import guided_compositionality

    model = small_model(cond_drop_prob=0.1, cond_mask_prob=0.1).eval()
    suites = C.load_suites(evalsets, ["aro_relation"])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        out = guided_compositionality(model, suites, [(None, None), ("cfg", 1.0)], batch_size=4, resamples=10)
    labels = {k.removesuffix("_lengthnorm") for k in out["table2"]}
    assert labels == {f"{run}{kind}" for run in ("none", "cfg@s=1") for kind in ("", "_blind")}  # heuristic: no debiased


def test_a_suite_left_without_items_scores_its_blind_variants_as_empty():
    suite = C.Suite("aro_attribute", "synthetic", [], [], [], ["x.json"], 3, excluded=3)
    out = C.score_variants(small_model("arc"), image_transform(32, train=False), suite,
                           C.method_variants(small_model("arc"), "auto"))
    assert {v: a.shape for v, a in out.scores.items()} == {v: (0, 0) for v in ("exact", "exact_blind", "exact_debiased")}
    assert out.suite.clusters == []


def test_the_image_free_elbo_keeps_the_first_budget():
    """Sequential copies are for the decisions with the image; an image-free score is a log-mean-exp over K
    images, whose error the K images dominate, so it stays at ``num_samples`` per image."""
    scoring = C.method_variants(small_model(), ["elbo"], num_samples=8, max_samples=64)
    assert scoring["elbo"]["elbo"].max_samples == 64 and scoring["elbo_trained_t"]["elbo"].max_samples == 64
    assert scoring["elbo_blind"]["elbo"].max_samples is None and scoring["elbo_trained_t_blind"]["elbo"].max_samples is None
    assert scoring["elbo_blind"]["elbo"].num_samples == 8


def test_the_shuffled_image_control_scores_each_item_with_another_items_image(evalsets):
    """<variant>_shuffled: the same scorer and noise keys with the image of shuffled_images(suite)[i], a fixed
    derangement (never the item's own image); the order suites' items of one image move together."""
    from mdc.eval.suites import shuffled_images
    suite = C.load_suites(evalsets, ["aro_relation"])["aro_relation"]
    other = shuffled_images(suite, seed=0)
    assert (other >= 0).all() and all(suite.clusters[j] != suite.clusters[i] for i, j in enumerate(other))
    assert (other == shuffled_images(suite, seed=0)).all() and not (other == shuffled_images(suite, seed=1)).all()
    order = C.load_suites(evalsets, ["aro_coco_order"])["aro_coco_order"]
    moved = shuffled_images(order, seed=0)
    assert all(order.clusters[j] != order.clusters[i] for i, j in enumerate(moved))
    model = small_model("arc")
    out = _score(model, suite, ["exact"], shuffled=True)
    assert {"exact", "exact_shuffled", "exact_blind", "exact_debiased"} <= set(out.scores)
    assert "exact_blind_shuffled" not in out.scores  # an image-free score has no image to shuffle
    images = torch.stack([image_transform(32, train=False)(load_image(suite.items[j])) for j in other])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        expected = mdc.score_candidates(model, images, suite.candidates, "exact").double().numpy()
    np.testing.assert_allclose(out.scores["exact_shuffled"], expected, rtol=1e-5, atol=1e-5)
    assert not np.allclose(out.scores["exact_shuffled"], out.scores["exact"])
    assert "exact_shuffled" not in _score(model, suite, ["exact"]).scores  # off unless asked for (Table 2 runs ask)


def _by_pair(suite, scores) -> dict:
    """{(image path, caption): score} of one suite's scores [N, K]."""
    return {(it["image_path"], c): x for it, cands, row in zip(suite.items, suite.candidates, scores)
            for c, x in zip(cands, row)}


def test_a_pair_scores_the_same_in_every_suite_that_holds_it(evalsets):
    """The ELBO's noise is keyed by the image, not by the item's place in a suite: a scene's true caption, a
    candidate of several in-distribution suites, scores the same in each, with its image and without."""
    suites = C.load_suites(evalsets, ["own_sugarcrepe/swap_att", "own_sugarcrepe/replace_att", "own_attribute"])
    model = small_model(cond_drop_prob=0.1)
    scored = [_score(model, s, ["elbo"]) for s in suites.values()]
    for v in ("elbo", "elbo_blind"):
        seen, shared = {}, 0
        for s in scored:
            for pair, x in _by_pair(s.suite, s.scores[v]).items():
                if pair in seen:
                    shared += 1
                    assert x == pytest.approx(seen[pair], rel=1e-5, abs=1e-5), (v, pair)
                seen[pair] = x
        assert shared >= len(suites["own_attribute"].items)


def test_a_pair_s_noise_is_its_image_s_key_and_the_seed(evalsets):
    """Score of (image, caption) = the ELBO with the image's content key: an image's candidates share their copies."""
    suite = C.load_suites(evalsets, ["own_sugarcrepe/replace_att"])["own_sugarcrepe/replace_att"]
    model = small_model().eval()
    out = _score(model, suite, ["elbo"], blind=False, seed=3)
    keys = suite_scoring.image_keys(suite.items)
    assert len(set(keys)) == len(set(suite.clusters)) and not any(suite.name in k for k in keys)
    images = torch.stack([image_transform(32, train=False)(load_image(suite.items[i])) for i in range(2)])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        expected = mdc.score_candidates(model, images, suite.candidates[:2], "elbo", num_samples=2, seed=3,
                                        item_keys=keys[:2])
    np.testing.assert_allclose(out.scores["elbo"][:2], expected.double().numpy(), rtol=1e-5, atol=1e-5)


def _counting(monkeypatch) -> list:
    """Record the captions of every scoring call of suite_scoring."""
    calls, score = [], suite_scoring.score_candidates

    def counted(model, images, candidates, **kw):
        calls.extend(c for cs in candidates for c in cs)
        return score(model, images, candidates, **kw)
    monkeypatch.setattr(suite_scoring, "score_candidates", counted)
    return calls


def test_score_suites_scores_each_distinct_pair_once(evalsets, monkeypatch):
    suites = C.load_suites(evalsets, "own")
    pairs = [(it["image_path"], c) for s in suites.values() for it, cs in zip(s.items, s.candidates) for c in cs]
    assert len(set(pairs)) < 0.7 * len(pairs)  # the in-distribution suites share their scenes' captions
    calls = _counting(monkeypatch)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        out = C.score_suites(small_model().eval(), image_transform(32, train=False), suites, ["elbo"], num_samples=2,
                             blind=False, elbo_trained_t=False)
    assert len(calls) == len(set(pairs)) and list(out) == list(suites)
    for name, s in out.items():
        assert s.suite is suites[name] and s.scores["elbo"].shape == (len(s.suite.items), 2)


@pytest.mark.parametrize("kw", [dict(blind_images=2, shuffled=True), dict(max_samples=4, blind=False)])
def test_a_suite_scores_the_same_alone_and_with_others_whatever_the_batch(evalsets, kw):
    """Every variant (raw, marginal blind, debiased, shuffled, sequential ELBO) of a suite is the same scored
    alone or with the suites that share its scenes, in calls of any size."""
    name = "own_sugarcrepe/swap_obj"
    suites = C.load_suites(evalsets, [name, "own_sugarcrepe/replace_att", "own_attribute"])
    model, transform = small_model().eval(), image_transform(32, train=False)
    options = C.suite_options(num_samples=2, elbo_trained_t=False, **kw)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        alone = C.score_suites(model, transform, {name: suites[name]}, ["elbo"], options, batch_size=3)
        together = C.score_suites(model, transform, suites, ["elbo"], options, batch_size=5)
    assert list(alone[name].scores) == list(together[name].scores)
    for v, x in alone[name].scores.items():
        np.testing.assert_allclose(x, together[name].scores[v], rtol=1e-5, atol=1e-5, err_msg=v)
    np.testing.assert_array_equal(alone[name].tokens, together[name].tokens)


def test_a_scoring_run_reads_each_image_file_once(evalsets, monkeypatch):
    """One pass reads every file the suites show, once, for the noise keys and the scored pixels together:
    the in-distribution suites show each scene whole and as a full-frame crop, and every variant (raw,
    marginal blind, shuffled) shows it again, from that one read."""
    suites = C.load_suites(evalsets, ["own_attribute", "own_sugarcrepe/replace_att"])
    paths = {it["image_path"] for s in suites.values() for it in s.items}
    opened, open_ = Counter(), PIL.Image.open
    monkeypatch.setattr(PIL.Image, "open", lambda fp, *a, **kw: opened.update([fp]) or open_(fp, *a, **kw))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        C.score_suites(small_model().eval(), image_transform(32, train=False), suites, ["elbo"], num_samples=2,
                       elbo_trained_t=False, blind_images=2, shuffled=True)
    assert opened == Counter(paths), "image files read more than once: " + str(
        sorted(n for n in opened.values() if n > 1))


def test_the_run_s_images_are_the_items_crops_keyed_by_their_pixels(evalsets):
    """The one read gives what the scorer scored before: per item its crop as the transform gives it and
    the noise key of the crop's pixels (_content_key), so recorded scores stay as they were, bit for bit."""
    suites = C.load_suites(evalsets, ["aro_relation", "own_attribute", "own_sugarcrepe/replace_att"])
    items, transform = [it for s in suites.values() for it in s.items], image_transform(32, train=False)
    images = suite_scoring._ImageCache(items, transform, workers=1)
    crops = [load_image(it) for it in items]
    assert images.keys == [suite_scoring._content_key(c) for c in crops] == suite_scoring.image_keys(items)
    assert torch.equal(images.batch(images.keys), torch.stack([transform(c) for c in crops]))  # [N, 3, 32, 32]
