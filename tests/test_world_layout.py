"""One direction of dependencies: mdc.world (the synthetic world) may import mdc.data and the
base modules (mdc.tokenizer, mdc.errors, mdc.lock); mdc.data (real-data I/O) never imports mdc.world; neither imports the model.
The old module paths (mdc.data.scenes, scene_render, scene_text, evalsets, compositionality)
still work for one release, command lines included."""
import ast
import glob
import importlib
import os
import subprocess
import sys

import pytest

from mdc.world.evalsets import write_evalsets
from mdc.world.scenes import write_shards

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MOVED = {"mdc.data.scenes": "mdc.world.scenes", "mdc.data.scene_render": "mdc.world.render",
         "mdc.data.scene_text": "mdc.world.text", "mdc.data.evalsets": "mdc.world.evalsets",
         "mdc.data.compositionality": "mdc.data.benchmarks"}
SHARED = ("mdc.tokenizer", "mdc._compat", "mdc.errors", "mdc.lock")  # base modules below both


def _modules(folder: str) -> dict[str, str]:
    return {f"mdc.{folder}.{os.path.basename(p)[:-3]}".removesuffix(".__init__"): p
            for p in sorted(glob.glob(os.path.join(ROOT, "mdc", folder, "*.py")))}


def _mdc_imports(path: str) -> list[tuple[str, bool]]:
    """(imported mdc module, imported at the top level) for every import of the file."""
    tree = ast.parse(open(path).read())
    top = set(map(id, tree.body))
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
        else:
            continue
        out += [(n, id(node) in top) for n in names if n == "mdc" or n.startswith("mdc.")]
    return out


def _allowed(name: str, prefixes) -> bool:
    return any(name == p or name.startswith(p + ".") for p in prefixes)


@pytest.mark.parametrize("folder,allowed", [("data", ("mdc.data",) + SHARED),
                                            ("world", ("mdc.world", "mdc.data") + SHARED)])
def test_one_direction_of_dependencies(folder, allowed):
    for module, path in _modules(folder).items():
        if module in MOVED:
            continue  # the old paths re-export their new home, by design
        for name, at_top in _mdc_imports(path):
            assert _allowed(name, allowed) and not _allowed(name, MOVED), f"{module} imports {name}"
            assert at_top, f"{module} imports {name} inside a function"


@pytest.mark.parametrize("old", sorted(MOVED))
def test_old_paths_reexport_the_same_objects(old):
    before, after = importlib.import_module(old), importlib.import_module(MOVED[old])
    names = [n for n in vars(after) if not n.startswith("__")]
    assert names and all(getattr(before, n) is getattr(after, n) for n in names)


def test_old_scene_names_still_resolve():
    from mdc.data import scenes, writer
    from mdc.world import streams

    assert scenes.write_tar is writer.write_tar and scenes.png_bytes is writer.png_bytes
    assert scenes.npy_bytes is writer.npy_bytes and scenes.stream_rng is streams.stream_rng
    assert (scenes.STREAM_SCENE, scenes.STREAM_CAPTION, scenes.STREAM_REFERENCES) == (0, 1, 2)


def _files(folder) -> dict[str, bytes]:
    return {os.path.relpath(p, folder): open(p, "rb").read()
            for p in sorted(glob.glob(os.path.join(folder, "**", "*"), recursive=True)) if os.path.isfile(p)}


def test_old_command_lines_write_the_same_bytes(tmp_path):
    def run(module, *args):
        subprocess.run([sys.executable, "-m", module, *args], check=True, cwd=ROOT, capture_output=True)

    run("mdc.data.scenes", "--out", str(tmp_path / "old"), "--num", "5", "--style", "alt", "--shard-size", "3",
        "--image-size", "16", "--seed", "2")
    write_shards(str(tmp_path / "new"), 5, "alt", 2, image_size=16, shard_size=3)
    assert _files(tmp_path / "old") == _files(tmp_path / "new") and len(_files(tmp_path / "new")) == 2
    run("mdc.data.evalsets", "--out", str(tmp_path / "old_eval"), "--seed", "2", "--image-size", "16",
        "--n-probe-train", "4", "--n-probe-test", "4", "--n-items", "2", "--n-caption-train", "2")
    write_evalsets(str(tmp_path / "new_eval"), 2, 16, n_probe_train=4, n_probe_test=4, n_items=2, n_caption_train=2)
    assert _files(tmp_path / "old_eval") == _files(tmp_path / "new_eval")
