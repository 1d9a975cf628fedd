"""Likelihood scorers: ARC exact (Eq. 7), MDC lower bound (Eq. 8), MDC heuristic."""
import itertools
import math

import pytest
import torch
import torch.nn.functional as F

import mdc
from conftest import CAPTIONS, small_model
from mdc.scoring import elbo_score
from mdc.tokenizer import caption_mask


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
                logp = F.log_softmax(model(img[None], x)[0], -1)  # [L, V]
                conf = logp.max(-1).values
                conf[x[0] != tok.mask_id] = -math.inf
                i = int(conf.argmax())
                total += float(logp[i, truth[0, i]])
                x[0, i] = truth[0, i]
            expect.append(total)
    got = mdc.score(model, images, CAPTIONS, method="heuristic")
    torch.testing.assert_close(got, torch.tensor(expect), rtol=1e-5, atol=1e-4)


def test_arc_exact_equals_teacher_forced_sum(images):
    model = small_model("arc").eval()
    tok = model.tokenizer
    expect = []
    with torch.no_grad():
        for img, cap in zip(images, CAPTIONS):
            ids = tok([cap])[0].tolist()
            ids = ids[: ids.index(tok.eot_id) + 1]
            total = 0.0
            for i in range(1, len(ids)):  # p(c_i | c_<i, I), one prefix at a time
                total += float(F.log_softmax(model(img[None], torch.tensor([ids[:i]]))[0, -1], -1)[ids[i]])
            expect.append(total)
    torch.testing.assert_close(mdc.score(model, images, CAPTIONS), torch.tensor(expect), rtol=1e-5, atol=1e-4)


def _exact_bound(model, image, cap):
    """Eq. 8 by enumerating every mask subset of a short caption."""
    tok = model.tokenizer
    ids = tok([cap])
    ids = ids[:, : int((ids[0] == tok.eot_id).nonzero()[0]) + 1]
    pos = caption_mask(ids, tok.sot_id, tok.eot_id)[0].nonzero().flatten().tolist()
    N, bound = len(pos), 0.0
    with torch.no_grad():
        for n in range(1, N + 1):
            subsets = list(itertools.combinations(pos, n))
            for sub in subsets:
                x = ids.clone()
                x[0, list(sub)] = tok.mask_id
                logp = F.log_softmax(model(image[None], x)[0], -1)
                bound += sum(float(logp[i, ids[0, i]]) for i in sub) / n / len(subsets)
    return bound


def test_elbo_converges_to_the_enumerated_bound(images):
    model = small_model().eval()
    caps = ["a red circle", "two blue squares"]
    exact = torch.tensor([_exact_bound(model, images[i], c) for i, c in enumerate(caps)])
    est = mdc.score(model, images[:2], caps, method="elbo", num_samples=3000, max_rows=512)
    torch.testing.assert_close(est, exact, rtol=0.02, atol=0.05)


def test_elbo_is_seeded_and_its_spread_shrinks_like_inverse_sqrt_n(images):
    model = small_model().eval()
    tokens = model.tokenizer(CAPTIONS)[:, :12]
    with torch.no_grad():
        a = elbo_score(model, images, tokens, num_samples=16, seed=7)
        b = elbo_score(model, images, tokens, num_samples=16, seed=7)
        c = elbo_score(model, images, tokens, num_samples=16, seed=8)
        assert torch.equal(a, b) and not torch.equal(a, c)
        spread = {n: torch.stack([elbo_score(model, images, tokens, n, seed=s, max_rows=1024)
                                  for s in range(40)]).std(0).mean().item() for n in (8, 128)}
    ratio = spread[8] / spread[128]  # sqrt(128 / 8) = 4
    assert 2.5 < ratio < 6.5, ratio


def test_elbo_batching_does_not_change_the_estimate(images):
    model = small_model().eval()
    a = mdc.score(model, images, CAPTIONS, method="elbo", num_samples=32, max_rows=7)
    b = mdc.score(model, images, CAPTIONS, method="elbo", num_samples=32, max_rows=1000)
    torch.testing.assert_close(a, b)


def test_clip_cosine_and_method_errors(images):
    clip = small_model("clip").eval()
    s = mdc.score(clip, images, CAPTIONS)
    assert s.shape == (4,) and (s.abs() <= 1 + 1e-5).all()
    with pytest.raises(ValueError, match="elbo"):
        mdc.score(small_model("arc"), images, CAPTIONS, method="elbo")
    with pytest.raises(ValueError, match="3 captions"):
        mdc.score(small_model(), images, CAPTIONS[:3])
