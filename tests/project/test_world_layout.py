"""One direction of dependencies: mdc.world (the synthetic world) may import mdc.data and the
base modules (mdc.tokenizer, mdc.base.errors, mdc.base.cli, mdc.base.lock, mdc.base.options, mdc.base.seeding); mdc.data (real-data I/O) never imports
mdc.world; neither imports the model."""
import ast
import glob
import os

import pytest

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
SHARED = ("mdc.tokenizer", "mdc.base.torchvision_shim", "mdc.base.errors", "mdc.base.cli", "mdc.base.lock", "mdc.base.options",
          "mdc.base.seeding")  # base modules below both


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
        for name, at_top in _mdc_imports(path):
            assert _allowed(name, allowed), f"{module} imports {name}"
            assert at_top, f"{module} imports {name} inside a function"
