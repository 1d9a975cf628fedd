"""mdc.absorbing: masking, the Eq. 5 loss, the Eq. 6 unmasking sampler, the Eq. 8 ELBO and the heuristic."""
import itertools
import math

import pytest
import torch
import torch.nn.functional as F

import mdc
import mdc.condition
from conftest import CAPTIONS, small_model
from mdc import absorbing
from mdc.scoring import elbo_sequential
from mdc.absorbing import ElboOptions, Masking, elbo_score, mdc_loss
from mdc.unmasking import masked_row, mdc_sample
from mdc.distribution import banned_ids, caption_log_probs
from mdc.tokenizer import caption_mask, trim_padding


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
    t = cfg.masking.sample(8, torch.Generator().manual_seed(0)).sort().values
    strata = ((t - 0.5) / 0.5 * 8).floor()
    assert strata.tolist() == list(range(8))
    u = small_model().config.masking.sample(10000, torch.Generator().manual_seed(0))
    assert 0.5 <= u.min() and u.max() <= 1.0 and abs(u.mean().item() - 0.75) < 0.01


def test_antithetic_t_pairs_each_draw_with_its_mirror():
    """u and 1 - u in pairs: each pair's ts sum to w_l + w_u, so the batch's mean t is exact for even n."""
    t = Masking((0.5, 1.0), "antithetic").sample(8, torch.Generator().manual_seed(0))
    torch.testing.assert_close(t[:4] + t[4:], torch.full((4,), 1.5))
    assert len(Masking(sampling="antithetic").sample(7)) == 7 and len(set(t.tolist())) == 8


def test_one_object_carries_the_masking_ratio_and_validates_it():
    """ModelConfig's masking fields come out as one Masking: a fixed ratio is image-conditioned BERT (its
    trained window (r, r)), time_weighting off gives weight 1; bad values are refused once, by Masking."""
    m = small_model(mask_ratio=0.4, time_weighting=False).config.masking
    assert m == Masking((0.5, 1.0), "uniform", 0.4, False) and m.trained_window == (0.4, 0.4)
    assert torch.equal(m.sample(3), torch.full((3,), 0.4)) and torch.equal(m.weight(m.sample(3)), torch.ones(3))
    t = torch.tensor([0.5, 0.8])
    assert torch.equal(Masking().weight(t), 1 / t) and Masking((0.3, 0.8)).trained_window == (0.3, 0.8)
    for bad, match in [(dict(interval=(0.2,)), "t_interval"), (dict(interval=(0.0, 0.0)), "t_interval"),
                       (dict(ratio=1.5), "mask_ratio"), (dict(sampling="sobol"), "t_sampling")]:
        with pytest.raises(ValueError, match=match):
            Masking(**bad)


def test_the_elbo_windows_are_always_a_tuple_of_pairs():
    assert ElboOptions().windows == ((0.0, 1.0),) and ElboOptions(windows=(0.5, 1)).windows == ((0.5, 1.0),)
    assert ElboOptions(windows=[(0, 1), (0.5, 1)]).several and not ElboOptions(windows=[(0.5, 1.0)]).several
    with pytest.raises(ValueError, match="windows"):
        ElboOptions(windows=(0.9, 0.1))
    with pytest.raises(ValueError, match="t_interval"):  # the old keyword is named, not silently dropped
        mdc.score(small_model().eval(), torch.zeros(1, 3, 32, 32), ["a red circle"], method="elbo", t_interval=(0, 1))


def test_t_is_clamped_away_from_zero():
    cfg = small_model(t_interval=(0.0, 0.0001)).config
    assert cfg.masking.sample(100).min() > 0


def test_t_min_clamp_keeps_the_weight_finite(images):
    from mdc.absorbing import T_MIN

    cfg = small_model(t_interval=(0.0, 1e-9)).config
    assert cfg.masking.sample(1000, torch.Generator().manual_seed(0)).min() >= T_MIN
    model = small_model(t_interval=(0.0, 1e-9))
    loss = model.loss(images, model.tokenizer(CAPTIONS), generator=torch.Generator().manual_seed(0))
    assert torch.isfinite(loss)


def test_the_padding_a_batch_carries_changes_no_mask_and_no_loss(images):
    """Tokens as the tokenizer pads them, cut to the longest caption, or to a multiple of 16 (as the training
    stream cuts them under --compile): the same masks from the same generator, the same loss."""
    from mdc.tokenizer import trim_padding

    model = small_model()
    tokens, eot = model.tokenizer(CAPTIONS), model.tokenizer.eot_id  # [4, 24], longest caption 10 with SOT/EOT
    assert trim_padding(tokens, eot).shape[1] == 10 and trim_padding(tokens, eot, 16).shape[1] == 16
    assert trim_padding(tokens, eot, 64).shape[1] == 24  # never past the context
    losses = [model.loss(images, x, generator=torch.Generator().manual_seed(0))
              for x in (tokens, trim_padding(tokens, eot), trim_padding(tokens, eot, 16))]
    torch.testing.assert_close(losses[1], losses[0])
    torch.testing.assert_close(losses[2], losses[0])


def _recording(model):
    """Wrap model.hidden (every decoder pass) to record the token rows it is called with."""
    calls, hidden = [], model.hidden
    model.hidden = lambda x, ctx: (calls.append(x.clone()), hidden(x, ctx))[1]
    return calls


def test_one_token_revealed_per_step(images):
    model = small_model().eval()
    calls = _recording(model)
    out = mdc_sample(model, images, length=7)
    tok = model.tokenizer
    assert len(calls) == 7  # N' steps
    rows = calls + [out]
    for before, after in zip(rows, rows[1:]):
        was, now = before == tok.mask_id, after == tok.mask_id
        assert ((was & ~now).sum(1) == 1).all()  # exactly one reveal per caption
        assert (after[~was] == before[~was]).all()  # revealed tokens stay fixed
    assert not (out == tok.mask_id).any()
    assert (out[:, 0] == tok.sot_id).all() and (out[:, -1] == tok.eot_id).all()
    assert not torch.isin(out[:, 1:-1], torch.tensor(banned_ids(tok))).any()


def test_tokens_per_step(images):
    model = small_model().eval()
    calls = _recording(model)
    mdc_sample(model, images, length=7, tokens_per_step=3)
    assert [int((c == model.tokenizer.mask_id).sum(1)[0]) for c in calls] == [7, 4, 1]


def test_cached_sampler_equals_plain_loop(images):
    """Encoding once and caching cross-attention K/V changes nothing."""
    model = small_model().eval()
    tok = model.tokenizer
    x = masked_row(tok, len(images), 9, images.device)
    with torch.no_grad():
        for _ in range(9):
            logits = model(images, x)  # full model, image re-encoded every step
            logits[..., banned_ids(tok)] = -math.inf
            conf, pred = F.softmax(logits, -1).max(-1)
            conf[x != tok.mask_id] = -1
            pos = conf.argmax(-1)
            x[torch.arange(len(x)), pos] = pred[torch.arange(len(x)), pos]
    assert torch.equal(mdc_sample(model, images, length=9), x)


def test_temperature_sampling_is_seeded(images):
    model = small_model().eval()
    a = mdc_sample(model, images, 6, temperature=1.0, generator=torch.Generator().manual_seed(3))
    b = mdc_sample(model, images, 6, temperature=1.0, generator=torch.Generator().manual_seed(3))
    assert torch.equal(a, b) and not (a == model.tokenizer.mask_id).any()


def test_threshold_decoding_reveals_every_confident_position(images):
    model = small_model().eval()
    calls = _recording(model)
    out = mdc_sample(model, images, length=8, threshold=1e-9)  # every position is confident enough
    assert len(calls) == 1 and not (out == model.tokenizer.mask_id).any()
    calls.clear()
    strict = mdc_sample(model, images, length=8, threshold=1.0)  # none is: one per step, as greedy
    assert len(calls) == 8 and torch.equal(strict, mdc_sample(model, images, length=8))
    with pytest.raises(ValueError, match="threshold"):
        mdc.generate(model, images, length=8, threshold=1.5)


def test_heuristic_equals_explicit_loop(images):
    model = small_model().eval()
    tok = model.tokenizer
    expect = []
    with torch.no_grad():
        for img, cap in zip(images, CAPTIONS):
            truth = tok([cap])
            L = int((truth[0] == tok.eot_id).nonzero()[0]) + 1
            truth = truth[:, :L]
            x = truth.clone()
            x[0, 1 : L - 1] = tok.mask_id
            total = 0.0
            for _ in range(L - 2):
                logp = caption_log_probs(model(img[None], x)[0], tok)  # [L, V], the sampler's distribution
                conf = logp.max(-1).values
                conf[x[0] != tok.mask_id] = -math.inf
                i = int(conf.argmax())
                total += float(logp[i, truth[0, i]])
                x[0, i] = truth[0, i]
            expect.append(total)
    got = mdc.score(model, images, CAPTIONS, method="heuristic")
    torch.testing.assert_close(got, torch.tensor(expect), rtol=1e-5, atol=1e-4)


def _exact_bound(model, image, cap, t_interval=(0.0, 1.0)):
    """Eq. 8 by enumerating every mask subset of a short caption (the counts n with n / N in ``t_interval``)."""
    tok = model.tokenizer
    ids = tok([cap])
    ids = ids[:, : int((ids[0] == tok.eot_id).nonzero()[0]) + 1]
    pos = caption_mask(ids, tok.sot_id, tok.eot_id)[0].nonzero().flatten().tolist()
    N, bound = len(pos), 0.0
    with torch.no_grad():
        for n in range(max(1, math.ceil(t_interval[0] * N - 1e-9)), math.floor(t_interval[1] * N + 1e-9) + 1):
            subsets = list(itertools.combinations(pos, n))
            for sub in subsets:
                x = ids.clone()
                x[0, list(sub)] = tok.mask_id
                logp = caption_log_probs(model(image[None], x)[0], tok)
                bound += sum(float(logp[i, ids[0, i]]) for i in sub) / n / len(subsets)
    return bound


@pytest.mark.parametrize("stratified", [True, False])
def test_elbo_converges_to_the_enumerated_bound(images, stratified):
    model = small_model().eval()
    caps = ["a red circle", "two blue squares"]
    exact = torch.tensor([_exact_bound(model, images[i], c) for i, c in enumerate(caps)])
    est = mdc.score(model, images[:2], caps, method="elbo", num_samples=3000, max_rows=512, stratified=stratified)
    torch.testing.assert_close(est, exact, rtol=0.02, atol=0.05)


def test_elbo_and_trained_t_from_one_set_of_masked_copies(images):
    """Both bounds from one call: the ELBO's numbers bitwise those of a call for it alone; the trained-t
    bound from the copies whose mask count falls in its range, unbiased for the same sum (the enumerated
    bound), with the Monte-Carlo error of a dedicated estimate of about S x (its share of counts) copies."""
    model = small_model().eval()
    caps = ["a red circle", "two blue squares"]
    both = mdc.score(model, images[:2], caps, method="elbo", num_samples=64, windows=[(0.0, 1.0), (0.5, 1.0)])
    assert both.shape == (2, 2)
    assert torch.equal(both[:, 0], mdc.score(model, images[:2], caps, method="elbo", num_samples=64))
    exact = torch.tensor([_exact_bound(model, images[i], c, (0.5, 1.0)) for i, c in enumerate(caps)])
    shared = mdc.score(model, images[:2], caps, method="elbo", num_samples=3000, max_rows=512,
                       windows=[(0.0, 1.0), (0.5, 1.0)])[:, 1]
    alone = mdc.score(model, images[:2], caps, method="elbo", num_samples=3000, max_rows=512, windows=(0.5, 1.0))
    torch.testing.assert_close(shared, exact, rtol=0.02, atol=0.05)  # per item: the old and the new estimate
    torch.testing.assert_close(alone, exact, rtol=0.02, atol=0.05)   # agree with the same bound


def test_elbo_is_seeded_and_its_spread_shrinks_like_inverse_sqrt_n(images):
    model = small_model().eval()
    tokens = model.tokenizer(CAPTIONS)[:, :12]
    rows = torch.arange(len(images))
    with torch.no_grad():
        ctx = model.context(images)
        a = elbo_score(model, ctx, rows, tokens, ElboOptions(num_samples=16, seed=7))
        b = elbo_score(model, ctx, rows, tokens, ElboOptions(num_samples=16, seed=7))
        c = elbo_score(model, ctx, rows, tokens, ElboOptions(num_samples=16, seed=8))
        assert torch.equal(a, b) and not torch.equal(a, c)
        spread = {n: torch.stack([elbo_score(model, ctx, rows, tokens, ElboOptions(n, seed=s), max_rows=1024)
                                  for s in range(40)]).std(0).mean().item() for n in (8, 128)}
    ratio = spread[8] / spread[128]  # sqrt(128 / 8) = 4
    assert 2.5 < ratio < 6.5, ratio


def test_elbo_batching_does_not_change_the_estimate(images):
    model = small_model().eval()
    a = mdc.score(model, images, CAPTIONS, method="elbo", num_samples=32, max_rows=7)
    b = mdc.score(model, images, CAPTIONS, method="elbo", num_samples=32, max_rows=1000)
    torch.testing.assert_close(a, b)


def test_heuristic_reveals_in_the_samplers_order(images):
    """On the sampler's own caption, the heuristic scorer walks the very same unmasking path."""
    from mdc.absorbing import heuristic_score

    model = small_model().eval()
    seen = {"sampler": [], "scorer": []}
    hidden = model.hidden
    for name in seen:
        model.hidden = lambda x, ctx, name=name: (seen[name].append(x.clone()), hidden(x, ctx))[1]
        if name == "sampler":
            tokens = mdc_sample(model, images, length=8)
        else:
            with torch.no_grad():
                heuristic_score(model, model.context(images), torch.arange(len(images)), tokens)
    assert len(seen["sampler"]) == len(seen["scorer"]) == 8
    for a, b in zip(seen["sampler"], seen["scorer"]):
        assert torch.equal(a, b)


def test_elbo_restricted_to_trained_ratios(images):
    """The window (0, 1) is Eq. 8 itself; a narrower window sums only the mask counts it covers."""
    model = small_model().eval()
    full = mdc.score(model, images[:2], CAPTIONS[:2], method="elbo", num_samples=64)
    same = mdc.score(model, images[:2], CAPTIONS[:2], method="elbo", num_samples=64, windows=(0.0, 1.0))
    torch.testing.assert_close(full, same)
    part = mdc.score(model, images[:2], CAPTIONS[:2], method="elbo", num_samples=64, windows=(0.5, 1.0))
    assert (part > full).all()  # fewer (negative) terms


def test_elbo_chunks_fold_the_image_context(images, monkeypatch):
    """Chunks align to captions, so a chunk's masked copies share folded image keys/values."""
    from mdc.absorbing import _chunks

    assert _chunks(3, 4, 10) == [slice(0, 8), slice(8, 12)]
    assert _chunks(2, 5, 2) == [slice(0, 2), slice(2, 4), slice(4, 5), slice(5, 7), slice(7, 9), slice(9, 10)]
    model = small_model().eval()
    folds = []
    select = mdc.condition.ImageContext.select
    monkeypatch.setattr(mdc.condition.ImageContext, "select", lambda self, rows: (folds.append(
        select(self, rows).fold), select(self, rows))[1])
    a = mdc.score(model, images, CAPTIONS, method="elbo", num_samples=8, max_rows=16)
    assert set(folds) == {8}  # every chunk folds its 8 copies per caption onto one image
    monkeypatch.undo()
    torch.testing.assert_close(a, mdc.score(model, images, CAPTIONS, method="elbo", num_samples=8, max_rows=5))


@pytest.mark.parametrize("N, t_interval, counts", [
    (25, (0.6, 1.0), range(15, 26)),  # float32: ceil(0.6 * 25) = ceil(15.0000006) = 16
    (50, (0.3, 1.0), range(15, 51)),
    (75, (0.36, 0.84), range(27, 64)),  # float32 gets both ends wrong: 28 and 62
    (20, (0.5, 0.5), range(10, 11)),
    (6, (1 / 3, 2 / 3), range(2, 5)),
    (7, (0.0, 0.1), range(1, 2)),  # at least one masked token
])
def test_elbo_interval_bounds_are_exact(N, t_interval, counts, monkeypatch):
    """The mask counts n of elbo_trained_t are exactly those with n / N in [w_l, w_u] (ceil / floor
    of w * N in exact arithmetic, not float32's)."""
    model = small_model(context_length=77).eval()
    tok = model.tokenizer
    word = tok(["red"])[0, 1]
    tokens = torch.tensor([[tok.sot_id] + [int(word)] * N + [tok.eot_id]])
    seen = []
    corrupt = absorbing.corrupt
    monkeypatch.setattr(absorbing, "corrupt", lambda *a, n=None, **kw: (seen.append(n), corrupt(*a, n=n, **kw))[1])
    with torch.no_grad():
        elbo_score(model, model.context(torch.randn(1, 3, 32, 32)), torch.zeros(1, dtype=torch.long), tokens,
                   ElboOptions(num_samples=4 * len(counts), windows=t_interval))
    assert sorted(set(torch.cat(seen).tolist())) == list(counts)


def _rounds_by_hand(model, images, cands, S0, S_max):
    """The sequential estimate when every item is unsure: round 0 is the fixed estimate (item keys), round
    r >= 1 draws as many copies again (keys (item, r)); the score is the mean over all copies."""
    tok = model.tokenizer
    flat = [c for cs in cands for c in cs]
    tokens = trim_padding(tok(flat), tok.eot_id)
    K = len(cands[0])
    rows = torch.arange(len(images)).repeat_interleave(K)
    ctx = model.context(images)
    total, n, r = 0.0, 0, 0
    while n < S_max:
        size = S0 if r == 0 else min(n, S_max - n)
        keys = [i if r == 0 else (i, r) for i in range(len(images)) for _ in range(K)]
        total = total + size * elbo_score(model, ctx, rows, tokens, ElboOptions(size), keys=keys)
        n, r = n + size, r + 1
    return (total / n).view(len(images), K)


def test_sequential_elbo_adds_rounds_only_where_the_decision_is_unsure(images):
    from mdc.scoring import score_candidates

    model = small_model().eval()
    cands = [[c, CAPTIONS[(i + 1) % 4]] for i, c in enumerate(CAPTIONS)]
    fixed = score_candidates(model, images, cands, method="elbo", num_samples=8)
    never = score_candidates(model, images, cands, method="elbo", num_samples=8, max_samples=64, tolerance=0.0)
    assert torch.equal(never, fixed)  # a lead of >= 0 standard errors: every item is sure after round 0
    always = score_candidates(model, images, cands, method="elbo", num_samples=8, max_samples=64, tolerance=1e9)
    with torch.no_grad():
        torch.testing.assert_close(always, _rounds_by_hand(model, images, cands, 8, 64).float())


def test_sequential_elbo_counts_copies_and_settles_ties_and_clear_leads(images):
    model = small_model().eval()
    tok = model.tokenizer
    cands = [["a red circle", "a red circle"],  # identical: every copy's difference is 0, nothing to resolve
             ["a red circle", "a large purple circle right of a blue star above a green square"]]
    tokens = trim_padding(tok([c for cs in cands for c in cs]), tok.eot_id)
    rows = keys = torch.tensor([0, 0, 1, 1])  # one noise key per item: paired candidates
    with torch.no_grad():
        ctx = model.context(images[:2])
        scores, copies = elbo_sequential(model, ctx, rows, tokens, 2, ElboOptions(
            num_samples=8, max_samples=64, tolerance=1e9), keys=keys.tolist())
        assert copies.tolist() == [8, 64] and scores.shape == (4,)
        assert scores[0] == scores[1]
        _, copies = elbo_sequential(model, ctx, rows, tokens, 2, ElboOptions(
            num_samples=8, max_samples=64, tolerance=3.0), keys=keys.tolist())
        assert copies[1] == 8  # 6 tokens of difference: a lead of far more than 3 standard errors
