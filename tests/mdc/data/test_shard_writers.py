"""Shard writing owns its --out folder while it writes, and its command lines refuse bad values in one line."""
import os

import numpy as np
import pytest
from PIL import Image

from mdc.data import convert
from mdc.base.lock import FolderInUseError, FolderLock
from mdc.world import scenes


def test_synthetic_shards_into_a_folder_in_use_are_refused(tmp_path):
    out = tmp_path / "shards"
    with FolderLock(str(out), ".shards.lock", "a shard writer"):
        with pytest.raises(FolderInUseError, match=f"in use by a shard writer \\(pid {os.getpid()}"):
            scenes.write_shards(str(out), 4, "alt", seed=0, image_size=16, shard_size=2)
        assert os.listdir(out) == [".shards.lock"]
    paths = scenes.write_shards(str(out), 4, "alt", seed=0, image_size=16, shard_size=2, workers=2)
    assert sorted(os.listdir(out)) == ["000000.tar", "000001.tar"] == [os.path.basename(p) for p in paths]


def test_converted_shards_into_a_folder_in_use_are_refused(tmp_path):
    image = tmp_path / "cat.png"
    Image.fromarray(np.zeros((8, 8, 3), np.uint8)).save(image)
    items = [{"image_path": str(image), "caption": "a cat"}]
    with FolderLock(str(tmp_path / "out"), ".shards.lock", "a shard writer"):
        with pytest.raises(FolderInUseError, match="in use by a shard writer"):
            convert.write_shards_from_items(items, str(tmp_path / "out"))
    convert.write_shards_from_items(items, str(tmp_path / "out"))
    assert sorted(os.listdir(tmp_path / "out")) == ["00000.tar", "00000_stats.json"]


@pytest.mark.parametrize("argv, line", [
    (["--num", "0"], "error: --num must be >= 1, got 0"),
    (["--num", "4", "--shard-size", "0"], "error: --shard-size must be >= 1, got 0"),
    (["--num", "4", "--workers", "0"], "error: --workers must be >= 1, got 0"),
    (["--num", "4", "--image-size", "0"], "error: --image-size must be >= 1, got 0"),
    (["--num", "4", "--seed", "-1"], "error: --seed must be >= 0, got -1"),
    (["--num", "x"], "error: argument --num: invalid int value: 'x'"),
])
def test_scenes_command_line_refuses_bad_values_in_one_line(argv, line, tmp_path, capsys, monkeypatch):
    monkeypatch.delenv("MDC_DEBUG", raising=False)
    with pytest.raises(SystemExit) as info:
        scenes.main(["--out", str(tmp_path / "out"), "--style", "alt"] + argv)
    err = capsys.readouterr().err.strip().splitlines()
    assert info.value.code == 2 and err == [line] and not (tmp_path / "out").exists()


@pytest.mark.parametrize("argv, line", [
    (["--shard-size", "0"], "error: --shard-size must be >= 1, got 0"),
    (["--image-size", "-5"], "error: --image-size must be >= 1, got -5"),
    (["--coco", "c.json"], "error: --images is needed with --coco and --karpathy"),
])
def test_convert_command_line_refuses_bad_values_in_one_line(argv, line, tmp_path, capsys, monkeypatch):
    monkeypatch.delenv("MDC_DEBUG", raising=False)
    (tmp_path / "img").mkdir()
    source = [] if "--coco" in argv else ["--folder", str(tmp_path / "img")]
    with pytest.raises(SystemExit) as info:
        convert.main(source + ["--out", str(tmp_path / "out")] + argv)
    err = capsys.readouterr().err.strip().splitlines()
    assert info.value.code == 2 and err == [line] and not (tmp_path / "out").exists()


def test_convert_command_line_says_what_is_missing_in_one_line(tmp_path, capsys, monkeypatch):
    monkeypatch.delenv("MDC_DEBUG", raising=False)
    with pytest.raises(SystemExit) as info:
        convert.main(["--folder", str(tmp_path / "nowhere"), "--out", str(tmp_path / "out")])
    err = capsys.readouterr().err.strip().splitlines()
    assert info.value.code == 1 and err == [f"error: {tmp_path / 'nowhere'}: folder not found"]


def test_evaluation_sets_without_probe_or_training_images_are_written(tmp_path):
    from mdc.world.evalsets import write_evalsets  # the captioning and guidance notebooks ask for these

    summary = write_evalsets(str(tmp_path), 0, 16, n_probe_train=0, n_probe_test=0, n_items=2, n_caption_train=0)
    assert summary["captions"]["test"] == 2 and all(t["train"] == 0 for t in summary["probe"].values())


def test_evaluation_sets_into_a_folder_in_use_are_refused(tmp_path):
    from mdc.world.evalsets import write_evalsets

    with FolderLock(str(tmp_path / "eval"), ".shards.lock", "a shard writer"):
        with pytest.raises(FolderInUseError, match="in use by a shard writer"):
            write_evalsets(str(tmp_path / "eval"), 0, 16, n_probe_train=2, n_probe_test=2, n_items=2, n_caption_train=2)
        assert os.listdir(tmp_path / "eval") == [".shards.lock"]


@pytest.mark.parametrize("argv, line", [
    (["--n-items", "0"], "error: --n-items must be >= 1, got 0"),
    (["--n-probe-train", "-2"], "error: --n-probe-train must be >= 0, got -2"),  # 0: no probe images
    (["--image-size", "0"], "error: --image-size must be >= 1, got 0"),
    (["--seed", "-1"], "error: --seed must be >= 0, got -1"),
])
def test_evalsets_command_line_refuses_bad_values_in_one_line(argv, line, tmp_path, capsys, monkeypatch):
    from mdc.world import evalsets

    monkeypatch.delenv("MDC_DEBUG", raising=False)
    with pytest.raises(SystemExit) as info:
        evalsets.main(["--out", str(tmp_path / "out")] + argv)
    err = capsys.readouterr().err.strip().splitlines()
    assert info.value.code == 2 and err == [line] and not (tmp_path / "out").exists()
