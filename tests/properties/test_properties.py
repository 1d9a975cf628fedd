"""Property-based tests (hypothesis): the tokenizer on arbitrary Unicode, the masking process, the
scorers' independence from their batch, the scene world's constraints, and the loader under random
byte corruption of its shards. Few examples each and no deadline: they run in ``make test``."""
import io
import math
import os
import tarfile

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import mdc
from mdc.data.pipeline import SKIP_REASONS, SkipStats, iterate_batches, make_loader
from mdc.absorbing import corrupt
from mdc.tokenizer import Tokenizer, _bpe, caption_mask
from mdc.world.render import BACKGROUNDS, COLOURS, SHAPES, TEXTURES
from mdc.world.graphs import AXIS_RATIO, GAP, relation, sample_scene
from mdc.world.scenes import write_shards
from mdc.world.text import MAX_OBJECTS
from conftest import CAPTIONS, SMALL, VOCAB

SETTINGS = settings(max_examples=25, deadline=None, derandomize=True,
                    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
SPECIAL = ["<start_of_text>", "<end_of_text>", "<|startoftext|>", "<|endoftext|>", "[MASK]", "[UNK]", "[PAD]", "</w>"]
text = st.lists(st.one_of(st.text(max_size=12), st.sampled_from(SPECIAL)), max_size=6).map(" ".join)


# ----------------------------------------------------------------------------- tokenizer
@SETTINGS
@given(texts=st.lists(text, min_size=1, max_size=4), context=st.integers(3, 20), compact=st.booleans())
def test_tokenizer_rows_on_arbitrary_unicode(texts, context, compact):
    tok = Tokenizer(context, VOCAB if compact else None)
    tokens, stats = tok.tokenize(texts)
    assert tokens.shape == (len(texts), context)
    bodies = [tok.encode(t) for t in texts]
    specials = {tok.sot_id, tok.eot_id, tok.mask_id} | ({tok.pad_id} if compact else set())
    for row, body in zip(tokens.tolist(), bodies):
        assert not specials & set(body)  # special-token strings stay text: never a control id
        assert row[0] == tok.sot_id and row.count(tok.eot_id) == 1  # exactly one [EOT] per row
        end = row.index(tok.eot_id)
        assert row[1:end] == body[: context - 2]  # the body, cut the CLIP way
        assert end == min(len(body) + 1, context - 1)
    assert stats.captions == len(texts) and stats.tokens == sum(map(len, bodies))
    assert stats.truncated == sum(len(b) + 2 > context for b in bodies)
    if compact:  # [UNK] counts: the BPE ids outside the compact vocabulary
        full = Tokenizer(context)
        kept = set(tok.vocab)
        assert stats.unknown == sum(i not in kept for t in texts for i in full.encode(t))
        assert stats.unknown == sum(b.count(tok.unk_id) for b in bodies)
    else:
        assert stats.unknown == 0


@SETTINGS
@given(words=st.lists(st.sampled_from(SPECIAL + ["a", "red", "circle"]), min_size=1, max_size=8))
def test_special_token_strings_decode_back_as_text(words):
    tok = Tokenizer(77)
    caption = " ".join(words)
    row = tok([caption])[0]
    assert (row == tok.eot_id).sum() == 1
    assert tok.decode(row).replace(" ", "") == caption.replace(" ", "").lower()


# ----------------------------------------------------------------------------- masking
@st.composite
def captions(draw):
    """tokens [B, L] ([SOT] body [EOT] pad) with ids in 10..99, their caption mask, and L."""
    B, L = draw(st.integers(1, 5)), draw(st.integers(3, 24))
    lengths = draw(st.lists(st.integers(0, L - 2), min_size=B, max_size=B))
    tokens = torch.zeros(B, L, dtype=torch.long)
    for b, n in enumerate(lengths):
        tokens[b, 0], tokens[b, 1 : n + 1], tokens[b, n + 1] = 1, torch.randint(10, 100, (n,)), 2
    return tokens, caption_mask(tokens, 1, 2), lengths


@SETTINGS
@given(data=captions(), t=st.lists(st.floats(1e-4, 1.0), min_size=5, max_size=5), seed=st.integers(0, 2**31),
       by=st.sampled_from(["ratio", "count", "all"]), n=st.lists(st.integers(0, 30), min_size=5, max_size=5))
def test_corrupt_masks_only_caption_tokens(data, t, seed, by, n):
    tokens, maskable, lengths = data
    B, L = tokens.shape
    noise = torch.rand(B, L, generator=torch.Generator().manual_seed(seed))
    kw = {"ratio": dict(t=torch.tensor(t[:B]), u=noise), "count": dict(n=torch.tensor(n[:B]), u=noise),
          "all": {}}[by]
    c = corrupt(tokens, maskable, 99_999, **kw)
    assert not (c.masked & ~maskable).any()  # [SOT], [EOT] and padding are never masked
    assert torch.equal(c.noisy[~c.masked], tokens[~c.masked]) and (c.noisy[c.masked] == 99_999).all()
    assert c.weight.shape == (B,) and torch.isfinite(c.weight).all()
    if by == "count":
        assert c.masked.sum(1).tolist() == [min(k, N) for k, N in zip(n[:B], lengths)]
    elif by == "all":
        assert torch.equal(c.masked, maskable)
    else:
        assert torch.equal(c.masked, (noise < torch.tensor(t[:B])[:, None]) & maskable)


# ----------------------------------------------------------------------------- scorers
POOL = CAPTIONS + ["a green square", "the red star above a circle", "a circle"]
SCORERS = [("arc", "exact"), ("mdc", "heuristic"), ("mdc", "elbo"), ("clip", "cosine")]


@pytest.fixture(scope="module")
def scorers():
    torch.manual_seed(0)
    models = {o: mdc.create_model("tiny", objective=o, **SMALL).eval() for o in ("arc", "mdc", "clip")}
    images = torch.randn(len(POOL), 3, 32, 32, generator=torch.Generator().manual_seed(3))
    return models, images


@SETTINGS
@given(which=st.sampled_from(SCORERS), rows=st.lists(st.integers(0, len(POOL) - 1), min_size=1, max_size=6),
       pick=st.integers(0, 5))
def test_a_score_does_not_depend_on_the_rest_of_its_batch(scorers, which, rows, pick):
    models, images = scorers
    objective, method = which
    model = models[objective]
    target = rows[pick % len(rows)]
    kw = dict(method=method, num_samples=8) if method == "elbo" else dict(method=method)
    batch = mdc.score(model, images[rows], [POOL[i] for i in rows], keys=rows, **kw)
    alone = mdc.score(model, images[[target]], [POOL[target]], keys=[target], **kw)
    for position, i in enumerate(rows):
        if i == target:
            torch.testing.assert_close(batch[position], alone[0], rtol=1e-4, atol=1e-4)


# ----------------------------------------------------------------------------- scene world
@SETTINGS
@given(seed=st.integers(0, 2**32 - 1), n=st.one_of(st.none(), st.integers(1, MAX_OBJECTS)),
       first=st.fixed_dictionaries({}, optional={"shape": st.sampled_from(list(SHAPES)),
                                                 "colour": st.sampled_from(list(COLOURS)),
                                                 "texture": st.sampled_from(list(TEXTURES))}),
       background=st.one_of(st.none(), st.sampled_from(list(BACKGROUNDS))), sized=st.booleans())
def test_every_sampled_scene_meets_its_constraints(seed, n, first, background, sized):
    rng = np.random.default_rng(seed)
    sizes = ["large" if i % 2 else "small" for i in range(n)] if sized and n else None
    scene = sample_scene(rng, n_objects=n, sizes=sizes, first=first or None, background=background)
    objects = scene["objects"]
    assert 1 <= len(objects) <= MAX_OBJECTS and (n is None or len(objects) == n)
    assert sizes is None or [o["size"] for o in objects] == sizes
    assert len({o["shape"] for o in objects}) == len({o["colour"] for o in objects}) == len(objects)  # unique
    assert all(objects[0][k] == v for k, v in first.items())
    assert background is None or scene["background"]["kind"] == background
    for o in objects:
        assert o["radius"] <= o["x"] <= 1 - o["radius"] and o["radius"] <= o["y"] <= 1 - o["radius"]
    pairs = {(r["subject"], r["object"]): r["relation"] for r in scene["relations"]}
    assert set(pairs) == {(i, j) for i in range(len(objects)) for j in range(len(objects)) if i != j}
    opposite = {"left of": "right of", "right of": "left of", "above": "below", "below": "above"}
    for (i, j), rel in pairs.items():
        a, b = objects[i], objects[j]
        dx, dy = abs(a["x"] - b["x"]), abs(a["y"] - b["y"])
        assert math.hypot(dx, dy) >= a["radius"] + b["radius"] + GAP - 1e-9  # no overlap
        assert max(dx, dy) >= AXIS_RATIO * min(dx, dy)  # unambiguous: clearly beside or clearly above
        assert rel == relation(a, b) and pairs[j, i] == opposite[rel]


# ----------------------------------------------------------------------------- loader under corruption
@pytest.fixture(scope="module")
def clean_shard(tmp_path_factory):
    out = tmp_path_factory.mktemp("clean")
    write_shards(str(out), 6, "alt", seed=0, image_size=16, shard_size=6)
    with open(out / "000000.tar", "rb") as f:
        return f.read()


# flip a byte, zero a block, cut the file, insert junk, garble a tar header, or repeat a 512-byte block
damage = st.lists(st.tuples(st.sampled_from(["flip", "zero", "cut", "junk", "header", "repeat"]), st.floats(0, 1),
                            st.binary(min_size=1, max_size=64)), min_size=1, max_size=4)


@SETTINGS
@given(edits=damage)
def test_the_loader_skips_and_counts_corrupt_shards_and_never_crashes(clean_shard, tmp_path_factory, edits):
    data = bytearray(clean_shard)
    for kind, where, junk in edits:
        at = int(where * max(0, len(data) - 1))
        if kind == "flip" and data:
            data[at] ^= 1 + (at % 255)
        elif kind == "zero":
            data[at : at + 512] = bytes(len(data[at : at + 512]))
        elif kind == "cut":
            del data[at:]
        elif kind == "header":  # bytes inside the 512-byte header block at or before ``at``
            start = at - at % 512
            for k, byte in enumerate(junk[:8]):
                if start + 8 * k + byte % 8 < len(data):
                    data[start + 8 * k + byte % 8] = byte
        elif kind == "repeat":
            start = at - at % 512
            data[start:start] = data[start : start + 512]
        else:
            data[at:at] = junk
    folder = tmp_path_factory.mktemp("damaged")
    (folder / "000000.tar").write_bytes(bytes(data))
    tok = Tokenizer(32, VOCAB)
    stats = SkipStats()
    loader = make_loader(str(folder / "000000.tar"), tok, 16, batch_size=2, num_workers=0, shuffle_buffer=4)
    seen = 0
    for images, tokens in iterate_batches(loader, stats):  # never raises
        assert images.shape[1:] == (3, 16, 16) and torch.isfinite(images).all()
        assert ((tokens == tok.eot_id).sum(1) == 1).all()
        seen += len(images)
    assert set(stats.counts) <= set(SKIP_REASONS)
    assert seen <= 6 * 2 ** len(edits)
    if seen < _members_intact(bytes(data)):
        assert stats.total > 0  # a sample that was lost was counted


def _members_intact(data: bytes) -> int:
    """Samples whose png and txt members tarfile still reads byte for byte (what must come out, or be counted)."""
    try:
        with tarfile.open(fileobj=io.BytesIO(data)) as tar:
            names = set()
            for m in tar:
                names.add(m.name)
    except (tarfile.TarError, OSError, EOFError):
        return 0
    keys = {n.split(".")[0] for n in names}
    return sum(f"{k}.png" in names and f"{k}.txt" in names for k in keys)
