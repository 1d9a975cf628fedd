"""Images + captions on disk -> img2dataset-layout shards that the training loader reads (mdc.data.convert)."""
import io
import json
import os
import tarfile

import numpy as np
import pytest
from PIL import Image

import mdc
from mdc.data.convert import items_from_folder, main, write_shards_from_items
from mdc.data.pipeline import SkipStats, iterate_batches, make_loader
from mdc.train import count_samples, vocab_from_captions


def _photos(folder, n, size=(40, 30), fmt="JPEG", suffix=".jpg"):
    os.makedirs(folder, exist_ok=True)
    rng = np.random.default_rng(0)
    paths = []
    for i in range(n):
        path = os.path.join(folder, f"photo{i}{suffix}")
        Image.fromarray(rng.integers(0, 255, (size[1], size[0], 3), dtype=np.uint8)).save(path, fmt)
        paths.append(path)
    return paths


def _members(path):
    with tarfile.open(path) as tar:
        return {m.name: tar.extractfile(m).read() for m in tar}


def test_items_become_img2dataset_shards_the_loader_reads(tmp_path):
    paths = _photos(tmp_path / "img", 5)
    items = [{"image_path": p, "caption": f"a red circle number {i}"} for i, p in enumerate(paths)]
    shards = write_shards_from_items(items, str(tmp_path / "shards"), shard_size=2)
    assert [os.path.basename(s) for s in shards] == ["00000.tar", "00001.tar", "00002.tar"]
    first = _members(shards[0])
    assert sorted(first) == ["000000.jpg", "000000.json", "000000.txt", "000001.jpg", "000001.json", "000001.txt"]
    with open(paths[0], "rb") as f:
        assert first["000000.jpg"] == f.read()  # image bytes kept as they are
    assert first["000001.txt"] == b"a red circle number 1"
    meta = json.loads(first["000001.json"])
    assert meta["key"] == "000001" and meta["status"] == "success" and (meta["width"], meta["height"]) == (40, 30)
    with open(tmp_path / "shards" / "00002_stats.json") as f:
        assert json.load(f)["successes"] == 1
    assert count_samples(str(tmp_path / "shards" / "{00000..00002}.tar")) == 5  # from the _stats.json files
    # the training loader reads them, and vocab_from_data builds the vocabulary from their captions
    pattern = str(tmp_path / "shards" / "{00000..00002}.tar")
    tok = mdc.get_tokenizer("tiny", vocab=vocab_from_captions(pattern))
    batches = list(iterate_batches(make_loader(pattern, tok, 16, 5, num_workers=0, train=False), SkipStats()))
    images, tokens = batches[0]
    assert images.shape == (5, 3, 16, 16) and tok.tokenize(["a red circle number 4"])[1].unknown == 0
    assert sorted(tok.decode(t) for t in tokens) == sorted(it["caption"] for it in items)
    again = write_shards_from_items(items, str(tmp_path / "again"), shard_size=2)
    assert all(open(a, "rb").read() == open(b, "rb").read() for a, b in zip(shards, again))  # reproducible bytes


def test_references_resizing_and_png(tmp_path):
    paths = _photos(tmp_path / "img", 2, size=(50, 20), fmt="PNG", suffix=".png")
    items = [{"image_path": p, "references": ["one caption", "another caption"]} for p in paths]
    shards = write_shards_from_items(items, str(tmp_path / "shards"), image_size=16)
    members = _members(shards[0])
    assert sum(name.endswith(".txt") for name in members) == 4  # one sample per reference
    image = Image.open(io.BytesIO(members["000000000.jpg"]))  # key: shard 00000, sample 0000 (10,000 a shard)
    assert image.size == (16, 16) and image.format == "JPEG"
    assert json.loads(members["000000000.json"])["original_width"] == 50
    kept = write_shards_from_items(items[:1], str(tmp_path / "kept"))
    assert "000000000.png" in _members(kept[0])


def test_missing_images_error_or_skip(tmp_path):
    paths = _photos(tmp_path / "img", 2)
    items = [{"image_path": paths[0], "caption": "ok"}, {"image_path": str(tmp_path / "gone.jpg"), "caption": "x"},
             {"image_path": paths[1], "caption": "fine"}]
    with pytest.raises(ValueError, match="gone.jpg"):
        write_shards_from_items(items, str(tmp_path / "a"))
    shards = write_shards_from_items(items, str(tmp_path / "b"), on_error="skip")
    assert sum(n.endswith(".txt") for n in _members(shards[0])) == 2
    with open(tmp_path / "b" / "00000_stats.json") as f:
        stats = json.load(f)
    assert stats["count"] == 3 and stats["successes"] == 2 and stats["failed_to_download"] == 1
    with pytest.raises(ValueError, match="empty caption"):
        write_shards_from_items([{"image_path": paths[0], "caption": "  "}], str(tmp_path / "c"))
    with pytest.raises(ValueError, match="needs 'image_path'"):
        write_shards_from_items([{"path": paths[0]}], str(tmp_path / "d"))


def test_folder_of_images_with_caption_files_and_the_command_line(tmp_path, capsys):
    paths = _photos(tmp_path / "folder", 3)
    for i, p in enumerate(paths[:2]):
        with open(os.path.splitext(p)[0] + ".txt", "w") as f:
            f.write(f"caption {i}\n")
    items = items_from_folder(str(tmp_path / "folder"))
    assert [it["caption"] for it in items] == ["caption 0", "caption 1"]  # photo2 has no caption file
    with pytest.raises(ValueError, match="no image with a caption"):
        items_from_folder(str(tmp_path))
    main(["--folder", str(tmp_path / "folder"), "--out", str(tmp_path / "cli")])
    assert json.loads(capsys.readouterr().out)["shards"] == 1
    coco = {"images": [{"id": 7, "file_name": os.path.basename(paths[2])}],
            "annotations": [{"id": 0, "image_id": 7, "caption": "a"}, {"id": 1, "image_id": 7, "caption": "b"}]}
    with open(tmp_path / "captions.json", "w") as f:
        json.dump(coco, f)
    main(["--coco", str(tmp_path / "captions.json"), "--images", str(tmp_path / "folder"), "--out",
          str(tmp_path / "coco"), "--image-size", "8"])
    assert sum(n.endswith(".txt") for n in _members(str(tmp_path / "coco" / "00000.tar"))) == 2
