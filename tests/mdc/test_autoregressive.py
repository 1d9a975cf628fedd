"""mdc.autoregressive: ARC's teacher-forced loss, greedy and beam decoding, the exact Eq. 7 score."""
import math

import pytest
import torch
import torch.nn.functional as F

import mdc
import mdc.condition
import mdc.distribution
from conftest import CAPTIONS, small_model
from mdc.autoregressive import _decode_step, arc_sample
from mdc.distribution import banned_ids, caption_log_probs
from mdc.tokenizer import trim_padding, valid_mask


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


def _plain_greedy(model, images, max_length, min_lengths=None):
    """ARC greedy decoding without any cache: re-run the decoder on the whole prefix; [EOT] banned
    before ``min_lengths[b]`` caption tokens."""
    tok = model.tokenizer
    outs = []
    with torch.no_grad():
        for b, img in enumerate(images):
            seq = [tok.sot_id]
            for _ in range(max_length):
                logp = model(img[None], torch.tensor([seq]))[0, -1]
                logp[[i for i in banned_ids(tok) if i != tok.eot_id]] = -math.inf
                if min_lengths is not None and len(seq) - 1 < min_lengths[b]:
                    logp[tok.eot_id] = -math.inf
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


def test_eot_held_back_until_the_minimum_length(images):
    """[EOT] is banned before min_length caption tokens (one for the batch, or one per image), in greedy
    decoding as in a plain loop, and in beam search every finished caption has at least that many tokens."""
    model = small_model("arc").eval()
    eot = model.tokenizer.eot_id
    free = [len(r) - 2 for r in _rows(arc_sample(model, images, 8, beam_size=1), eot)]
    per_image = [min(8, n + 2 + i % 2) for i, n in enumerate(free)]  # longer than each image's free caption
    for minimum in (5, per_image, torch.tensor(per_image)):
        want = [minimum] * len(images) if isinstance(minimum, int) else list(minimum)
        got = _rows(arc_sample(model, images, 8, beam_size=1, min_length=minimum), eot)
        assert got == _plain_greedy(model, images, 8, [int(m) for m in want])
        beams = _rows(arc_sample(model, images, 8, beam_size=3, min_length=minimum), eot)
        assert all(len(r) - 2 >= int(m) for r, m in zip(beams, want))
    assert _rows(arc_sample(model, images, 8, beam_size=1, min_length=0), eot) == _plain_greedy(model, images, 8)
    with pytest.raises(ValueError, match="min_length"):
        arc_sample(model, images, 4, min_length=5)
    with pytest.raises(ValueError, match="min_length"):
        arc_sample(model, images, 8, min_length=[3, 4])  # not one per image


def test_beam_one_equals_greedy_and_beam_search_runs(images):
    model = small_model("arc").eval()
    greedy = _plain_greedy(model, images, 8)
    assert _rows(arc_sample(model, images, 8, beam_size=1), model.tokenizer.eot_id) == greedy
    beams = arc_sample(model, images, 8, beam_size=6)
    assert (beams[:, 0] == model.tokenizer.sot_id).all()
    assert all(len(r) <= 10 for r in _rows(beams, model.tokenizer.eot_id))


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
                logp = caption_log_probs(model(img[None], torch.tensor([ids[:i]]))[0, -1], tok, allow_eot=True)
                total += float(logp[ids[i]])
            expect.append(total)
    torch.testing.assert_close(mdc.score(model, images, CAPTIONS), torch.tensor(expect), rtol=1e-5, atol=1e-4)


class _LargestTensor:
    """Context manager: the largest numel among the tensors the ops run inside it allocate (an output
    that shares its storage with an input, a view or an in-place result, allocates nothing)."""

    def __enter__(self):
        from torch.utils._python_dispatch import TorchDispatchMode

        outer = self
        self.numel = 0

        class Mode(TorchDispatchMode):
            def __torch_dispatch__(self, func, types, args=(), kwargs=None):
                from torch.utils._pytree import tree_flatten

                out = func(*args, **(kwargs or {}))
                inputs = {t.untyped_storage().data_ptr() for t in tree_flatten((args, kwargs))[0]
                          if isinstance(t, torch.Tensor)}
                for t in tree_flatten(out)[0]:
                    if isinstance(t, torch.Tensor) and t.untyped_storage().data_ptr() not in inputs:
                        outer.numel = max(outer.numel, t.numel())
                return out

        self.mode = Mode()
        self.mode.__enter__()
        return self

    def __exit__(self, *exc):
        self.mode.__exit__(*exc)


def test_exact_never_materialises_all_log_probs(images):
    """ARC's exact score takes the target log-probabilities max_rows captions at a time, at their
    caption and [EOT] targets only: no [R, L, V] tensor (2.4 GB at V = 49,409 and 160 rows of 77)."""
    model = small_model("arc", vocab=None).eval()  # the full CLIP vocabulary: V = 49,409
    V, L = model.tokenizer.vocab_size, trim_padding(model.tokenizer(CAPTIONS), model.tokenizer.eot_id).shape[1]
    caps = CAPTIONS * 2
    imgs = images.repeat(2, 1, 1, 1)
    with _LargestTensor() as big:
        whole = mdc.score(model, imgs, caps, max_rows=256)
    assert big.numel >= V  # the head's output was seen
    for max_rows in (1, 3):
        with _LargestTensor() as big:
            got = mdc.score(model, imgs, caps, max_rows=max_rows)
        torch.testing.assert_close(got, whole, rtol=0, atol=1e-5)
        assert big.numel <= max_rows * (L - 1) * V, (max_rows, big.numel / V)
    with torch.no_grad():  # the full [R, L, V] computation it replaces
        tok = model.tokenizer(caps)[:, :L]
        logp = caption_log_probs(model(imgs, tok[:, :-1]), model.tokenizer, allow_eot=True)
        ll = logp.gather(-1, tok[:, 1:, None]).squeeze(-1)
        ref = ll.masked_fill(~valid_mask(tok, model.tokenizer.eot_id)[:, 1:], 0.0).sum(1)
    torch.testing.assert_close(whole, ref, rtol=0, atol=1e-5)
