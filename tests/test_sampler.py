"""Greedy confidence unmasking (Eq. 6) and ARC greedy / beam search."""
import math

import pytest
import torch
import torch.nn.functional as F

import mdc
from conftest import small_model
from mdc.absorbing import masked_row, mdc_sample
from mdc.autoregressive import _decode_step, arc_sample
from mdc.distribution import banned_ids


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

    from mdc.distribution import caption_log_probs

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



@torch.no_grad()
def _loop_beam_search(model, images, max_length, beam_size, length_penalty=1.0):
    """The plain beam search (a Python loop over rows and candidates), kept as the reference."""
    from mdc.condition import ImageContext

    tok = model.tokenizer
    B, K, dev = len(images), beam_size, images.device
    rows = torch.arange(B).repeat_interleave(K)
    context = ImageContext([(k[rows], v[rows]) for k, v in model.context(images).kv])  # copied per beam
    cache = [[] for _ in model.decoder.blocks]
    seqs = torch.full((B * K, 1), tok.sot_id, dtype=torch.long, device=dev)
    scores = torch.full((B, K), -math.inf, device=dev)
    scores[:, 0] = 0.0  # one live hypothesis to start with
    finished: list[list[tuple[float, list[int]]]] = [[] for _ in range(B)]
    for step in range(max_length + 1):
        logp = _decode_step(model, seqs[:, -1:], context, cache, start=step)  # [B*K, V]
        if step == max_length:  # out of room: close every hypothesis
            forced = torch.full_like(logp, -math.inf)
            forced[:, tok.eot_id] = logp[:, tok.eot_id]
            logp = forced
        V = logp.shape[-1]
        cand = (scores[:, :, None] + logp.view(B, K, V)).view(B, K * V)
        top_s, top_i = cand.topk(min(2 * K, K * V), dim=-1)  # [B, 2K]
        beam, word = top_i // V, top_i % V
        new_scores = torch.full((B, K), -math.inf, device=dev)
        new_src = torch.zeros(B, K, dtype=torch.long, device=dev)
        new_word = torch.full((B, K), tok.eot_id, dtype=torch.long, device=dev)
        for b in range(B):
            if len(finished[b]) >= K:
                continue  # this row is done; its beams stay at -inf
            live = 0
            for r in range(top_s.shape[1]):
                s, src, w = top_s[b, r].item(), beam[b, r].item(), word[b, r].item()
                if s == -math.inf or live == K:
                    break
                if w == tok.eot_id:
                    if r < K:  # only top-K ranked endings count, as in standard beam search
                        body = seqs[b * K + src, 1:].tolist()
                        finished[b].append((s / (len(body) + 1) ** length_penalty, body))
                    continue
                new_scores[b, live], new_src[b, live], new_word[b, live] = s, src, w
                live += 1
        if all(len(f) >= K for f in finished) or step == max_length:
            break
        flat = (new_src + torch.arange(B, device=dev)[:, None] * K).view(-1)
        seqs = torch.cat([seqs[flat], new_word.view(-1, 1)], dim=1)
        for c in cache:
            c[:] = [t[flat] for t in c]
        scores = new_scores
    width = max(len(max(f, key=lambda x: x[0])[1]) for f in finished) + 2
    out = torch.full((B, width), tok.pad_id, dtype=torch.long, device=dev)
    for b, f in enumerate(finished):
        body = max(f, key=lambda x: x[0])[1]
        out[b, : len(body) + 2] = torch.tensor([tok.sot_id, *body, tok.eot_id])
    return out


@pytest.mark.parametrize("beam, alpha", [(1, 1.0), (3, 1.0), (6, 0.0), (6, 1.0)])
def test_vectorised_beam_search_equals_the_loop(beam, alpha):
    """The tensor bookkeeping returns exactly what the per-candidate loop returns."""
    torch.manual_seed(11)
    model = small_model("arc").eval()
    images = torch.randn(5, 3, 32, 32)
    got = arc_sample(model, images, max_length=7, beam_size=beam, length_penalty=alpha)
    want = _loop_beam_search(model, images, 7, beam, alpha)
    assert _rows(got, model.tokenizer.eot_id) == _rows(want, model.tokenizer.eot_id)


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
