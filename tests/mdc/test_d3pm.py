"""Mask-and-replace discrete diffusion (D3PM / VQ-Diffusion transition) as the captioner's noise."""
import copy
import inspect
import re
from pathlib import Path

import pytest
import torch

import mdc
from conftest import CAPTIONS, SMALL, small_model
from mdc.mc_diffusion.mask_replace import (MASK_REPLACE, MaskReplace, Schedule, caption_ids, d3pm_loss, d3pm_sample,
                                           model_schedule, posterior, q_sample, schedule)
from mdc.absorbing import ABSORBING
from mdc.distribution import banned_ids
from mdc.model import Captioner, ModelConfig
from mdc.tokenizer import caption_mask


def d3pm_model(**kw):
    return small_model(**{"noise": "mask_replace", "diffusion_steps": 10, **kw})


def step_matrix(sched: Schedule, t: int) -> torch.Tensor:
    """The paper's Q_t [(K+1), (K+1)] (float64; state K = [MASK]): [Q_t]_ij = q(x_t = j | x_{t-1} = i)."""
    return _matrix(sched.alpha[t], sched.uniform[t] / sched.K, sched.gamma[t], sched.K)


def cumulative_matrix(sched: Schedule, t: int) -> torch.Tensor:
    """Q_bar_t = Q_1 ... Q_t [(K+1), (K+1)], from the closed-form cumulative rates."""
    return _matrix(sched.alpha_bar[t], sched.uniform_bar[t] / sched.K, sched.gamma_bar[t], sched.K)


def _matrix(alpha, beta, gamma, K: int) -> torch.Tensor:
    Q = torch.zeros(K + 1, K + 1, dtype=torch.float64)
    Q[:K, :K] = beta + alpha * torch.eye(K, dtype=torch.float64)
    Q[:K, K], Q[K, K] = gamma, 1.0
    return Q


def test_schedule_products_give_the_closed_form():
    sched = schedule(10, 0.1, 6)
    assert sched.alpha_bar[-1] == 0 and abs(sched.gamma_bar[-1] - 0.9) < 1e-12 and abs(sched.uniform_bar[-1] - 0.1) < 1e-12
    Q = torch.eye(7, dtype=torch.float64)
    for t in range(1, 11):
        step = step_matrix(sched, t)
        assert (step >= 0).all() and torch.allclose(step.sum(1), torch.ones(7, dtype=torch.float64))
        Q = Q @ step
        assert torch.allclose(Q, cumulative_matrix(sched, t), atol=1e-12)


def _state(x, ids, mask_id):
    """Token ids -> state index (0..K-1 caption tokens, K = [MASK])."""
    lookup = torch.full((int(max(ids.max(), mask_id)) + 1,), -1)
    lookup[ids], lookup[mask_id] = torch.arange(len(ids)), len(ids)
    return lookup[x]


@pytest.mark.parametrize("t", [1, 4, 9])
def test_forward_marginals_match_the_closed_form(t):
    model = d3pm_model()
    tok, sched, ids = model.tokenizer, model_schedule(model), caption_ids(model.tokenizer)
    x0 = tok(CAPTIONS).repeat(5000, 1)  # [20000, L]
    maskable = caption_mask(x0, tok.sot_id, tok.eot_id)
    K = len(ids)
    g = torch.Generator().manual_seed(t)
    direct = q_sample(x0, maskable, torch.full((len(x0),), t), sched, ids, tok.mask_id, g)
    assert torch.equal(direct[~maskable], x0[~maskable])  # SOT, EOT and padding never move
    stepwise = x0.clone()  # t single steps with the per-step rates: the Markov chain itself
    for s in range(1, t + 1):
        u, redraw = torch.rand(x0.shape, generator=g), ids[torch.randint(K, x0.shape, generator=g)]
        a, m = float(sched.alpha[s]), float(sched.gamma[s])
        step = torch.where(u < m, tok.mask_id, torch.where(u < m + float(sched.uniform[s]), redraw, stepwise))
        stepwise = torch.where((stepwise == tok.mask_id) | ~maskable, stepwise, step)
    Q = cumulative_matrix(sched, t).float()  # [K+1, K+1] closed form q(x_t | x_0)
    src = _state(x0[maskable], ids, tok.mask_id)
    for xt in (direct, stepwise):
        dst = _state(xt[maskable], ids, tok.mask_id)
        counts = torch.zeros(K + 1, K + 1).index_put_((src, dst), torch.ones(len(src)), accumulate=True)
        seen = counts.sum(1) > 2000  # the source tokens with enough samples
        empirical = counts[seen] / counts[seen].sum(1, keepdim=True)
        assert (empirical - Q[seen]).abs().max() < 0.02  # every entry: keep, each other token, mask
        # aggregate rates over all positions: kept, masked, moved to another token
        n = len(src)
        assert abs((dst == src).sum() / n - (sched.alpha_bar[t] + sched.uniform_bar[t] / K)) < 0.005
        assert abs((dst == K).sum() / n - sched.gamma_bar[t]) < 0.005
        assert abs(((dst != src) & (dst != K)).sum() / n - sched.uniform_bar[t] * (K - 1) / K) < 0.005


def test_posterior_is_the_papers_formula():
    model = d3pm_model()
    tok, sched, ids = model.tokenizer, model_schedule(model), caption_ids(model.tokenizer)
    K, V = len(ids), tok.vocab_size
    states = torch.cat([ids, torch.tensor([tok.mask_id])])  # state index -> token id
    for t in (1, 2, 5, 10):
        Qt, Qbar, Qprev = step_matrix(sched, t), cumulative_matrix(sched, t), cumulative_matrix(sched, t - 1)
        for x0, xt in ((0, 0), (0, 3), (2, K), (5, 1)):
            expected = Qt[:, xt] * Qprev[x0] / Qbar[x0, xt]  # x_t Q_t^T (.) x_0 Qbar_{t-1} / x_0 Qbar_t x_t^T
            p0 = torch.zeros(1, V)
            p0[0, ids[x0]] = 1
            got = posterior(p0, states[xt].view(1), torch.tensor([t]), sched, ids, tok.mask_id)[0]
            assert torch.allclose(got[states], expected.float(), atol=1e-5)
            assert got.sum() == pytest.approx(1, abs=1e-5) and got[banned_ids(tok)[:1]].sum() == 0
    # p(x_{t-1} | x_t) of a predicted distribution = its mixture of the true posteriors
    p0 = torch.zeros(1, V)
    p0[0, ids] = torch.softmax(torch.randn(K), 0)
    xt, t = ids[3].view(1), torch.tensor([4])
    mix = sum(p0[0, i] * posterior(torch.eye(V)[i:i + 1], xt, t, sched, ids, tok.mask_id) for i in ids.tolist())
    assert torch.allclose(posterior(p0, xt, t, sched, ids, tok.mask_id), mix, atol=1e-5)


def test_loss_is_finite_and_decreases_on_a_tiny_overfit(images):
    model = d3pm_model(cond_drop_prob=0.1, cond_mask_prob=0.1)
    tokens = model.tokenizer(CAPTIONS)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    g = torch.Generator().manual_seed(0)
    losses = []
    for _ in range(40):
        loss = model.loss(images, tokens, generator=g)
        assert torch.isfinite(loss)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert sum(losses[-8:]) < 0.6 * sum(losses[:8])
    # t = 1 is the reconstruction term; a fixed t gives a finite loss at every step
    for t in (1, 5, 10):
        assert torch.isfinite(model.loss(images, tokens, t=torch.full((4,), t), generator=g))


def test_sampler_returns_valid_caption_tokens(images):
    model = d3pm_model().eval()
    tok = model.tokenizer
    calls, logits = [], model.hidden
    model.hidden = lambda x, ctx: (calls.append(len(x)), logits(x, ctx))[1]
    out = mdc.generate(model, images, 6, generator=torch.Generator().manual_seed(1), return_tokens=True)
    assert calls == [len(images)] * 10  # T reverse steps, image encoded once
    assert out.shape == (4, 8) and (out[:, 0] == tok.sot_id).all() and (out[:, -1] == tok.eot_id).all()
    assert not torch.isin(out[:, 1:-1], torch.tensor(banned_ids(tok))).any()  # no [MASK], no special ids
    again = d3pm_sample(model, images, 6, generator=torch.Generator().manual_seed(1))
    assert torch.equal(out, again)
    guided = d3pm_model(cond_drop_prob=0.1).eval()
    caps = mdc.generate(guided, images, 6, guidance="cfg", guidance_scale=2.0, generator=torch.Generator().manual_seed(1))
    assert len(caps) == 4 and all(isinstance(c, str) for c in caps)


def test_bad_mask_replace_options_are_named():
    with pytest.raises(ValueError, match="extensions \\['mask_replace'\\] apply to 'mdc' captioners only"):
        small_model("arc", noise="mask_replace")
    with pytest.raises(ValueError, match="mask_ratio = 0.5 belongs to the absorbing noise"):
        small_model(noise="mask_replace", mask_ratio=0.5)
    with pytest.raises(ValueError, match="need diffusion_steps >= 1"):
        small_model(noise="mask_replace", diffusion_steps=0)


# ------------------------------------------------------------ the noise process: chosen once, carried by the model
@pytest.mark.parametrize("method", ["elbo", "heuristic", None])
def test_mdc_scorers_refuse_a_mask_replace_model_in_one_line(images, method):
    """"elbo" (Eq. 8) and "heuristic" walk the absorbing path; a mask-and-replace model supports neither."""
    model = d3pm_model().eval()
    for call in (lambda: mdc.score(model, images, CAPTIONS, method),
                 lambda: mdc.score_candidates(model, images, [[c, c] for c in CAPTIONS], method)):
        with pytest.raises(ValueError) as err:
            call()
        message = str(err.value)
        assert "\n" not in message and "'mask_replace'" in message and "supports no scorer" in message


def test_the_noise_process_is_chosen_once_and_carried_by_the_model(images, tmp_path):
    model = d3pm_model().eval()
    assert model.noise == MaskReplace(diffusion_steps=10) and model.noise.scorers == () and MASK_REPLACE.scorers == ()
    assert small_model().noise is ABSORBING and small_model("arc").noise is None and small_model("clip").noise is None
    model.save(tmp_path / "d3pm")
    loaded = mdc.load(tmp_path / "d3pm").eval()
    assert loaded.noise == model.noise  # a saved mask-and-replace model loads back with its process
    out = mdc.generate(loaded, images, 6, generator=torch.Generator().manual_seed(2), return_tokens=True)
    assert torch.equal(out, d3pm_sample(model, images, 6, generator=torch.Generator().manual_seed(2)))
    tokens = model.tokenizer(CAPTIONS)
    t = torch.full((4,), 3)
    assert torch.equal(model.loss(images, tokens, t=t, generator=torch.Generator().manual_seed(0)),
                       d3pm_loss(model, images, tokens, t=t, generator=torch.Generator().manual_seed(0)))


def test_a_captioner_built_without_its_noise_process_is_refused():
    cfg = mdc.factory.model_config("tiny", **{**SMALL, "noise": "mask_replace"})
    with pytest.raises(ValueError, match=r"extensions \['mask_replace'\] are wired in by mdc.create_model"):
        Captioner(cfg)
    plain = Captioner(mdc.factory.model_config("tiny", **SMALL))  # the Captioner's default: absorbing
    assert plain.noise is ABSORBING and copy.deepcopy(plain).noise is ABSORBING
    assert Captioner(mdc.factory.model_config("tiny", "arc", **SMALL)).noise is None  # ARC has none


@pytest.mark.parametrize("options", [dict(tokens_per_step=2), dict(threshold=0.5), dict(trace=[]),
                                     dict(temperature=0.7)])
def test_the_reverse_process_refuses_the_unmasking_options_in_one_line(images, options):
    model = d3pm_model().eval()
    with pytest.raises(ValueError, match="'mask_replace' reverse process samples at temperature 1") as err:
        mdc.generate(model, images, 6, **options)
    assert "\n" not in str(err.value)
    assert len(mdc.generate(model, images, 6, temperature=1.0)) == 4  # what it does anyway (CLIP reranking's)


def test_nothing_outside_the_factory_branches_on_the_noise_name():
    """The noise process is picked from the config in mdc/factory.py only; everything else asks
    ``model.noise``. (ModelConfig is left out of the search.)"""
    root = Path(mdc.__file__).parent
    branch = re.compile(r"noise\s*(==|!=)\s*['\"]|['\"]\s*(==|!=)\s*[\w.]*noise\b|\.noise\s+(not\s+)?in\b")
    found = []
    for path in sorted(root.rglob("*.py")):
        if path.name == "factory.py" and path.parent == root:
            continue
        text = path.read_text()
        if path == root / "model.py":
            text = text.replace(inspect.getsource(ModelConfig), "")
        found += [f"{path.relative_to(root)}: {line.strip()}" for line in text.splitlines() if branch.search(line)]
    assert not found, found
