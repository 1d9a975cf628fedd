"""The decoder options of the neighbouring-words study: the recorded self-attention, rotary positions
(``ModelConfig.positions``) and a hidden caption length (``ModelConfig.length_visible``)."""
import json

import pytest
import torch
import torch._dynamo

import mdc
from conftest import CAPTIONS, small_model
from mdc import autoregressive
from mdc.autoregressive import arc_sample
from mdc.distribution import caption_log_probs
from mdc.tokenizer import trim_padding, valid_mask
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
    assert "positions" not in saved  # a default model writes what it always has
    assert mdc.load(tmp_path).config.positions == "learned"
    rotary = small_model(positions="rotary")
    rotary.save(tmp_path / "rotary")
    loaded = mdc.load(tmp_path / "rotary")
    assert loaded.config.positions == "rotary"
    assert loaded.state_dict().keys() == rotary.state_dict().keys()


CASES = [dict(objective=o, positions="rotary") for o in ("mdc", "arc", "clip")]


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
