"""Greedy confidence unmasking (Eq. 6) and ARC greedy / beam search."""
import math

import pytest
import torch
import torch.nn.functional as F

import mdc
from conftest import small_model
from mdc.diffusion import banned_ids
from mdc.sampler import arc_sample, masked_row, mdc_sample


def _recording(model):
    """Wrap model.logits to record the token rows it is called with."""
    calls, logits = [], model.logits
    model.logits = lambda x, ctx: (calls.append(x.clone()), logits(x, ctx))[1]
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


def _plain_greedy(model, images, max_length):
    """ARC greedy decoding without any cache: re-run the decoder on the whole prefix."""
    tok = model.tokenizer
    outs = []
    with torch.no_grad():
        for img in images:
            seq = [tok.sot_id]
            for _ in range(max_length):
                logp = model(img[None], torch.tensor([seq]))[0, -1]
                logp[[i for i in banned_ids(tok) if i != tok.eot_id]] = -math.inf
                nxt = int(logp.argmax())
                if nxt == tok.eot_id:
                    break
                seq.append(nxt)
            outs.append(seq + [tok.eot_id])
    return outs


def _rows(tokens, eot):
    return [r[: r.index(eot) + 1] for r in tokens.tolist()]


def test_arc_greedy_kv_cache_equals_plain_loop(images):
    model = small_model("arc").eval()
    got = arc_sample(model, images, max_length=6, beam_size=1)
    assert _rows(got, model.tokenizer.eot_id) == _plain_greedy(model, images, 6)


def test_beam_one_equals_greedy_and_beam_search_runs(images):
    model = small_model("arc").eval()
    greedy = _plain_greedy(model, images, 8)
    assert _rows(arc_sample(model, images, 8, beam_size=1), model.tokenizer.eot_id) == greedy
    beams = arc_sample(model, images, 8, beam_size=6)
    assert (beams[:, 0] == model.tokenizer.sot_id).all()
    assert all(len(r) <= 10 for r in _rows(beams, model.tokenizer.eot_id))


def test_generate_api_and_errors(images):
    model = small_model()
    caps = mdc.generate(model, images, length=5)
    assert len(caps) == 4 and all(isinstance(c, str) for c in caps)
    assert model.training  # mode restored
    with pytest.raises(ValueError, match="length"):
        mdc.generate(model, images, length=0)
    with pytest.raises(ValueError, match="23"):
        mdc.generate(model, images, length=23)  # context 24 - SOT/EOT = 22
    with pytest.raises(ValueError, match="CLIP"):
        mdc.generate(small_model("clip"), images)


def test_beam_search_equals_brute_force_when_the_beam_holds_everything():
    """A 3-word vocabulary, at most 3 words: a beam of 40 keeps every hypothesis alive, so beam
    search must return the best of all 40 captions under sum log p / length ** alpha."""
    import itertools

    from mdc.diffusion import caption_log_probs

    vocab = mdc.get_tokenizer().encode("dog cat")
    torch.manual_seed(3)
    model = small_model("arc", vocab=vocab).eval()
    tok = model.tokenizer
    words = [i for i in range(tok.vocab_size) if i not in banned_ids(tok)]
    image = torch.randn(1, 3, 32, 32)
    for alpha in (0.0, 1.0):
        best, best_score = None, -math.inf
        with torch.no_grad():
            for n in range(4):
                for body in itertools.product(words, repeat=n):
                    seq = [tok.sot_id, *body, tok.eot_id]
                    logp = caption_log_probs(model(image, torch.tensor([seq[:-1]]))[0], tok, allow_eot=True)
                    s = float(logp[torch.arange(len(seq) - 1), torch.tensor(seq[1:])].sum()) / (n + 1) ** alpha
                    if s > best_score:
                        best, best_score = seq, s
        got = arc_sample(model, image, max_length=3, beam_size=40, length_penalty=alpha)
        assert _rows(got, tok.eot_id)[0] == best, alpha


def test_generate_never_returns_banned_ids(images):
    model = small_model().eval()
    tok = model.tokenizer
    with torch.no_grad():
        model.head.weight[banned_ids(tok)] += 5.0 * model.head.weight.norm(dim=1).max()  # banned ids dominate
    for objective_model in (model,):
        out = mdc.generate(objective_model, images, length=6, return_tokens=True)
        assert not torch.isin(out[:, 1:-1], torch.tensor(banned_ids(tok))).any()
    arc = small_model("arc").eval()
    with torch.no_grad():
        arc.head.weight[banned_ids(tok)] += 5.0 * arc.head.weight.norm(dim=1).max()
    for beam in (1, 3):
        out = mdc.generate(arc, images, length=6, beam_size=beam, return_tokens=True)
        body = [r[1 : r.index(tok.eot_id)] for r in out.tolist()]
        assert not any(set(b) & set(banned_ids(tok)) for b in body)
