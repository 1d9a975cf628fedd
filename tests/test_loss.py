"""MDC / ARC / CLIP objectives against hand computations."""
import pytest
import torch
import torch.nn.functional as F

from conftest import CAPTIONS, small_model
from mdc.absorbing import mdc_loss, sample_t
from mdc.contrastive import clip_loss
from mdc.tokenizer import caption_mask


def _hand_mdc(model, images, tokens, t, masked, weighted=True):
    """Eq. 5 with alpha_t = 1 - t, written out token by token."""
    tok = model.tokenizer
    noisy = tokens.masked_fill(masked, tok.mask_id)
    logp = F.log_softmax(model(images, noisy), dim=-1)
    total, n_caption = 0.0, 0
    for b in range(len(tokens)):
        for i in range(tokens.shape[1]):
            if caption_mask(tokens, tok.sot_id, tok.eot_id)[b, i]:
                n_caption += 1
                if masked[b, i]:
                    total += -logp[b, i, tokens[b, i]] / (t[b] if weighted else 1.0)
    return total / n_caption


@pytest.fixture
def fixed(images):
    model = small_model().eval()
    tokens = model.tokenizer(CAPTIONS)
    t = torch.tensor([0.5, 0.6, 0.9, 1.0])
    masked = caption_mask(tokens, model.tokenizer.sot_id, model.tokenizer.eot_id) & (
        torch.arange(tokens.shape[1]) % 2 == 1)
    return model, images, tokens, t, masked


def test_mdc_loss_matches_hand_computation(fixed):
    model, images, tokens, t, masked = fixed
    got = mdc_loss(model, images, tokens, t=t, u=(~masked).float())
    torch.testing.assert_close(got, _hand_mdc(model, images, tokens, t, masked))


def test_time_weighting_off_drops_exactly_one_over_t(fixed):
    model, images, tokens, t, masked = fixed
    model.config.time_weighting = False
    got = mdc_loss(model, images, tokens, t=t, u=(~masked).float())
    torch.testing.assert_close(got, _hand_mdc(model, images, tokens, t, masked, weighted=False))
    # with one caption the two differ by exactly the factor 1/t
    one = [x[:1] for x in (images, tokens, t, masked)]
    off = mdc_loss(model, *one[:2], t=one[2], u=(~one[3]).float())
    model.config.time_weighting = True
    on = mdc_loss(model, *one[:2], t=one[2], u=(~one[3]).float())
    torch.testing.assert_close(on, off / t[0])


def _captured_noisy(model, images, tokens, generator=None):
    seen = []
    hidden = model.hidden
    model.hidden = lambda x, ctx: (seen.append(x.clone()), hidden(x, ctx))[1]
    loss = mdc_loss(model, images, tokens, generator=generator)
    model.hidden = hidden
    return seen[0], loss


def test_mask_ratio_one_masks_every_caption_token(images):
    model = small_model(mask_ratio=1.0)
    tokens = model.tokenizer(CAPTIONS)
    noisy, _ = _captured_noisy(model, images, tokens)
    tok = model.tokenizer
    cap = caption_mask(tokens, tok.sot_id, tok.eot_id)[:, : noisy.shape[1]]
    assert (noisy[cap] == tok.mask_id).all()
    assert (noisy[~cap] == tokens[:, : noisy.shape[1]][~cap]).all()  # SOT, EOT, padding untouched


def test_masks_never_touch_padding_or_markers(images):
    model = small_model(t_interval=(0.0, 1.0))
    tokens = model.tokenizer(CAPTIONS)
    tok = model.tokenizer
    for seed in range(5):
        noisy, _ = _captured_noisy(model, images, tokens, torch.Generator().manual_seed(seed))
        cap = caption_mask(tokens, tok.sot_id, tok.eot_id)[:, : noisy.shape[1]]
        assert not (noisy[~cap] == tok.mask_id).any()


@pytest.mark.parametrize("objective", ["mdc", "arc"])
def test_padding_never_contributes(objective, images):
    """Padding length and padding content change nothing: not the loss, not the gradient."""
    model = small_model(objective)
    tokens = model.tokenizer(CAPTIONS)
    tok = model.tokenizer
    junk = tokens.clone()
    pad = ~caption_mask(tokens, tok.sot_id, tok.eot_id) & (tokens != tok.sot_id) & (tokens != tok.eot_id)
    junk[pad] = torch.randint(3, tok.mask_id, (int(pad.sum()),))
    losses, grads = [], []
    for t in (tokens, junk, tokens[:, :16]):  # as given, junk padding, less padding
        model.zero_grad()
        loss = model.loss(images, t, **({"generator": torch.Generator().manual_seed(1)} if objective == "mdc" else {}))
        loss.backward()
        losses.append(loss.detach())
        grads.append(model.head.weight.grad.clone())
    for loss, grad in zip(losses[1:], grads[1:]):
        torch.testing.assert_close(loss, losses[0])
        torch.testing.assert_close(grad, grads[0])


def test_stratified_t_covers_the_interval():
    cfg = small_model(t_sampling="stratified").config
    t = sample_t(8, cfg, torch.Generator().manual_seed(0)).sort().values
    strata = ((t - 0.5) / 0.5 * 8).floor()
    assert strata.tolist() == list(range(8))
    u = sample_t(10000, small_model().config, torch.Generator().manual_seed(0))
    assert 0.5 <= u.min() and u.max() <= 1.0 and abs(u.mean().item() - 0.75) < 0.01


def test_t_is_clamped_away_from_zero():
    cfg = small_model(t_interval=(0.0, 0.0001)).config
    assert sample_t(100, cfg).min() > 0


def test_arc_loss_is_teacher_forced_mean(images):
    model = small_model("arc").eval()
    tokens = model.tokenizer(CAPTIONS)
    tok = model.tokenizer
    total, n = 0.0, 0
    for b, cap in enumerate(CAPTIONS):
        ids = tok([cap])[0]
        L = int((ids == tok.eot_id).nonzero()[0]) + 1
        logp = F.log_softmax(model(images[b : b + 1], ids[None, : L - 1]), -1)[0]
        total -= logp[torch.arange(L - 1), ids[1:L]].sum()
        n += L - 1
    torch.testing.assert_close(model.loss(images, tokens), total / n)


def test_clip_loss_is_symmetric_infonce():
    torch.manual_seed(0)
    img, txt = F.normalize(torch.randn(5, 8), dim=-1), F.normalize(torch.randn(5, 8), dim=-1)
    logits = 10 * img @ txt.t()
    expect = sum(-F.log_softmax(logits, 1)[i, i] - F.log_softmax(logits, 0)[i, i] for i in range(5)) / 10
    torch.testing.assert_close(clip_loss(img, txt, torch.tensor(10.0)), expect)
    assert clip_loss(img, img, torch.tensor(10.0)) < clip_loss(img, txt, torch.tensor(10.0))


def test_t_min_clamp_keeps_the_weight_finite(images):
    from mdc.absorbing import T_MIN

    cfg = small_model(t_interval=(0.0, 1e-9)).config
    assert sample_t(1000, cfg, torch.Generator().manual_seed(0)).min() >= T_MIN
    model = small_model(t_interval=(0.0, 1e-9))
    loss = model.loss(images, model.tokenizer(CAPTIONS), generator=torch.Generator().manual_seed(0))
    assert torch.isfinite(loss)


def test_trim_multiple_buckets_lengths_and_leaves_the_loss_unchanged(images):
    from mdc.tokenizer import trim_padding

    model = small_model()
    tokens = model.tokenizer(CAPTIONS)  # [4, 24], longest caption 10 tokens with SOT/EOT
    assert trim_padding(tokens, model.tokenizer.eot_id).shape[1] == 10
    assert trim_padding(tokens, model.tokenizer.eot_id, 16).shape[1] == 16
    assert trim_padding(tokens, model.tokenizer.eot_id, 64).shape[1] == 24  # never past the context
    plain = model.loss(images, tokens, generator=torch.Generator().manual_seed(0))
    model.trim_multiple = 16
    noise = torch.rand(4, 16, generator=torch.Generator().manual_seed(0))[:, :10]
    bucketed = model.loss(images, tokens, t=torch.full((4,), 0.7), u=torch.cat([noise, torch.ones(4, 6)], 1))
    model.trim_multiple = 1
    torch.testing.assert_close(bucketed, model.loss(images, tokens, t=torch.full((4,), 0.7), u=noise))
    assert torch.isfinite(plain)
