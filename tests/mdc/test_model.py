"""mdc.model: the captioner and CLIP, their configs, inputs and shapes."""
import math

import pytest
import torch

import mdc
from conftest import CAPTIONS, SMALL, small_model


def test_vit_b_32_forward_shapes():
    m = mdc.create_model("vit-b-32", objective="arc").eval()
    x = torch.randn(1, 3, 224, 224)
    tok = m.tokenizer(["a photo of a dog"])[:, :8]
    with torch.no_grad():
        assert m(x, tok).shape == (1, 8, 49409)
        assert m.forward_features(x).shape == (1, 49, 768)
        assert m.encode_image(x).shape == (1, 768)


@pytest.mark.parametrize("objective", ["mdc", "arc"])
def test_captioner_shapes(objective, images):
    m = small_model(objective)
    tok = m.tokenizer(CAPTIONS)
    V = m.tokenizer.vocab_size
    assert tok.shape == (4, 24)
    assert m(images, tok).shape == (4, 24, V)
    assert m.forward_features(images).shape == (4, 16, 64)
    feats = m.encode_image(images)
    assert feats.shape == (4, 64)
    torch.testing.assert_close(feats, m.forward_features(images).mean(1))  # GAP
    assert m.loss(images, tok).dim() == 0


def test_clip_shapes(images):
    m = small_model("clip")
    tok = m.tokenizer(CAPTIONS)
    img, txt, scale = m(images, tok)
    assert img.shape == txt.shape == (4, 64)
    torch.testing.assert_close(img.norm(dim=-1), torch.ones(4))
    assert m.encode_image(images).shape == (4, 64)  # CLS, pre-projection
    torch.testing.assert_close(m.encode_image(images), m.forward_features(images)[:, 0])
    with torch.no_grad():
        m.logit_scale.fill_(10.0)
        assert m.scale().item() == pytest.approx(math.exp(10.0))  # the forward does not clamp
        m.clamp_logit_scale()  # after the optimizer step, as open_clip
        assert m.scale().item() == pytest.approx(100.0)  # clamped like OpenCLIP


def _changed_positions(model, images, tokens, pos):
    """Positions whose logits change when the token at `pos` is replaced."""
    other = tokens.clone()
    other[:, pos] = model.tokenizer.mask_id
    with torch.no_grad():
        diff = (model(images, tokens) - model(images, other)).abs().amax(-1)[0]
    return set(torch.nonzero(diff > 1e-6).flatten().tolist())


def test_causal_decoder_ignores_future_tokens(images):
    m = small_model("arc").eval()
    tok = m.tokenizer(CAPTIONS[:1])
    assert min(_changed_positions(m, images[:1], tok, 4)) == 4  # positions < 4 unaffected


def test_bidirectional_decoder_sees_future_tokens(images):
    m = small_model("mdc").eval()
    tok = m.tokenizer(CAPTIONS[:1])
    assert {0, 1, 2, 3} <= _changed_positions(m, images[:1], tok, 4)


@pytest.mark.parametrize("kw, needle", [
    (dict(name="vit-z-99"), "vit-z-99"),
    (dict(objective="diffusion"), "diffusion"),
    (dict(t_interval=(0.5, 1.5)), "1.5"),
    (dict(t_interval=(0.9, 0.2)), "0.9"),
    (dict(mask_ratio=0.0), "mask_ratio"),
    (dict(bogus=1), "bogus"),
])
def test_bad_config_names_the_value(kw, needle):
    args = {"name": "tiny", "objective": "mdc", **SMALL, **kw}
    with pytest.raises(ValueError, match=needle):
        mdc.create_model(args.pop("name"), objective=args.pop("objective"), **args)


def test_bad_images_and_tokens(images):
    m = small_model()
    tok = m.tokenizer(CAPTIONS)
    with pytest.raises(ValueError, match=r"\[4, 3, 64, 64\]"):
        m(torch.randn(4, 3, 64, 64), tok)
    with pytest.raises(ValueError, match="30"):
        m(images, torch.zeros(4, 30, dtype=torch.long))


def test_tokenizer_truncates_the_clip_way():
    tok = mdc.get_tokenizer(context_length=8)
    row = tok(["one two three four five six seven eight nine"])[0]
    assert row.tolist()[0] == tok.sot_id and row.tolist()[-1] == tok.eot_id
    assert tok.decode(row) == "one two three four five six"
    full = mdc.get_tokenizer()
    assert (full.vocab_size, full.mask_id, full.context_length) == (49409, 49408, 77)


@pytest.mark.parametrize("bad, needle", [
    (lambda x: (x * 255).to(torch.uint8), "uint8"),
    (lambda x: x.double(), "float64"),
    (lambda x: x.masked_fill(torch.rand_like(x) < 0.01, float("nan")), "NaN"),
])
def test_images_of_the_wrong_kind_are_named(images, bad, needle):
    m = small_model()
    with pytest.raises(ValueError, match=needle):
        m.encode_image(bad(images))


def test_token_ids_out_of_range_are_named(images):
    m = small_model()
    tok = m.tokenizer(CAPTIONS)
    tok[1, 2] = m.tokenizer.vocab_size + 3
    with pytest.raises(ValueError, match=str(m.tokenizer.vocab_size + 3)):
        m(images, tok)
    with pytest.raises(ValueError, match="got -6"):
        small_model("clip").text_embedding(tok.clamp(max=5) - 6)


def test_clip_text_embedding_ignores_trailing_padding():
    m = small_model("clip").eval()
    tok = m.tokenizer(CAPTIONS)  # [4, 24], mostly padding
    with torch.no_grad():
        h = m.text(tok, causal=True)  # the untrimmed computation
        eot = (tok == m.tokenizer.eot_id).int().argmax(-1)
        full = torch.nn.functional.normalize(m.text_proj(h[torch.arange(4), eot]), dim=-1)
        torch.testing.assert_close(m.text_embedding(tok), full)


def test_folded_context_equals_copied_context(images):
    """Repeated rows are folded into longer query sequences, not copied: same logits either way."""
    from mdc.condition import ImageContext

    m = small_model().eval()
    tok = m.tokenizer(CAPTIONS)
    with torch.no_grad():
        ctx = m.context(images)
        rows = torch.tensor([0, 0, 0, 2, 2, 2])  # image 0 three times, image 2 three times
        folded = ctx.select(rows)
        copied = ImageContext([(k[rows], v[rows]) for k, v in ctx.kv])
        assert folded.fold == 3 and len(folded.kv[0][0]) == 2 and len(folded) == 6
        x = tok[[0, 1, 2, 0, 1, 2]]
        torch.testing.assert_close(m.logits(x, folded), m.logits(x, copied))
        uneven = ctx.select(torch.tensor([1, 1, 3]))  # runs of unequal length: copied
        assert uneven.fold == 1 and len(uneven.kv[0][0]) == 3
        beams = ctx.repeat(2)
        assert beams.fold == 2 and len(beams) == 8
        torch.testing.assert_close(m.logits(tok.repeat_interleave(2, 0), beams),
                                   m.logits(tok.repeat_interleave(2, 0), ctx.select(torch.arange(4).repeat_interleave(2))))


def test_conv_stem_makes_the_same_tokens_as_the_patch_projection(tmp_path):
    """vision_stem="conv": log2(patch) stride-2 convolutions in place of the patch projection; the token grid,
    the positions and the checkpoint round trip are those of a ViT with the same patch size."""
    x = torch.randn(3, 3, 64, 64)
    for patch, convs in ((8, 3), (16, 4)):
        conv = small_model("mdc", image_size=64, patch_size=patch, vision_stem="conv").eval()
        plain = small_model("mdc", image_size=64, patch_size=patch).eval()
        assert sum(isinstance(m, torch.nn.Conv2d) for m in conv.visual.patch_embed.modules()) == convs
        assert conv.forward_features(x).shape == plain.forward_features(x).shape == (3, (64 // patch) ** 2, 64)
    conv.save(tmp_path / "m")
    again = mdc.load(tmp_path / "m").eval()
    assert again.config.vision_stem == "conv" and torch.equal(again.encode_image(x), conv.encode_image(x))


@pytest.mark.parametrize("kw, needle", [(dict(vision_stem="resnet"), "resnet"),
                                        (dict(vision_stem="conv", patch_size=12, image_size=48), "power of 2")])
def test_bad_stems_are_named(kw, needle):
    with pytest.raises(ValueError, match=needle):
        small_model("mdc", **kw)
