"""The webdataset training pipeline: decoding, bad-input accounting, splitting, determinism, resume."""
import dataclasses
import io
import itertools
import logging

import numpy as np
import pytest
import torch
from PIL import Image

from mdc import get_tokenizer
from mdc.data.pipeline import (
    SkipStats, StreamOptions, StreamPosition, image_transform, iterate_batches, make_dataset, make_loader,
)
from mdc.data.shards import fast_forward
from mdc.data.transforms import CLIP_MEAN, CLIP_STD, normalize
from mdc.data.writer import write_tar
from mdc.tokenizer import TextStats, compact_vocab
from conftest import png

SIZE = 16


@pytest.fixture(scope="module")
def tok():
    return get_tokenizer(context_length=16)


def _png(value: int) -> bytes:
    return png((value % 256, 3 * value % 256, 7 * value % 256), (20, 24))


def write_shard(path, members):
    """Write a tar of (name, bytes) members (the scene world's tar writer)."""
    return write_tar(str(path), members)


def good_members(start, n):
    out = []
    for i in range(start, start + n):
        out += [(f"{i:06d}.png", _png(i)), (f"{i:06d}.txt", f"caption number {i}".encode())]
    return out


def collect(loader):
    stats, images, tokens = SkipStats(), [], []
    for im, tk in iterate_batches(loader, stats):
        images.append(im)
        tokens.append(tk)
    return torch.cat(images), torch.cat(tokens), stats


def test_transform_shapes_normalisation_and_seeding():
    img = Image.new("RGB", (40, 30), (255, 255, 255))
    for train in (True, False):
        x = image_transform(SIZE, train)(img)
        assert x.shape == (3, SIZE, SIZE) and x.dtype == torch.float32
        assert torch.allclose(x[:, 0, 0], (1 - torch.tensor(CLIP_MEAN)) / torch.tensor([0.26862954, 0.26130258, 0.27577711]))
    ramp = Image.fromarray(np.tile(np.arange(40, dtype=np.uint8)[None, :, None] * 6, (30, 1, 3)))
    t = image_transform(SIZE, True, crop_scale=(0.3, 0.5))
    a = t(ramp, np.random.default_rng(1))
    assert torch.equal(a, t(ramp, np.random.default_rng(1)))
    assert not torch.equal(a, t(ramp, np.random.default_rng(2)))
    plain = image_transform(SIZE, True, crop_scale=None)
    assert torch.equal(plain(ramp), plain(ramp))


def test_uint8_pixels_normalised_later_are_the_floats_bit_for_bit(tmp_path, tok):
    """The training stream's images travel as uint8 and are normalised on the device: the same floats as the
    transform's float path (and as its formula before the uint8 path: numpy's float32 / 255, then mean and std)."""
    pixels = np.random.default_rng(0).integers(0, 256, (SIZE, SIZE, 3), dtype=np.uint8)
    before = (torch.from_numpy(pixels.astype(np.float32) / 255.0).permute(2, 0, 1)
              - torch.tensor(CLIP_MEAN).view(3, 1, 1)) / torch.tensor(CLIP_STD).view(3, 1, 1)
    assert torch.equal(normalize(torch.from_numpy(pixels).permute(2, 0, 1)), before)
    write_shard(tmp_path / "000000.tar", good_members(0, 6))
    floats, tokens, _ = collect(make_loader(str(tmp_path / "000000.tar"), tok, SIZE, 3, num_workers=0))
    pixels, tokens8, _ = collect(make_loader(str(tmp_path / "000000.tar"), tok, SIZE, 3, num_workers=0, uint8=True))
    assert pixels.dtype == torch.uint8 and torch.equal(tokens8, tokens)
    assert torch.equal(normalize(pixels), floats)


def test_bad_samples_are_skipped_and_counted(tmp_path, tok, caplog):
    members = good_members(0, 3) + [
        ("bad1.png", b"not an image at all"), ("bad1.txt", b"corrupt image"),
        ("bad2.png", _png(1)),                                   # no caption
        ("bad3.png", _png(2)), ("bad3.txt", b""),
        ("bad4.png", _png(3)), ("bad4.txt", b" \n\t "),
        ("bad5.png", _png(4)), ("bad5.txt", b"caf\xe9 latin-1"),
        ("bad6.png", _png(5)), ("bad6.txt", b"x" * 10_001),
        ("bad7.txt", b"a caption without image"),
    ] + good_members(3, 2)
    shard = write_shard(tmp_path / "000000.tar", members)
    stats = SkipStats()
    with caplog.at_level(logging.WARNING, logger="mdc.data.pipeline"):
        items = list(make_dataset(shard, tok, SIZE, train=False, stats=stats))
    assert len(items) == 5
    assert all(im.shape == (3, SIZE, SIZE) and t.shape == (16,) for im, t in items)
    assert stats.as_dict() == {"missing_image": 1, "corrupt_image": 1, "missing_caption": 1, "empty_caption": 2,
                               "caption_not_utf8": 1, "caption_too_long": 1}
    assert stats.total == 7
    assert any("000000.tar key bad5" in r.getMessage() for r in caplog.records)


def _npy(array) -> bytes:
    buf = io.BytesIO()
    np.save(buf, array)
    return buf.getvalue()


def test_npy_images_round_trip_bit_exactly(tmp_path, tok):
    """npy shards give the loader exactly the tensors of the PNG shards of the same seed."""
    from mdc.world.scenes import write_shards

    png = write_shards(str(tmp_path / "png"), 10, "alt", seed=1, image_size=24, shard_size=4)
    npy = write_shards(str(tmp_path / "npy"), 10, "alt", seed=1, image_size=24, shard_size=4, image_format="npy")
    for train in (True, False):
        a = collect(make_loader(png, tok, SIZE, 3, num_workers=0, train=train, shuffle_buffer=5))
        b = collect(make_loader(npy, tok, SIZE, 3, num_workers=0, train=train, shuffle_buffer=5))
        assert len(a[0]) == 10 and torch.equal(a[0], b[0]) and torch.equal(a[1], b[1]) and b[2].total == 0


def test_corrupt_npy_images_are_skipped_and_counted(tmp_path, tok, caplog):
    good = np.zeros((20, 24, 3), np.uint8)
    bad = {"junk": b"not an array", "truncated": _npy(good)[:-10], "float": _npy(good.astype(np.float32)),
           "gray": _npy(good[:, :, 0]), "rgba": _npy(np.zeros((4, 4, 4), np.uint8)), "empty": _npy(good[:0]),
           "pickle": _npy(np.array([{"a": 1}], dtype=object))}
    members = [("ok.npy", _npy(good)), ("ok.txt", b"a good caption")]
    for key, data in bad.items():
        members += [(f"{key}.npy", data), (f"{key}.txt", b"a caption")]
    stats = SkipStats()
    with caplog.at_level(logging.WARNING, logger="mdc.data.pipeline"):
        items = list(make_dataset(write_shard(tmp_path / "000000.tar", members), tok, SIZE, train=False, stats=stats))
    assert len(items) == 1 and stats.as_dict() == {"corrupt_image": len(bad)}
    assert any("key float" in r.getMessage() and "uint8 [H, W, 3]" in r.getMessage() for r in caplog.records)


def test_truncated_and_missing_shards(tmp_path, tok, caplog):
    a = write_shard(tmp_path / "000000.tar", good_members(0, 4))
    full = open(write_shard(tmp_path / "full.tar", good_members(100, 4)), "rb").read()
    cut = tmp_path / "000001.tar"
    cut.write_bytes(full[:3000])  # ends inside the second sample's members
    missing = str(tmp_path / "000002.tar")
    c = write_shard(tmp_path / "000003.tar", good_members(4, 4))
    stats = SkipStats()
    with caplog.at_level(logging.WARNING, logger="mdc.data.pipeline"):
        items = list(make_dataset([a, str(cut), missing, c], tok, SIZE, train=False, stats=stats))
    counts = stats.as_dict()
    assert counts["missing_shard"] == 1 and counts["unreadable_shard"] == 1
    # 8 intact samples + whatever was complete in the truncated shard; its partial sample is counted
    assert len(items) == 8 + 1 and counts.get("missing_caption", 0) == 1
    assert any("000002.tar" in r.getMessage() and "missing_shard" in r.getMessage() for r in caplog.records)


def test_split_by_sample_counts_shard_errors_once(tmp_path, tok):
    full = open(write_shard(tmp_path / "full.tar", good_members(0, 6)), "rb").read()
    cut = tmp_path / "000000.tar"
    cut.write_bytes(full[:7000])  # one truncated shard, read by both workers
    one = collect(make_loader(str(cut), tok, SIZE, 2, num_workers=0, shuffle_buffer=4))
    two = collect(make_loader(str(cut), tok, SIZE, 2, num_workers=2, shuffle_buffer=4))
    assert one[2].as_dict()["unreadable_shard"] == 1
    assert two[2].as_dict() == one[2].as_dict() and len(two[1]) == len(one[1])


def test_brace_patterns_and_worker_split_cover_everything_once(tmp_path, tok):
    for s in range(5):
        write_shard(tmp_path / f"{s:06d}.tar", good_members(10 * s, 3))
    pattern = str(tmp_path / "{000000..000004}.tar")
    loader = make_loader(pattern, tok, SIZE, batch_size=4, num_workers=2, train=True, shuffle_buffer=8)
    _, tokens, stats = collect(loader)
    assert stats.total == 0
    rows = {tuple(r.tolist()) for r in tokens}
    assert len(tokens) == 15 and len(rows) == 15  # every sample exactly once
    expected = {tuple(r.tolist()) for r in tok([f"caption number {10 * s + i}" for s in range(5) for i in range(3)])}
    assert rows == expected


def _keys_by_rank(pattern, tok, world, num_workers, monkeypatch, epoch=0):
    """{rank: [sample keys]} of one pass, each rank's loader run in turn (the rank comes from RANK/WORLD_SIZE)."""
    out = {}
    for rank in range(world):
        monkeypatch.setenv("RANK", str(rank))
        monkeypatch.setenv("WORLD_SIZE", str(world))
        loader = make_loader(pattern, tok, SIZE, 2, num_workers=num_workers, shuffle_buffer=4, epoch=epoch)
        out[rank] = [(meta["worker"], key) for *_, meta in loader for key in meta["keys"]]
    return out


@pytest.mark.parametrize("sizes, world, num_workers", [
    ([10], 2, 2),        # one shard for 4 (rank, worker) slots: split by sample
    ([4, 5, 3], 2, 2),   # 3 shards for 4 slots: split by sample
    ([10], 1, 2),        # one shard, two workers
    ([3, 4, 5, 6], 2, 1),  # enough shards: split by shard
])
def test_every_rank_and_worker_gets_a_disjoint_share(tmp_path, tok, monkeypatch, sizes, world, num_workers):
    start = 0
    for s, n in enumerate(sizes):
        write_shard(tmp_path / f"{s:06d}.tar", good_members(start, n))
        start += n
    pattern = str(tmp_path / f"{{000000..{len(sizes) - 1:06d}}}.tar")
    for epoch in (0, 1):
        seen = _keys_by_rank(pattern, tok, world, num_workers, monkeypatch, epoch)
        keys = [k for rank in seen.values() for _, k in rank]
        assert sorted(keys) == [f"{i:06d}" for i in range(start)]  # every sample once: disjoint and covering
        for rank in seen.values():  # no idle slot
            assert {w for w, _ in rank} == set(range(num_workers))
        if len(sizes) < world * num_workers:  # by sample: shares differ by at most one sample
            shares = [sum(1 for w, _ in seen[r] if w == worker) for r in seen for worker in range(num_workers)]
            assert max(shares) - min(shares) <= 1


def test_batches_carry_their_text_stats_out_of_the_workers(tmp_path):
    """A compact vocabulary without digits: "caption number 3" has one unknown token of 3; context 4 truncates."""
    small = get_tokenizer(context_length=4, vocab=compact_vocab(["caption number"]))
    shard = write_shard(tmp_path / "000000.tar", good_members(0, 6))
    text, stats = TextStats(), SkipStats()
    batches = list(iterate_batches(make_loader(shard, small, SIZE, 3, num_workers=2), stats, text_stats=text))
    assert len(batches) == 2
    assert text.as_dict() == {"captions": 6, "tokens": 18, "unknown": 6, "truncated": 6}
    assert small.stats.captions == 0  # nothing counted on the tokenizer copy of this process
    assert len(list(iterate_batches(make_loader(shard, small, SIZE, 3, num_workers=0), SkipStats()))) == 2


def test_same_seed_same_batches_different_seed_differs(tmp_path, tok):
    for s in range(4):
        write_shard(tmp_path / f"{s:06d}.tar", good_members(10 * s, 6))
    pattern = str(tmp_path / "{000000..000003}.tar")

    def run(seed):
        return collect(make_loader(pattern, tok, SIZE, 5, num_workers=2, seed=seed, shuffle_buffer=10))

    a, b, c = run(0), run(0), run(1)
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])
    assert not torch.equal(a[1], c[1])


def untimed(meta: dict) -> dict:
    """A batch's meta without its worker's seconds (a timing: no two passes agree on it)."""
    return {k: v for k, v in meta.items() if k != "seconds"}


@pytest.mark.parametrize("num_workers, sizes", [(0, [7, 3, 9, 2, 5]), (2, [7, 3, 9, 2, 5]),
                                                (2, [11])])  # 1 shard for 2 workers: split by sample
def test_exact_resume(tmp_path, tok, num_workers, sizes):
    # shards of unequal length so workers run out at different times; bad samples on the way
    for s, n in enumerate(sizes):
        write_shard(tmp_path / f"{s:06d}.tar", good_members(10 * s, n) + [(f"x{s}.png", b"junk"), (f"x{s}.txt", b"j")])
    pattern = str(tmp_path / f"{{000000..{len(sizes) - 1:06d}}}.tar")
    kw = dict(num_workers=num_workers, seed=3, shuffle_buffer=6)
    reference = list(make_loader(pattern, tok, SIZE, 4, **kw))
    total = SkipStats()
    for *_, meta in reference:
        total.merge(meta["skipped"])
    assert total.as_dict() == {"corrupt_image": len(sizes)}
    for cut in range(len(reference) + 1):
        position = StreamPosition(num_workers)
        for batch in reference[:cut]:
            position.update(batch[2])
        resumed = list(make_loader(pattern, tok, SIZE, 4, resume=position.state_dict(), **kw))
        assert len(resumed) == len(reference) - cut
        stats = SkipStats()
        for (im, tk, meta), (im2, tk2, meta2) in zip(resumed, reference[cut:]):
            assert torch.equal(im, im2) and torch.equal(tk, tk2) and untimed(meta) == untimed(meta2)
            stats.merge(meta["skipped"])
        for batch in reference[:cut]:
            stats.merge(batch[2]["skipped"])
        assert stats.as_dict() == total.as_dict()  # nothing counted twice or lost


def test_stream_options_hold_the_defaults_and_name_an_unknown_option(tmp_path, tok):
    assert StreamOptions() == StreamOptions(train=True, shuffle_buffer=1000, resampled=False, seed=0, epoch=0,
                                            crop_scale=(0.9, 1.0), partial=True, resume=None, fast_resume=True)
    state = StreamPosition(2, [3, 1]).state_dict()
    assert StreamOptions(resume=state).resume == StreamPosition(2, [3, 1])  # a saved state_dict is taken
    with pytest.raises(ValueError, match=r"unknown stream option 'shuffle'; known: \['train', 'shuffle_buffer'"):
        make_loader("x.tar", tok, SIZE, 2, shuffle=True)
    with pytest.raises(ValueError, match="unknown stream option 'trian'"):
        make_dataset("x.tar", tok, SIZE, trian=False)
    with pytest.raises(dataclasses.FrozenInstanceError):
        StreamOptions().seed = 1
    write_shard(tmp_path / "000000.tar", good_members(0, 7))
    shard = str(tmp_path / "000000.tar")
    by_keyword = collect(make_loader(shard, tok, SIZE, 3, num_workers=0, seed=2, shuffle_buffer=4, partial=False))
    options = StreamOptions(seed=2, shuffle_buffer=4)
    by_options = collect(make_loader(shard, tok, SIZE, 3, options, num_workers=0, partial=False))  # keywords on top
    assert len(by_keyword[0]) == 6 and all(torch.equal(a, b) for a, b in zip(by_keyword[:2], by_options[:2]))


def test_resampled_is_seeded_and_infinite(tmp_path, tok):
    write_shard(tmp_path / "000000.tar", good_members(0, 3))
    write_shard(tmp_path / "000001.tar", good_members(10, 3))
    pattern = str(tmp_path / "{000000..000001}.tar")

    def first(n, seed):
        it = iter(make_loader(pattern, tok, SIZE, 2, num_workers=0, resampled=True, seed=seed, shuffle_buffer=2))
        return [next(it)[1] for _ in range(n)]

    a, b = first(10, 0), first(10, 0)  # 20 samples from 6: resampling never ends
    assert all(torch.equal(x, y) for x, y in zip(a, b))


# ------------------------------------------------------------------ fast resume (mdc.data.shards)
def test_shuffle_buffer_is_webdatasets_and_restartable():
    import random

    import webdataset as wds

    from mdc.data.shards import shuffled

    for bufsize, n in [(0, 5), (1, 7), (5, 3), (5, 23), (100, 40)]:
        expected = list(wds.shuffle(bufsize, initial=bufsize, rng=random.Random(7))(iter(range(n))))
        assert list(shuffled(range(n), bufsize, random.Random(7))) == expected
        for cut in range(n + 1):  # stop after `cut` outputs, continue with the buffer and rng: the same stream
            rng, buf, source = random.Random(7), [], iter(range(n))
            head = list(itertools.islice(shuffled(source, bufsize, rng, buf), cut))
            assert head + list(shuffled(source, bufsize, rng, buf)) == expected


def test_shard_index_groups_members_like_the_reader(tmp_path):
    from mdc.data.shards import index_shard, shard_samples

    members = [("a.png", b"1"), ("a.TXT", b"2"), ("a.txt", b"3"),  # repeated suffix: a new sample
               ("noext", b"x"), ("__index__", b"meta"), ("b.png", b"4"), ("dir/c.png", b"5"), ("dir/c.txt", b"6"),
               ("b.txt", b"7"), ("d.tar.gz", b"8")]
    shard = write_shard(tmp_path / "000000.tar", members)
    index = index_shard(shard)
    with open(shard, "rb") as f:
        from_index = [index.read(k, f) for k in range(len(index.samples))]
    assert from_index == list(shard_samples([{"url": shard}], SkipStats()))
    assert [s["__key__"] for s in from_index] == ["a", "a", "b", "dir/c", "b", "d"]
    cut = tmp_path / "cut.tar"
    cut.write_bytes(open(shard, "rb").read()[:2000])  # data of a member cut off
    (tmp_path / "gz.tar").write_bytes(__import__("gzip").compress(open(shard, "rb").read()))
    assert index_shard(str(cut)) is None and index_shard(str(tmp_path / "gz.tar")) is None
    assert index_shard(str(tmp_path / "missing.tar")) is None


def _resumes_exactly(pattern, tok, num_workers, kw, fast, limit=None):
    """Resume at every batch boundary of a reference stream (its first `limit` batches if infinite)."""
    reference = list(itertools.islice(make_loader(pattern, tok, SIZE, 3, num_workers=num_workers, **kw), limit))
    for cut in range(len(reference) + 1):
        position = StreamPosition(num_workers)
        for batch in reference[:cut]:
            position.update(batch[2])
        resumed = make_loader(pattern, tok, SIZE, 3, num_workers=num_workers, resume=position.state_dict(),
                              fast_resume=fast, **kw)
        resumed = list(itertools.islice(resumed, None if limit is None else limit - cut))
        assert len(resumed) == len(reference) - cut
        for (im, tk, meta), (im2, tk2, meta2) in zip(resumed, reference[cut:]):
            assert torch.equal(im, im2) and torch.equal(tk, tk2) and untimed(meta) == untimed(meta2), cut


@pytest.mark.parametrize("case", ["clean", "bad shards", "by sample", "eval", "resampled"])
def test_fast_resume_equals_replay(tmp_path, tok, monkeypatch, case):
    """Resuming from tar headers gives the batches of a full replay; it is used where it can be."""
    import mdc.data.pipeline as pipeline

    sizes = [7, 3, 9, 2, 5] if case != "by sample" else [11]
    for s, n in enumerate(sizes):
        write_shard(tmp_path / f"{s:06d}.tar", good_members(10 * s, n) + [(f"x{s}.png", b"junk"), (f"x{s}.txt", b"j")])
    if case == "bad shards":
        full = (tmp_path / "000002.tar").read_bytes()
        (tmp_path / "000002.tar").write_bytes(full[:5000])  # truncated
        (tmp_path / "000003.tar").unlink()  # missing
    pattern = str(tmp_path / f"{{000000..{len(sizes) - 1:06d}}}.tar")
    kw = dict(seed=3, shuffle_buffer=6, train=case != "eval", resampled=case == "resampled")
    used = []
    monkeypatch.setattr(pipeline, "fast_forward", lambda *a: used.append(fast_forward(*a)) or used[-1])
    limit = 12 if case == "resampled" else None
    for num_workers in (0, 2):
        _resumes_exactly(pattern, tok, num_workers, kw, fast=True, limit=limit)
    _resumes_exactly(pattern, tok, 0, kw, fast=False, limit=limit)  # the plain replay: the same batches
    fell_back = [r is None for r in used]
    assert used and (any(fell_back) and not all(fell_back) if case == "bad shards" else not any(fell_back))
