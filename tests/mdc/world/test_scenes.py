"""The synthetic scene world: determinism, shard layout, captions, vocabulary, length statistics."""
from __future__ import annotations

import io
import json
import tarfile

import numpy as np
import pytest
from PIL import Image

from mdc.world import scenes
from mdc.world.render import COLOURS, SHAPES, SIZES
from mdc.world.text import MAX_TOKENS, caption, references, relation_of, vocabulary
from mdc.data.stats import caption_lengths, length_histogram
from mdc import get_tokenizer
from conftest import tar_members


@pytest.fixture(scope="module")
def sampled():
    """3,000 scenes of the training stream (no rendering)."""
    return [scenes.sample_scene(scenes.stream_rng(0, scenes.STREAM_SCENE, i)) for i in range(3000)]


@pytest.fixture(scope="module")
def compact_tok():
    return get_tokenizer(context_length=77, vocab=vocabulary())


def test_same_seed_same_bytes_and_different_seed_differs(tmp_path):
    a = scenes.write_shards(str(tmp_path / "a"), 25, "alt", seed=3, shard_size=10)
    b = scenes.write_shards(str(tmp_path / "b"), 25, "alt", seed=3, shard_size=10)
    c = scenes.write_shards(str(tmp_path / "c"), 25, "alt", seed=4, shard_size=10)
    assert [p.rsplit("/", 1)[1] for p in a] == ["000000.tar", "000001.tar", "000002.tar"]
    for pa, pb, pc in zip(a, b, c):
        assert open(pa, "rb").read() == open(pb, "rb").read()
        assert open(pa, "rb").read() != open(pc, "rb").read()


def test_shards_round_trip(tmp_path):
    paths = scenes.write_shards(str(tmp_path), 12, "descriptive", seed=1, image_size=48, shard_size=5)
    keys = []
    for path in paths:
        members = tar_members(path)
        with tarfile.open(path) as tar:
            info = tar.getmembers()[0]
        assert (info.mtime, info.uid, info.gid, info.uname) == (0, 0, 0, "")
        for key in sorted({name.split(".")[0] for name in members}):
            assert {f"{key}.png", f"{key}.txt", f"{key}.json"} <= set(members)
            record = json.loads(members[f"{key}.json"])
            text = members[f"{key}.txt"].decode("utf-8")
            image = Image.open(io.BytesIO(members[f"{key}.png"]))
            assert image.mode == "RGB" and image.size == (48, 48)
            assert record["caption"] == text and record["key"] == key and record["style"] == "descriptive"
            assert len(record["references"]) >= 3 and len(set(record["references"])) == len(record["references"])
            assert np.array_equal(np.asarray(image), np.asarray(scenes.render(record, 48)))
            for obj in record["objects"]:
                assert obj["colour"] in text and obj["shape"] in text
                x, y, w, h = obj["bbox"]
                assert 0 <= x and 0 <= y and x + w <= 48 and y + h <= 48 and w > 0 and h > 0
            keys.append(key)
    assert keys == [f"{i:09d}" for i in range(12)]


def test_write_tar_matches_tarfile(tmp_path):
    """The directly built headers give exactly tarfile's USTAR bytes (long and non-ASCII names included)."""
    members = [("000000001.png", b"x" * 700), ("a.txt", b""), ("b.json", b"y" * 512), ("caf\u00e9.txt", b"z"),
               ("d/" * 40 + "long.txt", b"w" * 3)]  # 123 characters: split into USTAR's prefix and name
    for n in range(len(members) + 1):
        ours = scenes.write_tar(str(tmp_path / "ours.tar"), members[:n])
        with tarfile.open(tmp_path / "ref.tar", "w", format=tarfile.USTAR_FORMAT, encoding="utf-8") as tar:
            for name, data in members[:n]:
                info = tarfile.TarInfo(name)
                info.size, info.mtime, info.mode, info.uname, info.gname = len(data), 0, 0o644, "", ""
                tar.addfile(info, io.BytesIO(data))
        assert open(ours, "rb").read() == (tmp_path / "ref.tar").read_bytes(), n


def test_npy_format_and_parallel_writing_keep_the_content(tmp_path):
    png = scenes.write_shards(str(tmp_path / "png"), 7, "alt", seed=2, image_size=32, shard_size=3)
    npy = scenes.write_shards(str(tmp_path / "npy"), 7, "alt", seed=2, image_size=32, shard_size=3,
                              image_format="npy")
    forked = scenes.write_shards(str(tmp_path / "forked"), 7, "alt", seed=2, image_size=32, shard_size=3,
                                 image_format="npy", workers=2)
    for a, b, c in zip(png, npy, forked):
        assert open(b, "rb").read() == open(c, "rb").read()  # parallel writing: the same bytes
        ma, mb = tar_members(a), tar_members(b)
        for key in sorted({name.split(".")[0] for name in ma}):
            image = np.load(io.BytesIO(mb[f"{key}.npy"]), allow_pickle=False)
            assert image.dtype == np.uint8 and image.shape == (32, 32, 3)
            assert np.array_equal(image, np.asarray(Image.open(io.BytesIO(ma[f"{key}.png"]))))
            assert ma[f"{key}.txt"] == mb[f"{key}.txt"] and ma[f"{key}.json"] == mb[f"{key}.json"]
    with pytest.raises(ValueError, match="image_format must be one of .*'jpg'"):
        scenes.write_shards(str(tmp_path / "x"), 2, "alt", seed=0, image_format="jpg")


def test_both_styles_share_images(tmp_path):
    alt = tar_members(scenes.write_shards(str(tmp_path / "alt"), 6, "alt", seed=2)[0])
    desc = tar_members(scenes.write_shards(str(tmp_path / "desc"), 6, "descriptive", seed=2)[0])
    for i in range(6):
        assert alt[f"{i:09d}.png"] == desc[f"{i:09d}.png"]
        assert alt[f"{i:09d}.txt"] != desc[f"{i:09d}.txt"]


def test_scene_invariants(sampled):
    counts = np.bincount([len(s["objects"]) for s in sampled])
    assert counts[0] == 0 and counts[1:].min() > 600  # 1-4 objects, roughly uniform
    for scene in sampled[:1000]:
        objs = scene["objects"]
        assert len({o["shape"] for o in objs}) == len({o["colour"] for o in objs}) == len(objs)
        for o in objs:
            lo, hi = SIZES[o["size"]]
            assert lo <= o["radius"] <= hi and o["radius"] <= o["x"] <= 1 - o["radius"]
        assert len(scene["relations"]) == len(objs) * (len(objs) - 1)
        for i, a in enumerate(objs):
            for j, b in enumerate(objs[i + 1:], i + 1):
                dx, dy = abs(a["x"] - b["x"]), abs(a["y"] - b["y"])
                assert np.hypot(dx, dy) >= a["radius"] + b["radius"]  # no overlap
                assert max(dx, dy) >= scenes.AXIS_RATIO * min(dx, dy)  # unambiguous relation
                assert scenes.relation(a, b) == relation_of(scene, i, j)
                assert {relation_of(scene, i, j), relation_of(scene, j, i)} in (
                    {"left of", "right of"}, {"above", "below"})


def test_constraints_are_obeyed():
    rng = np.random.default_rng(0)
    s = scenes.sample_scene(rng, n_objects=3, sizes=["large", "small", "small"],
                            first={"shape": "star", "colour": "pink", "texture": "dotted"}, background="noisy")
    assert [o["size"] for o in s["objects"]] == ["large", "small", "small"]
    first = s["objects"][0]
    assert (first["shape"], first["colour"], first["texture"]) == ("star", "pink", "dotted")
    assert s["background"]["kind"] == "noisy" and "seed" in s["background"]
    with pytest.raises(ValueError):
        scenes.sample_scene(rng, n_objects=5)


def test_caption_lengths_and_vocabulary(sampled, compact_tok):
    rng = np.random.default_rng(0)
    lengths = {}
    for style in ("alt", "descriptive", "reference"):
        lengths[style] = np.array([len(compact_tok.encode(caption(s, style, rng))) for s in sampled])
        assert lengths[style].max() + 2 <= MAX_TOKENS[style]
    refs = [r for s in sampled[:500] for r in references(s, rng, 5)]
    assert max(len(compact_tok.encode(r)) for r in refs) + 2 <= MAX_TOKENS["reference"]
    assert compact_tok.unknown_count == 0  # vocabulary() covers every generated caption
    assert lengths["alt"].mean() < 0.4 * lengths["descriptive"].mean()
    assert np.median(lengths["alt"]) <= 10 and np.percentile(lengths["alt"], 95) <= 18


def test_captions_reflect_the_image(sampled):
    rng = np.random.default_rng(1)
    for scene in sampled[:300]:
        alt = caption(scene, "alt", rng)
        assert any(o["shape"] in alt for o in scene["objects"])
        text = caption(scene, "descriptive", rng)
        for o in scene["objects"]:
            assert o["colour"] in text and o["shape"] in text and o["size"] in text.replace("big", "large").replace(
                "little", "small")
    with pytest.raises(ValueError):
        caption(sampled[0], "poem", rng)


def test_vocabulary_is_closed_and_small():
    vocab = vocabulary()
    assert list(vocab) == sorted(set(vocab)) and 50 < len(vocab) < 400
    tok = get_tokenizer(context_length=64, vocab=vocab)
    names = " ".join([*SHAPES, *COLOURS, "left of right above below", "#design | free download - stock image"])
    tok.encode(names)
    assert tok.unknown_count == 0


def test_cli_and_caption_length_stats(tmp_path, capsys):
    scenes.main(["--out", str(tmp_path), "--num", "30", "--style", "alt", "--seed", "5", "--shard-size", "10"])
    summary = json.loads(capsys.readouterr().out)
    assert summary["shards"] == 3 and summary["format"] == "png"
    scenes.main(["--out", str(tmp_path / "npy"), "--num", "4", "--style", "alt", "--format", "npy", "--workers", "2"])
    assert json.loads(capsys.readouterr().out)["format"] == "npy"
    assert "000000003.npy" in tar_members(str(tmp_path / "npy" / "000000.tar"))
    tok = get_tokenizer()
    lengths = caption_lengths(str(tmp_path / "{000000..000002}.tar"), tokenizer=tok)
    texts = [json.loads(v)["caption"] for p in sorted(tmp_path.glob("*.tar")) for k, v in tar_members(str(p)).items()
             if k.endswith(".json")]
    assert lengths.tolist() == [len(tok.encode(t)) for t in texts]
    assert len(caption_lengths(str(tmp_path / "*.tar"), max_samples=7)) == 7
    frac, edges = length_histogram(lengths, bins=range(0, 40, 5))
    assert frac.sum() == pytest.approx(1.0) and len(edges) == 8


def test_caption_lengths_skip_bad_captions_and_shards(tmp_path):
    from mdc.data.writer import write_tar
    from mdc.data.stats import caption_lengths

    write_tar(str(tmp_path / "000000.tar"), [("a.txt", b"a red circle"), ("b.txt", b"\xff\xfe bad")])
    (tmp_path / "000001.tar").write_bytes(b"not a tar at all")
    with pytest.warns(UserWarning) as caught:
        lengths = caption_lengths(str(tmp_path / "{000000..000001}.tar"))
    assert lengths.tolist() == [3]
    text = " ".join(str(w.message) for w in caught)
    assert "b.txt" in text and "000001.tar" in text
