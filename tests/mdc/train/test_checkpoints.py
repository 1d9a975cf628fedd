"""Checkpoint writing: durable (fsync), a full disk fails cleanly, stale temporaries and old steps are pruned."""
import errno
import json
import os

import pytest
import safetensors.torch

from mdc.base import checkpoint
from conftest import small_model


def _save(run, step, **kw):
    return checkpoint.save(str(run), step, small_model(), {"step": step}, **kw)


def _latest(run):
    return json.loads((run / "checkpoints" / "latest.json").read_text())["path"]


def _entries(run):
    return sorted(os.listdir(run / "checkpoints"))


@pytest.mark.parametrize("error", [OSError(errno.ENOSPC, "No space left on device"),
                                   # what safetensors' Rust writer raises on a full disk
                                   RuntimeError("Error while serializing: I/O error: No space left on device "
                                                "(os error 28)")])
def test_full_disk_gives_a_clear_error_and_leaves_the_last_checkpoint(tmp_path, monkeypatch, error):
    _save(tmp_path, 1)
    real = safetensors.torch.save_file

    def full_disk(tensors, filename, *args, **kw):
        with open(filename, "wb") as f:
            f.write(b"partial")
        raise error

    monkeypatch.setattr(safetensors.torch, "save_file", full_disk)
    with pytest.raises(OSError, match=r"no space left on device.*step_000002") as info:
        _save(tmp_path, 2)
    assert info.value.errno == errno.ENOSPC
    assert _entries(tmp_path) == ["latest.json", "step_000001"]  # no temporary folder, no half checkpoint
    assert _latest(tmp_path) == "step_000001"
    monkeypatch.setattr(safetensors.torch, "save_file", real)
    assert checkpoint.latest(str(tmp_path)).endswith("step_000001")


def test_full_disk_while_updating_latest_json(tmp_path, monkeypatch):
    _save(tmp_path, 1)
    replace = os.replace

    def full_disk(src, dst):
        if str(dst).endswith("latest.json"):
            raise OSError(errno.ENOSPC, "No space left on device")
        replace(src, dst)

    monkeypatch.setattr(os, "replace", full_disk)
    with pytest.raises(OSError, match=r"no space left on device.*step_000002"):
        _save(tmp_path, 2)
    assert _latest(tmp_path) == "step_000001"
    assert not [n for n in _entries(tmp_path) if ".tmp-" in n]


def test_other_write_errors_propagate_unchanged_and_clean_up(tmp_path, monkeypatch):
    def denied(*args, **kw):
        raise PermissionError(errno.EACCES, "Permission denied")

    monkeypatch.setattr(safetensors.torch, "save_file", denied)
    with pytest.raises(PermissionError):
        _save(tmp_path, 1)
    assert _entries(tmp_path) == []


def test_stale_temporary_folders_are_removed_by_the_next_save(tmp_path):
    stale = tmp_path / "checkpoints" / ".step_000005.tmp-99999"
    stale.mkdir(parents=True)
    (stale / "model.safetensors").write_bytes(b"half")
    (tmp_path / "checkpoints" / "latest.json.tmp-99999").write_text("{")
    _save(tmp_path, 6)
    assert _entries(tmp_path) == ["latest.json", "step_000006"]


def test_keep_last_keeps_the_newest_k(tmp_path):
    for step in (1, 2, 3, 4):
        _save(tmp_path, step, keep_last=2)
    assert _entries(tmp_path) == ["latest.json", "step_000003", "step_000004"]
    _save(tmp_path, 5)  # default: keep everything
    assert _entries(tmp_path) == ["latest.json", "step_000003", "step_000004", "step_000005"]
    _save(tmp_path, 6, keep_last=1)
    assert _entries(tmp_path) == ["latest.json", "step_000006"]
    for step in (7, 8, 9):
        _save(tmp_path, step)
    # a run resumed at step 7 (killed before latest.json named 8 and 9) re-saves 7: steps after
    # latest.json's are not "older"; they stay until the resumed run overwrites them
    (tmp_path / "checkpoints" / "latest.json").write_text(json.dumps({"step": 7, "path": "step_000007"}))
    _save(tmp_path, 7, keep_last=1)
    assert _entries(tmp_path) == ["latest.json", "step_000007", "step_000008", "step_000009"]
    with pytest.raises(ValueError, match="keep_last must be at least 1; got 0"):
        _save(tmp_path, 6, keep_last=0)


@pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="needs /proc to name fsync'ed descriptors")
def test_files_and_folders_are_fsynced_before_they_are_published(tmp_path, monkeypatch):
    events = []
    fsync, replace = os.fsync, os.replace

    def recording_fsync(fd):
        events.append(("fsync", os.readlink(f"/proc/self/fd/{fd}")))
        fsync(fd)

    def recording_replace(src, dst):
        events.append(("replace", os.path.abspath(src), os.path.abspath(dst)))
        replace(src, dst)

    monkeypatch.setattr(os, "fsync", recording_fsync)
    monkeypatch.setattr(os, "replace", recording_replace)
    final = _save(tmp_path, 1, run_config={"objective": "mdc"})
    root = str(tmp_path / "checkpoints")
    rename = next(i for i, e in enumerate(events) if e[0] == "replace" and e[2] == final)
    tmp = events[rename][1]
    synced_before = {e[1] for e in events[:rename] if e[0] == "fsync"}
    assert {os.path.join(tmp, n) for n in os.listdir(final)} | {tmp} <= synced_before
    assert set(os.listdir(final)) == {"model.safetensors", "config.json", "trainer.pt", "train_config.json"}
    pointer = next(i for i, e in enumerate(events) if e[0] == "replace" and e[2].endswith("latest.json"))
    assert ("fsync", root) in events[rename:pointer]  # the rename is durable before latest.json names it
    assert ("fsync", root) in events[pointer:]  # and so is latest.json's own rename
