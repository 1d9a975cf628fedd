"""The decoder options of the neighbouring-words study: the recorded self-attention, rotary positions
(``ModelConfig.positions``) and a hidden caption length (``ModelConfig.length_visible``)."""
import json
import math

import pytest
import torch
import torch._dynamo
import torch.nn.functional as F

import mdc
import mdc.distribution
from conftest import CAPTIONS, small_model
from mdc import autoregressive
from mdc.absorbing import ElboOptions, elbo_copies, heuristic_score, maskable_positions, mdc_loss
from mdc.autoregressive import arc_sample
from mdc.distribution import caption_log_probs
from mdc.tokenizer import caption_mask, trim_padding, valid_mask
from mdc.transformer import recording_attention, rotary_angles, rotate
from test_static_step import Reads


# ---------------------------------------------------------------------------- recording the attention
@pytest.mark.parametrize("objective", ("mdc", "arc", "clip"))
def test_recorded_attention_is_a_distribution_per_block_and_leaves_the_outputs_alone(objective):
    torch.manual_seed(0)
    model = small_model(objective).eval()
    text = model.text if objective == "clip" else model.decoder
    images, tokens = torch.randn(4, 3, 32, 32), model.tokenizer(CAPTIONS)[:, :12]
    run = (lambda: text(tokens, causal=True)) if objective == "clip" else (lambda: model(images, tokens))
    with torch.no_grad():
        plain = run()
        with recording_attention(text) as probs:
            recorded = run()
            run()  # a second forward call appends its own entries
    assert torch.equal(plain, recorded)
    assert len(probs) == 2 * len(text.blocks)
    assert all(p.dtype == torch.float32 and p.shape == (4, text.blocks[0].self_attn.heads, 12, 12) for p in probs)
    assert all(torch.allclose(p.sum(-1), torch.ones(p.shape[:-1])) for p in probs)
    if objective != "mdc":  # causal: nothing above the diagonal
        assert all((p.triu(1) == 0).all() for p in probs)
    else:  # bidirectional: nothing on the padding after [EOT]
        pad = ~valid_mask(tokens, model.tokenizer.eot_id)  # [B, L]
        assert all((p.transpose(1, 3)[pad] == 0).all() for p in probs)
    with torch.no_grad():
        run()
    assert len(probs) == 2 * len(text.blocks)  # nothing recorded once the context has closed


def test_recorded_rotary_attention_depends_on_offsets_only():
    """Rotary: the recorded probabilities are those of the rotated queries and keys, the same wherever the
    sequence starts; learned positions move them."""
    torch.manual_seed(0)
    tokens = small_model().tokenizer(CAPTIONS)[:, :10]
    for positions in ("rotary", "learned"):
        text = small_model("clip", positions=positions).eval().text
        with torch.no_grad(), recording_attention(text) as probs:
            text(tokens, causal=True)
            text(tokens, causal=True, start=7)
        n = len(text.blocks)
        moved = [not torch.allclose(a, b, atol=1e-5) for a, b in zip(probs[:n], probs[n:])]
        assert moved == [positions == "learned"] * n


# ---------------------------------------------------------------------------- rotary positions
def test_rotate_turns_each_half_split_pair_by_its_angle():
    """GPT-NeoX RoPE: feature j and j + d/2 are the real and imaginary parts of a complex number turned by
    p * base^(-2j/d) at position p."""
    d, positions = 8, torch.arange(5)
    x = torch.randn(2, 3, 5, d)
    got = rotate(x, rotary_angles(positions, d))
    theta = 10000.0 ** (-torch.arange(0, d, 2).float() / d)  # [d/2]
    z = torch.complex(x[..., : d // 2], x[..., d // 2 :]) * torch.polar(torch.ones(5, d // 2),
                                                                        positions[:, None] * theta)
    torch.testing.assert_close(got, torch.cat([z.real, z.imag], -1))
    torch.testing.assert_close(got.norm(dim=-1), x.norm(dim=-1))


@pytest.mark.parametrize("objective", ("mdc", "arc", "clip"))
def test_rotary_replaces_the_learned_embedding_in_every_text_transformer(objective):
    learned, rotary = small_model(objective), small_model(objective, positions="rotary")
    text = "text" if objective == "clip" else "decoder"
    assert f"{text}.pos" in learned.state_dict() and f"{text}.pos" not in rotary.state_dict()
    assert getattr(rotary, text).pos is None
    assert learned.num_params() - rotary.num_params() == learned.config.context_length * learned.config.text_width
    if objective != "clip":  # cross-attention to the image is unchanged: no rotation of the image keys
        assert all(b.cross_attn is not None for b in rotary.decoder.blocks)


def test_rotary_attention_sees_offsets_not_absolute_positions():
    """Shifting every position (``start``) changes nothing with rotary and everything with learned positions."""
    torch.manual_seed(0)
    for positions in ("rotary", "learned"):
        model = small_model("arc", positions=positions).eval()
        tokens, context = model.tokenizer(CAPTIONS)[:, :9], model.context(torch.randn(4, 3, 32, 32))
        with torch.no_grad():
            a = model.decoder(tokens, causal=True, context=context)
            b = model.decoder(tokens, causal=True, context=context, start=5)
        assert torch.allclose(a, b, atol=1e-5) == (positions == "rotary")


@pytest.mark.parametrize("beam_size", (1, 3))
def test_cached_rotary_decoding_equals_uncached_recomputation(beam_size, monkeypatch):
    """ARC's KV cache holds keys rotated at their absolute positions: each cached step's log-probabilities
    equal those of the decoder re-run on the whole prefix, and decoding with the re-run gives the same captions."""
    torch.manual_seed(0)
    model = small_model("arc", positions="rotary").eval()
    images, n, steps = torch.randn(4, 3, 32, 32), len(model.decoder.blocks), []
    cached = autoregressive._decode_step

    def both(model, tokens, context, cache, start):
        if len(cache) == n:  # one more list in the cache: arc_sample reorders it with the beams
            cache.append([])
        prefix = cache[n][:] = [tokens if start == 0 else torch.cat([cache[n][0], tokens], 1)]
        full = model.head(model.decoder(prefix[0], causal=True, context=context)[:, -1])
        full = caption_log_probs(full, model.tokenizer, allow_eot=True)  # [R, V], recomputed
        torch.testing.assert_close(cached(model, tokens, context, cache, start), full, rtol=1e-4, atol=1e-4)
        steps.append(start)
        return full

    plain = arc_sample(model, images, max_length=8, beam_size=beam_size)
    monkeypatch.setattr(autoregressive, "_decode_step", both)
    assert torch.equal(arc_sample(model, images, max_length=8, beam_size=beam_size), plain)
    assert steps[:2] == [0, 1]


def test_positions_are_validated_and_old_configs_load_as_learned(tmp_path):
    with pytest.raises(ValueError, match="positions.*'absolute'"):
        small_model(positions="absolute")
    with pytest.raises(ValueError, match="positions"):
        small_model(positions="rotary", text_width=6, text_heads=2)  # head width 3: no pairs to rotate
    model = small_model()
    model.save(tmp_path)
    saved = json.loads((tmp_path / "config.json").read_text())
    assert (saved["positions"], saved["length_visible"]) == ("learned", True)  # every field, defaults included
    del saved["positions"], saved["length_visible"]  # a config.json written before the two fields existed
    (tmp_path / "config.json").write_text(json.dumps(saved))
    loaded = mdc.load(tmp_path)
    assert (loaded.config.positions, loaded.config.length_visible) == ("learned", True)
    rotary = small_model(positions="rotary", length_visible=False)
    rotary.save(tmp_path / "rotary")
    loaded = mdc.load(tmp_path / "rotary")
    assert (loaded.config.positions, loaded.config.length_visible) == ("rotary", False)
    assert loaded.state_dict().keys() == rotary.state_dict().keys()


# ---------------------------------------------------------------------------- a hidden caption length
def test_maskable_positions_pad_to_the_context_and_keep_only_sot():
    visible, hidden = small_model(), small_model(length_visible=False)
    tok, C = hidden.tokenizer, hidden.config.context_length
    tokens = trim_padding(tok(CAPTIONS), tok.eot_id)  # [4, L'] as the loader gives them
    same, maskable = maskable_positions(visible, tokens)
    assert same is tokens and torch.equal(maskable, caption_mask(tokens, tok.sot_id, tok.eot_id))
    padded, maskable = maskable_positions(hidden, tokens)
    assert torch.equal(padded, tok(CAPTIONS)) and padded.shape == (4, C)
    assert not maskable[:, 0].any() and maskable[:, 1:].all()  # [EOT] and the padding too


def test_config_refuses_a_hidden_length_outside_absorbing_mdc():
    for kw in (dict(objective="arc"), dict(objective="clip"), dict(noise="mask_replace")):
        with pytest.raises(ValueError, match="length_visible"):
            small_model(length_visible=False, **kw)


def _hand_loss(model, images, tokens, t, masked):
    """Eq. 5 over every position but [SOT]: [EOT] and padding are targets like words; the normaliser is
    the maskable positions, B * (context - 1)."""
    logp = F.log_softmax(model(images, tokens.masked_fill(masked, model.tokenizer.mask_id)), -1)
    ce = -logp.gather(-1, tokens[..., None])[..., 0]  # [B, C]
    return (ce * masked / t[:, None]).sum() / (len(tokens) * (tokens.shape[1] - 1))


def test_hidden_length_loss_predicts_eot_and_padding_whatever_the_batch_carries(images):
    model = small_model(length_visible=False).eval()
    tok, full = model.tokenizer, model.tokenizer(CAPTIONS)  # [4, C]
    t = torch.tensor([0.5, 0.6, 0.9, 1.0])
    u = torch.rand(4, model.config.context_length)
    masked = (u < t[:, None]) & (torch.arange(full.shape[1]) > 0)
    assert (masked & ~valid_mask(full, tok.eot_id)).any()  # the padding is masked too
    want = _hand_loss(model, images, full, t, masked)
    torch.testing.assert_close(mdc_loss(model, images, full, t=t, u=u), want)
    torch.testing.assert_close(mdc_loss(model, images, trim_padding(full, tok.eot_id), t=t, u=u), want)


def test_hidden_length_attends_to_the_padding(images):
    """With the length hidden the padding is content: a changed [PAD] moves the states before [EOT]."""
    model = small_model(length_visible=False).eval()
    tokens = model.tokenizer(CAPTIONS)
    moved = tokens.clone()
    moved[:, -1] = model.tokenizer.mask_id
    with torch.no_grad():
        assert not torch.allclose(model(images, tokens)[:, :3], model(images, moved)[:, :3])


CASES = [dict(objective=o, positions="rotary") for o in ("mdc", "arc", "clip")] + [dict(length_visible=False),
                                                                                   dict(length_visible=False,
                                                                                        positions="rotary")]


@pytest.mark.parametrize("kw", CASES, ids=lambda kw: "-".join(f"{v}" for v in kw.values()))
def test_the_options_keep_the_loss_step_static(kw):
    """A loss forward/backward reads nothing off the device and traces as one graph (tests/mdc/test_static_step.py)."""
    model = small_model(**kw)
    images, tokens = torch.randn(4, 3, 32, 32), trim_padding(model.tokenizer(CAPTIONS), model.tokenizer.eot_id)
    with Reads() as reads:
        model.loss(images, tokens).backward()
    assert reads.found == []
    torch._dynamo.reset()
    explained = torch._dynamo.explain(model.loss)(images, tokens)
    assert (explained.graph_count, explained.graph_break_count) == (1, 0), explained.break_reasons


def _greedy_to_the_end(model, images):
    """Eq. 6 by hand for a hidden length: from [SOT] [MASK]*(C - 1), reveal the most confident position (over
    every id but [SOT] and [MASK]) until none is masked; then [PAD] after the first [EOT]."""
    tok, C = model.tokenizer, model.config.context_length
    x = torch.full((len(images), C), tok.mask_id)
    x[:, 0] = tok.sot_id
    with torch.no_grad():
        for _ in range(C - 1):
            logits = model(images, x)
            logits[..., [tok.sot_id, tok.mask_id]] = -math.inf
            conf, pred = logits.log_softmax(-1).max(-1)  # [B, C]
            conf[x != tok.mask_id] = -math.inf
            i = conf.argmax(-1)
            r = torch.arange(len(x))
            x[r, i] = pred[r, i]
    return x.masked_fill(~valid_mask(x, tok.eot_id), tok.pad_id)


def _likes_eot(model):
    """Make [EOT] the likely prediction from position 6 on and unlikely before (an untrained head rarely
    predicts it): one direction e added to the learned positions 6.. (subtracted before), [EOT]'s head row."""
    e = F.normalize(torch.randn(model.config.text_width), dim=0)
    with torch.no_grad():
        model.decoder.pos[1:6] -= 2 * e
        model.decoder.pos[6:] += 2 * e
        model.head.weight[model.tokenizer.eot_id] = 20 * e
    return model


def test_a_hidden_length_is_predicted_and_ends_at_the_first_eot(images):
    torch.manual_seed(0)
    model = _likes_eot(small_model(length_visible=False).eval())
    tok = model.tokenizer
    got = mdc.generate(model, images, length=None, return_tokens=True, precision="fp32")
    assert torch.equal(got, _greedy_to_the_end(model, images))
    assert (got[:, 6] == tok.eot_id).all() and (got[:, 1:6] != tok.eot_id).all()  # five words, then the end
    assert (got[:, 7:] == tok.pad_id).all() and (got != tok.mask_id).all()
    assert [len(c.split()) for c in tok.batch_decode(got)] == [5] * 4


def test_a_given_length_keeps_its_meaning_for_a_hidden_length_model(images):
    torch.manual_seed(0)
    model = _likes_eot(small_model(length_visible=False).eval())
    tok, C = model.tokenizer, model.config.context_length
    got = mdc.generate(model, images, length=8, return_tokens=True)  # [EOT] likely at 6..8, but not a word
    assert got.shape == (4, C) and (got[:, 0] == tok.sot_id).all() and (got[:, 9] == tok.eot_id).all()
    assert (got[:, 10:] == tok.pad_id).all()  # fixed padding
    assert not torch.isin(got[:, 1:9], torch.tensor([tok.eot_id, tok.mask_id, tok.sot_id, tok.pad_id])).any()


def test_length_none_needs_a_model_trained_with_the_length_hidden(images):
    for model in (small_model().eval(), small_model("arc").eval()):
        with pytest.raises(ValueError, match="trained with its caption length visible and needs a length"):
            mdc.generate(model, images, length=None)


def test_hidden_length_scorers_read_the_same_positions_as_the_loss(images):
    """The heuristic walks every position but [SOT] (C - 1 reveals, [EOT] and padding scored like words), on
    trimmed or padded captions alike; the ELBO's masked copies cover the same positions."""
    model = small_model(length_visible=False).eval()
    tok, C = model.tokenizer, model.config.context_length
    truth = tok(CAPTIONS)  # [4, C]
    expect = []
    with torch.no_grad():
        for img, row in zip(images, truth):
            x, total = row.clone()[None], 0.0
            x[0, 1:] = tok.mask_id
            for _ in range(C - 1):
                logits = model(img[None], x)[0]
                logits[:, [tok.sot_id, tok.mask_id]] = -math.inf
                logp = logits.log_softmax(-1)
                conf = logp.max(-1).values.masked_fill(x[0] != tok.mask_id, -math.inf)
                i = int(conf.argmax())
                total += float(logp[i, row[i]])
                x[0, i] = row[i]
            expect.append(total)
    got = mdc.score(model, images, CAPTIONS, method="heuristic")
    torch.testing.assert_close(got, torch.tensor(expect), rtol=1e-5, atol=1e-4)
    dist = mdc.distribution.encode(model, images)
    rows = torch.arange(4)
    torch.testing.assert_close(heuristic_score(model, dist, rows, truth), got)
    options = ElboOptions(num_samples=8)
    copies = elbo_copies(model, dist, rows, truth, options)  # [4, 1, 8], every copy inside the window
    torch.testing.assert_close(copies, elbo_copies(model, dist, rows, trim_padding(truth, tok.eot_id), options))
    assert (copies < 0).all()


def test_guidance_needs_a_visible_length(images):
    class Guided(mdc.distribution.CaptionDistribution):  # a distribution of its own, as MC-Diffusion's guide
        def select(self, rows):
            return Guided(self.model, self.context.select(rows))

    model = small_model(length_visible=False).eval()
    dist = Guided(model, model.context(images))
    with pytest.raises(ValueError, match="length visible"):
        heuristic_score(model, dist, torch.arange(4), model.tokenizer(CAPTIONS))
