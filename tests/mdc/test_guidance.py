"""MC-Diffusion guidance: condition dropout / masking in training (Alg. 1), CFG and MCS in sampling and scoring."""
import json

import numpy as np
import pytest
import torch

import mdc
from conftest import CAPTIONS, WORLD_SMALL, small_model
from mdc.absorbing import ABSORBING
from mdc.unmasking import masked_row, mdc_sample
from mdc.distribution import banned_ids, caption_log_probs
from mdc.eval.guidance_sweeps import bleu4
from mdc.mc_diffusion.guidance import Guide, encoder, partial_mask, scale_label, scale_of, strength_label, strength_of

GUIDED = dict(cond_drop_prob=0.1, cond_mask_prob=0.1)


def guided_model(**kw):
    return small_model(**{**GUIDED, **kw}).eval()


# ------------------------------------------------------------------ config and checkpoints
def test_defaults_create_no_new_parameters():
    plain = set(small_model().state_dict())
    assert not any(k.startswith("cond_") for k in plain)
    assert set(guided_model().state_dict()) - plain == {"cond_null", "cond_mask_token"}
    assert guided_model(vision_width=32).cond_mask_token.shape == (32,)  # a patch embedding, not a condition row
    assert set(small_model(cond_drop_prob=0.1).state_dict()) - plain == {"cond_null"}


def test_old_config_json_still_loads(tmp_path, images):
    model = small_model().eval()
    model.save(tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    new = ("cond_drop_prob", "cond_mask_prob", "cond_mask_select_prob", "noise", "diffusion_steps", "replace_prob",
           "aux_loss_weight", "vqvae")
    (tmp_path / "config.json").write_text(json.dumps({k: v for k, v in config.items() if k not in new}))
    loaded = mdc.load(tmp_path).eval()
    assert loaded.config.extensions == {} and loaded.noise == ABSORBING and loaded.condition_variants is None
    tokens = model.tokenizer(CAPTIONS)
    with torch.no_grad():
        assert torch.equal(loaded(images, tokens), model(images, tokens))


def test_guided_checkpoint_round_trip(tmp_path, images):
    model = guided_model()
    model.save(tmp_path)
    loaded = mdc.load(tmp_path)
    assert torch.equal(loaded.cond_null, model.cond_null) and torch.equal(loaded.cond_mask_token, model.cond_mask_token)
    a = mdc.generate(model, images, 5, guidance="mcs", guidance_scale=2.0, return_tokens=True)
    assert torch.equal(mdc.generate(loaded, images, 5, guidance="mcs", guidance_scale=2.0, return_tokens=True), a)


@pytest.mark.parametrize("kw, match", [
    (dict(cond_drop_prob=1.0), "cond_drop_prob must lie in \\[0, 1\\); got 1.0"),
    (dict(cond_mask_prob=-0.1), "cond_mask_prob must lie in \\[0, 1\\); got -0.1"),
    (dict(cond_drop_prob=0.5, cond_mask_prob=0.1, cond_mask_select_prob=0.6), "cond_mask_select_prob .* got 0.6"),
    (dict(noise="gaussian"), "noise must be .*'gaussian'"),
])
def test_bad_options_are_named(kw, match):
    with pytest.raises(ValueError, match=match):
        small_model(**kw)


def test_options_for_mdc_only():
    with pytest.raises(ValueError, match="extensions \\['guidance'\\] apply to 'mdc' captioners only; got objective 'arc'"):
        small_model("arc", cond_drop_prob=0.1)


# ------------------------------------------------------------------ training (Algorithm 1)
def test_training_condition_off_draws_nothing():
    g = torch.Generator().manual_seed(0)
    state = g.get_state()
    assert small_model().training_condition(8, g) == {}
    assert torch.equal(g.get_state(), state)


def test_training_condition_follows_algorithm_1():
    model = small_model(cond_drop_prob=0.3, cond_mask_prob=0.5, cond_mask_select_prob=0.2)
    cond = model.training_condition(20000, torch.Generator().manual_seed(1))
    null, mask = cond["null"], cond["token_mask"]  # [B], [B, T]
    assert mask.shape == (20000, (32 // 8) ** 2)
    selected = mask.any(1)
    assert not (null & selected).any()  # disjoint events: one uniform per caption
    assert abs(null.float().mean() - 0.3) < 0.015
    assert abs(selected.float().mean() - 0.2) < 0.015  # (a selected row with no token masked: 0.5^16)
    assert abs(mask[selected].float().mean() - 0.5) < 0.01


def test_loss_trains_the_condition_variants(images):
    model = small_model(cond_drop_prob=0.5, cond_mask_prob=0.5, cond_mask_select_prob=0.5)
    tokens = model.tokenizer(CAPTIONS * 4)
    model.loss(images.repeat(4, 1, 1, 1), tokens, generator=torch.Generator().manual_seed(0)).backward()
    assert model.cond_null.grad.abs().sum() > 0 and model.cond_mask_token.grad.abs().sum() > 0
    assert all(p.grad is not None for p in model.parameters() if p.requires_grad)  # DDP: every parameter used


def test_a_batch_without_masked_tokens_uses_every_parameter(images):
    """DDP needs every parameter in every step's graph: a batch whose captions all keep the full
    condition still runs the masked path (mask everywhere False) and is exactly the plain one."""
    model = small_model(cond_mask_prob=0.1, cond_mask_select_prob=1e-9)
    tokens = model.tokenizer(CAPTIONS)
    model.loss(images, tokens, generator=torch.Generator().manual_seed(0)).backward()
    assert model.cond_mask_token.grad is not None and not model.cond_mask_token.grad.any()
    assert all(p.grad is not None for p in model.parameters() if p.requires_grad)
    with torch.no_grad():
        keep = torch.zeros(len(images), 16, dtype=torch.bool)
        assert torch.equal(model.context(images, token_mask=keep)[0][0], model.context(images)[0][0])


def _keys(model, images, token_mask=None):
    """The first decoder block's cross-attention keys [B, T, W] of the (masked) condition."""
    k = model.context(images, token_mask=token_mask)[0][0]  # [B, heads, T, W/heads]
    return k.transpose(1, 2).flatten(2)


def test_mcs_mask_keeps_the_token_position(images):
    """MC-Diffusion sets y_i = [MASK] and keeps position i: a patch masked at i or at j gives two
    different decoder inputs, not the same mask vector in a different place (which the decoder's
    cross-attention, blind to the order of its keys, could not tell apart)."""
    model = guided_model()
    flat = torch.zeros(2, 3, 32, 32)  # every patch the same: only the position tells tokens apart
    i, j = 5, 10
    mask_i, mask_j = (torch.zeros(2, 16, dtype=torch.bool) for _ in range(2))
    mask_i[:, i], mask_j[:, j] = True, True
    with torch.no_grad():
        plain, at_i, at_j = _keys(model, flat), _keys(model, flat, mask_i), _keys(model, flat, mask_j)
    assert not torch.allclose(at_i[:, i], at_j[:, j], atol=1e-4)  # the masked token carries its position
    others = [k for k in range(16) if k not in (i, j)]
    assert not torch.allclose(at_i[:, others], at_j[:, others], atol=1e-4)  # masked before the encoder: others see it
    assert not torch.allclose(at_i[:, others], plain[:, others], atol=1e-4)


def test_masked_condition_is_the_patch_embedding_masked(images):
    """The ViT masks at the patch embedding: the learned mask token replaces the patch, then timm's
    position embedding is added and the encoder runs; the unmasked path is forward_features."""
    model = guided_model(cond_mask_prob=0.5)
    mask = partial_mask(model, len(images), seed=0)
    vit = model.visual
    with torch.no_grad():
        x = torch.where(mask[..., None], model.cond_mask_token, vit.patch_embed(images))
        expected = model.image_proj(vit.norm(vit.blocks(vit.norm_pre(vit.patch_drop(vit._pos_embed(x))))))
        assert torch.allclose(model.condition(images, token_mask=mask), expected, atol=1e-6)
        assert torch.equal(model.condition(images), model.image_proj(vit.forward_features(images)))


def test_null_condition_ignores_the_image(images):
    model = guided_model()
    tokens = model.tokenizer(CAPTIONS)
    null = torch.ones(len(images), dtype=torch.bool)
    with torch.no_grad():
        a = model.logits(tokens, model.context(images, null=null))
        b = model.logits(tokens, model.context(torch.randn_like(images), null=null))
        assert torch.allclose(a, b, atol=1e-5) and not torch.allclose(a, model(images, tokens), atol=1e-3)


# ------------------------------------------------------------------ guided sampling
@pytest.mark.parametrize("guidance, unguided", [("cfg", 1.0), ("mcs", 0.0), ("mcs_mirror", 1.0)])
def test_unguided_scale_is_plain_sampling(images, guidance, unguided):
    model = guided_model()
    plain = mdc.generate(model, images, 7, return_tokens=True)
    got = mdc.generate(model, images, 7, guidance=guidance, guidance_scale=unguided, return_tokens=True)
    assert torch.equal(got, plain)
    guided = mdc.generate(model, images, 7, guidance=guidance, guidance_scale=4.0, return_tokens=True)
    assert not torch.equal(guided, plain)


@pytest.mark.parametrize("guidance, scale", [("cfg", 2.5), ("mcs", 1.5), ("cfg", 1.0 + 1e-7), ("mcs_mirror", 2.5)])
def test_guided_distribution_is_the_papers_combination(images, guidance, scale):
    model = guided_model()
    tok = model.tokenizer
    x = masked_row(tok, len(images), 6, images.device)
    x[:, 2] = tok(["red"])[0, 1]  # one revealed token
    with torch.no_grad():
        got = Guide.of(model, images, guidance, scale, seed=3).log_probs(x)
        cond = caption_log_probs(model(images, x), tok)
        variant = dict(null=torch.ones(len(images), dtype=torch.bool)) if guidance == "cfg" else \
            dict(token_mask=partial_mask(model, len(images), seed=3))
        other = caption_log_probs(model.logits(x, model.context(images, **variant)), tok)
    allowed = [i for i in range(tok.vocab_size) if i not in banned_ids(tok)]
    w = 1 - scale if guidance == "mcs" else scale  # CFG: (1-g) null + g cond; MCS: g partial + (1-g) cond; mirror: w=g
    expected = torch.log_softmax(w * cond[..., allowed] + (1 - w) * other[..., allowed], -1)
    assert torch.allclose(got[..., allowed], expected, atol=1e-5)
    assert torch.isinf(got[..., banned_ids(tok)]).all()


def test_guided_sampling_batches_one_decoder_call_on_2b_rows(images):
    model = guided_model()
    calls, hidden = [], model.hidden
    model.hidden = lambda x, ctx: (calls.append(len(x)), hidden(x, ctx))[1]
    out = mdc_sample(model, images, 6, encode=encoder(model, "cfg", 3.0))
    assert calls == [2 * len(images)] * 6
    assert out.shape == (len(images), 8) and not (out == model.tokenizer.mask_id).any()


def test_mcs_masks_are_seeded(images):
    model = guided_model(cond_mask_prob=0.5)
    a = mdc.generate(model, images, 6, guidance="mcs", guidance_scale=3.0, guidance_seed=1, return_tokens=True)
    b = mdc.generate(model, images, 6, guidance="mcs", guidance_scale=3.0, guidance_seed=1, return_tokens=True)
    assert torch.equal(a, b)
    assert not torch.equal(partial_mask(model, 4, 1), partial_mask(model, 4, 2))
    assert abs(partial_mask(model, 2000, 0).float().mean() - 0.5) < 0.02


def test_temperature_sampling_under_guidance(images):
    model = guided_model()
    g = lambda: torch.Generator().manual_seed(5)  # noqa: E731
    a = mdc_sample(model, images, 6, temperature=0.7, generator=g(), encode=encoder(model, "cfg", 2.0))
    assert torch.equal(a, mdc_sample(model, images, 6, temperature=0.7, generator=g(),
                                     encode=encoder(model, "cfg", 2.0)))


# ------------------------------------------------------------------ guidance strength (distance from unguided)
def test_strength_is_the_distance_from_the_unguided_scale():
    """CFG at strength s is scale 1 + s, MCS as printed scale s (towards the masked condition), the
    mirrored MCS scale 1 + s (away from it, as CFG from the null)."""
    assert [scale_of(g, 2.0) for g in ("cfg", "mcs", "mcs_mirror")] == [3.0, 2.0, 3.0]
    assert [strength_of(g, 3.0) for g in ("cfg", "mcs", "mcs_mirror")] == [2.0, 3.0, 2.0]
    assert scale_of(None, None) is None and strength_of(None, None) is None


@pytest.mark.parametrize("guidance", ["cfg", "mcs", "mcs_mirror"])
def test_strength_zero_is_the_plain_model(images, guidance):
    model = guided_model()
    plain = mdc.generate(model, images, 7, return_tokens=True)
    assert torch.equal(mdc.generate(model, images, 7, guidance=guidance, guidance_strength=0.0, return_tokens=True),
                       plain)
    assert torch.equal(mdc.score(model, images, CAPTIONS, "heuristic", guidance=guidance, guidance_strength=0.0),
                       mdc.score(model, images, CAPTIONS, "heuristic"))
    by_scale = mdc.generate(model, images, 7, guidance=guidance, guidance_scale=scale_of(guidance, 3.0),
                            return_tokens=True)
    assert torch.equal(mdc.generate(model, images, 7, guidance=guidance, guidance_strength=3.0, return_tokens=True),
                       by_scale)


def test_mirrored_mcs_is_the_formula(images):
    """mcs_mirror at strength s: (1 + s) log p(x | y) - s log p(x | y_[M], y_o), renormalised."""
    model, s = guided_model(cond_mask_prob=0.5), 1.5
    tok = model.tokenizer
    x = masked_row(tok, len(images), 6, images.device)
    with torch.no_grad():
        got = Guide.of(model, images, "mcs_mirror", scale_of("mcs_mirror", s), seed=3).log_probs(x)
        cond = caption_log_probs(model(images, x), tok)
        masked = caption_log_probs(model.logits(x, model.context(images, token_mask=partial_mask(model, 4, 3))), tok)
        printed = Guide.of(model, images, "mcs", scale_of("mcs", s), seed=3).log_probs(x)
    allowed = [i for i in range(tok.vocab_size) if i not in banned_ids(tok)]
    expected = torch.log_softmax((1 + s) * cond[..., allowed] - s * masked[..., allowed], -1)
    assert torch.allclose(got[..., allowed], expected, atol=1e-5)
    towards = torch.log_softmax(s * masked[..., allowed] + (1 - s) * cond[..., allowed], -1)  # as printed
    assert torch.allclose(printed[..., allowed], towards, atol=1e-5) and not torch.allclose(got, printed, atol=1e-3)


def test_labels_name_the_rule_and_the_quantity():
    """cfg@1 was the plain model and mcs@0 too: a label now says whether it is a strength or a scale."""
    assert strength_label(None, None) == scale_label(None, None) == "none"
    assert strength_label("cfg", 2.0) == "cfg@s=2" and strength_label("mcs_mirror", 0.5) == "mcs_mirror@s=0.5"
    assert scale_label("cfg", 3.0) == "cfg@scale=3" and scale_label("mcs", 2.0) == "mcs@scale=2"
    labels = [f(g, v) for f in (strength_label, scale_label) for g in ("cfg", "mcs", "mcs_mirror") for v in (0, 1, 2)]
    assert len(set(labels)) == len(labels)


# ------------------------------------------------------------------ guided scoring
@pytest.mark.parametrize("method", ["heuristic", "elbo"])
def test_guided_scoring(images, method):
    model = guided_model()
    kw = dict(num_samples=8) if method == "elbo" else {}
    plain = mdc.score(model, images, CAPTIONS, method, **kw)
    for guidance, unguided in (("cfg", 1.0), ("mcs", 0.0)):
        assert torch.equal(mdc.score(model, images, CAPTIONS, method, guidance=guidance, guidance_scale=unguided, **kw),
                           plain)
    guided = mdc.score(model, images, CAPTIONS, method, guidance="cfg", guidance_scale=3.0, **kw)
    assert torch.isfinite(guided).all() and not torch.allclose(guided, plain)


def test_guided_scores_do_not_depend_on_the_batch(images):
    """MCS masks are keyed by the item like the ELBO noise: an item scores the same alone or in a batch."""
    model = guided_model(cond_mask_prob=0.5)
    cands = [[c, CAPTIONS[(i + 1) % 4]] for i, c in enumerate(CAPTIONS)]
    kw = dict(method="elbo", num_samples=4, guidance="mcs", guidance_scale=2.0, item_keys=["a", "b", "c", "d"])
    batch = mdc.score_candidates(model, images, cands, **kw)
    alone = mdc.score_candidates(model, images[2:3], cands[2:3], **{**kw, "item_keys": ["c"]})
    assert torch.allclose(batch[2], alone[0], atol=1e-5)


# ------------------------------------------------------------------ bad input
@pytest.mark.parametrize("kw, match", [
    (dict(guidance="classifier", guidance_scale=2.0), "unknown guidance 'classifier'"),
    (dict(guidance="cfg", guidance_scale=-0.5), "guidance_scale must be >= 0; got -0.5"),
    (dict(guidance="mcs", guidance_scale=float("nan")), "guidance_scale must be >= 0; got nan"),
    (dict(guidance="cfg"), "guidance='cfg' needs a guidance_strength .* or a guidance_scale"),
    (dict(guidance_scale=2.0), "guidance_scale = 2.0 given without guidance"),
    (dict(guidance_strength=2.0), "guidance_strength = 2.0 given without guidance"),
    (dict(guidance="mcs", guidance_scale=2.0, guidance_strength=2.0),
     "give guidance_strength or guidance_scale, not both"),
    (dict(guidance="mcs_mirror", guidance_strength=-1.0), "guidance_strength must be >= 0; got -1.0"),
])
def test_bad_guidance_is_named(images, kw, match):
    with pytest.raises(ValueError, match=match):
        mdc.generate(guided_model(), images, 5, **kw)


@pytest.mark.parametrize("guidance, option", [("cfg", "cond_drop_prob"), ("mcs", "cond_mask_prob"),
                                              ("mcs_mirror", "cond_mask_prob")])
def test_guidance_needs_the_matching_training(images, guidance, option):
    model = small_model(**{"cond_mask_prob" if guidance == "cfg" else "cond_drop_prob": 0.1})  # the other one only
    with pytest.raises(ValueError, match=f"needs a model trained with {option} > 0 .* has {option} = 0.0"):
        mdc.generate(model, images, 5, guidance=guidance, guidance_scale=2.0)
    with pytest.raises(ValueError, match=f"needs a model trained with {option} > 0"):
        mdc.score(model, images, CAPTIONS, "heuristic", guidance=guidance, guidance_scale=2.0)


def test_guidance_on_other_objectives_is_refused(images):
    with pytest.raises(ValueError, match="guidance applies to 'mdc' captioners; got objective 'arc'"):
        mdc.generate(small_model("arc"), images, 5, guidance="cfg", guidance_scale=2.0)
    with pytest.raises(ValueError, match="guidance applies to the MDC scorers .* got method 'exact'"):
        mdc.score(small_model("arc"), images, CAPTIONS, "exact", guidance="cfg", guidance_scale=2.0)


# ------------------------------------------------------------------ evaluation helpers (notebooks/guidance.ipynb)
def _results(clip=True):
    runs = [{"label": "none", "guidance": "none", "strength": None, "scale": None, "bleu4": 0.20, "meteor": 0.2,
             "cider": 0.5}]
    runs += [{"label": strength_label(g, s), "guidance": g, "strength": s, "scale": scale_of(g, s),
              "bleu4": 0.2 + 0.01 * s, "meteor": 0.2, "cider": 0.5 + s / 10}
             for g in ("cfg", "mcs", "mcs_mirror") for s in (1.0, 2.0, 3.0)]
    for i, r in enumerate(runs):
        r.update(clipscore=(0.8 - 0.02 * i) if clip else None, refclipscore=None, unavailable={})
    return {"runs": runs}


@pytest.mark.parametrize("clip", [True, False])
def test_tradeoff_figure_and_table(tmp_path, clip):
    from mdc.eval.guidance_sweeps import runs_markdown
    from mdc.plots import plot_guidance_tradeoff

    fig = plot_guidance_tradeoff(_results(clip), path=str(tmp_path / "fig.png"))
    assert (tmp_path / "fig.png").is_file() and (tmp_path / "fig.pdf").is_file()
    assert fig.axes[0].get_ylabel() == ("CLIPScore" if clip else "guidance strength (no CLIPScore)")
    assert len(fig.axes) == 3 and len(fig.axes[0].lines) == (4 if clip else 3)  # three rules (and the unguided star)
    legend = [t.get_text() for t in fig.legends[0].get_texts()]  # one legend, above the panels
    assert legend == ["CFG", "MCS (as printed)", "MCS (mirrored)"] + (["unguided"] if clip else [])
    for line in fig.axes[0].lines[:3]:  # every rule starts from the unguided model (strength 0)
        x, y = line.get_data()
        assert len(x) == 4 and x[0] == 20.0 and y[0] == (0.8 if clip else 0.0)
    table = runs_markdown(_results(clip)).splitlines()
    assert table[2].startswith("| none | 20.0 |") and table[2].endswith(("| 0.800 | - | - |", "| - | - | - |"))


def test_sweep_settings_and_missing_clip():
    from mdc.eval.guidance_sweeps import clipscore_sweep, sweep_settings

    assert sweep_settings([1, 2], ["mcs"]) == [(None, None), ("mcs", 1.0), ("mcs", 2.0)]  # (guidance, strength)
    assert len(sweep_settings([1.0])) == 4  # the three rules by default
    with pytest.raises(ValueError, match="unknown guidance 'pag'"):
        sweep_settings([1.0], ["cfg", "pag"])
    with pytest.raises(ValueError, match="guidance strengths must be >= 0; got -1"):
        sweep_settings([-1], ["cfg"])
    with pytest.raises(ValueError, match="strength 0 is the unguided run, which every sweep has"):
        sweep_settings([0, 1], ["cfg"])
    scores, info, why = clipscore_sweep("", [], {})
    assert scores is None and info is None and "no clip_checkpoint given" in why


def test_results_record_strength_and_scale():
    from mdc.eval.guidance_sweeps import guidance_results, sweep_settings

    settings = sweep_settings([2.0], ["cfg", "mcs", "mcs_mirror"])
    metrics = {strength_label(g, s): {"bleu4": 0.1, "meteor": None, "cider": 0.2, "unavailable": {}}
               for g, s in settings}
    runs = guidance_results(settings, metrics, None, None, "no CLIP", dataset={}, length=5)["runs"]
    assert [(r["label"], r["strength"], r["scale"]) for r in runs] == [
        ("none", None, None), ("cfg@s=2", 2.0, 3.0), ("mcs@s=2", 2.0, 2.0), ("mcs_mirror@s=2", 2.0, 3.0)]


@pytest.fixture(scope="module")
def sweep_items(tmp_path_factory):
    """Six synthetic test images (32 px) with five references each, as the guidance notebook loads them."""
    from mdc.eval import captioning as cap
    from mdc.world.evalsets import caption_source

    out = str(tmp_path_factory.mktemp("sweep"))
    source, fmt, root = caption_source("", "karpathy", "", out, 0, image_size=32, n_test=6)
    return cap.load_caption_items(source, fmt, root, "test")


def test_caption_sweep_shares_encodings_and_changes_no_caption(sweep_items):
    """The sweep's captions are, token for token, those of mdc.generate run on each setting alone
    (encoding every image again per setting, as the sweep did)."""
    from mdc.data.formats import load_image
    from mdc.eval.guidance_sweeps import caption_sweep, sweep_settings

    torch.manual_seed(0)
    model = small_model(cond_drop_prob=0.1, cond_mask_prob=0.5, **WORLD_SMALL).eval()
    settings = sweep_settings([1.0, 3.0])
    got = caption_sweep(model, sweep_items, settings, length=5, batch_size=4, seed=2)
    transform = mdc.image_transform(model)
    for start in range(0, len(sweep_items), 4):
        batch = sweep_items[start:start + 4]
        images = torch.stack([transform(load_image(it)) for it in batch])
        for g, s in settings:
            alone = mdc.generate(model, images, 5, guidance=g, guidance_strength=s, guidance_seed=2 + start)
            assert [got[strength_label(g, s)][it["image_id"]] for it in batch] == alone, (g, s)
    assert len({tuple(c.values()) for c in got.values()}) > 1  # guidance changed some captions


def test_clipscore_sweep_embeds_once_and_scores_as_before(tmp_path, sweep_items):
    from mdc.data.formats import load_image
    from mdc.eval.clipscore import clip_scores, load_clip
    from mdc.eval.guidance_sweeps import clipscore_sweep

    small_model("clip", **WORLD_SMALL).save(tmp_path / "clip")
    captions = {"none": {it["image_id"]: it["references"][0] for it in sweep_items},
                "cfg@s=1": {it["image_id"]: it["references"][1] for it in sweep_items}}
    scores, info, why = clipscore_sweep(str(tmp_path / "clip"), sweep_items, captions)
    clip, images = load_clip(str(tmp_path / "clip")), [load_image(it) for it in sweep_items]
    for label, caps in captions.items():  # each label scored alone, its images embedded again
        alone = clip_scores(clip, images, [caps[it["image_id"]] for it in sweep_items],
                            [it["references"] for it in sweep_items])
        assert scores[label]["clipscore"] == float(alone["clipscore"].mean())
        assert scores[label]["refclipscore"] == float(alone["refclipscore"].mean())
        assert scores[label]["per_image"] == alone["clipscore"].tolist()
    assert why is None and info["kind"] == "mdc" and len(info["checkpoint_id"]) == 16


def test_per_image_outcomes_give_the_corpus_metrics_and_intervals(sweep_items):
    """Mean per-image CIDEr is pycocoevalcap's CIDEr; summed BLEU counts give its corpus BLEU-4; the
    bootstrap intervals hold the point estimates; distances from the unguided captions."""
    from mdc.eval.captioning import evaluate_captions
    from mdc.eval.guidance_sweeps import guidance_results, reference_outcomes, run_intervals

    ids = [it["image_id"] for it in sweep_items]
    refs = {it["image_id"]: it["references"] for it in sweep_items}
    captions = {"none": {i: refs[i][0] for i in ids}, "cfg@s=2": {i: refs[i][1] for i in ids}}
    captions["cfg@s=2"][ids[0]] = captions["none"][ids[0]]  # one caption unchanged
    metrics = evaluate_captions(captions, refs, ["bleu", "cider"])
    outcomes = reference_outcomes(captions, refs, ids)
    for label in captions:
        assert np.mean(outcomes[label]["cider"]) == pytest.approx(metrics[label]["cider"], abs=1e-12)
        assert bleu4(np.array(outcomes[label]["bleu"])) == pytest.approx(metrics[label]["bleu4"], abs=1e-12)
    clip = {label: {"clipscore": 0.7, "refclipscore": 0.6, "per_image": [0.6, 0.8, 0.7, 0.65, 0.75, 0.7]}
            for label in captions}
    res = guidance_results([(None, None), ("cfg", 2.0)], metrics, clip, {}, None, dataset={}, length=5,
                           captions=captions, outcomes=outcomes, image_ids=ids)
    none, cfg = res["runs"]
    assert none["changed"] == none["word_edit"] == 0.0 and cfg["changed"] == pytest.approx(5 / 6)
    assert 0 < cfg["word_edit"] <= 5 / 6
    ci = run_intervals(res, resamples=200)
    for run in res["runs"]:
        for key in ("clipscore", "cider", "bleu4"):
            lo, hi = ci[run["label"]][key]
            assert lo <= run[key] + 1e-4 and run[key] <= hi + 1e-4
    assert ci["none"]["delta_clipscore"] == [0.0, 0.0]
    assert run_intervals({"runs": [{"label": "none"}]}) == {}  # older files: no per-image outcomes
