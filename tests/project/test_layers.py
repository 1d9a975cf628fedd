"""The package's layers run one way (pyproject's import-linter contract, drawn in docs/layers.md)."""
import ast
import json
import re
import os
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
LINT = Path(sys.executable).with_name("lint-imports")


def _lint(root: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(root)}  # the tree at root, not the installed one
    return subprocess.run([str(LINT), "--no-cache"], cwd=root, env=env, capture_output=True, text=True, timeout=300)


def test_the_layer_contract_holds():
    out = _lint(ROOT)
    assert out.returncode == 0, out.stdout[-3000:]


def test_the_contract_refuses_a_core_module_importing_an_extension(tmp_path):
    for name in ("mdc", "reproduce", "benchmarks"):
        shutil.copytree(ROOT / name, tmp_path / name, ignore=shutil.ignore_patterns("__pycache__", "runs"))
    shutil.copy(ROOT / "pyproject.toml", tmp_path)
    model = tmp_path / "mdc" / "model.py"
    model.write_text(model.read_text() + "\n\ndef _late():\n    import mdc.mc_diffusion.guidance  # noqa: F401\n")  # lazy, upward
    out = _lint(tmp_path)
    assert out.returncode != 0 and "mdc.model is not allowed to import mdc.mc_diffusion" in out.stdout
    assert "mdc.model -> mdc.mc_diffusion.guidance" in out.stdout


def test_the_notebooks_import_the_package_alone():
    """Notebooks sit with the experiments but import mdc only: the reproduction (reproduce, which builds the
    figures from its records itself) and the benchmarks stand above them."""
    above = re.compile(r"^\s*(?:from|import)\s+(reproduce|benchmarks)\b", re.M)
    found = []
    for path in sorted((ROOT / "notebooks").rglob("*.ipynb")):
        cells = json.loads(path.read_text())["cells"]
        found += [f"{path.relative_to(ROOT)}: {m.group(0).strip()}" for c in cells if c["cell_type"] == "code"
                  for m in above.finditer("".join(c["source"]))]
    assert not found, found


def test_no_function_level_import_of_mdc_inside_the_package():
    """Lazy imports hide a cycle instead of removing it; only third-party imports may be deferred."""
    found = []
    for path in sorted((ROOT / "mdc").rglob("*.py")):
        for fn in ast.walk(ast.parse(path.read_text())):
            if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            for node in ast.walk(fn):
                names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                    [node.module or ""] if isinstance(node, ast.ImportFrom) and node.level == 0 else []
                if isinstance(node, ast.ImportFrom) and node.level > 0:
                    names = ["mdc (relative)"]
                found += [f"{path.relative_to(ROOT)}:{node.lineno} {n}" for n in names if n.split(".")[0] == "mdc"
                          or n == "mdc (relative)"]
    assert not found, found


def test_the_layer_map_names_every_module():
    """docs/layers.md is the code map: every module of mdc/ appears in its diagram, so a file added or
    moved without it fails here."""
    diagram = (ROOT / "docs" / "layers.md").read_text().split("```")[1]
    words = set(re.findall(r"[\w.]+", diagram))
    missing = [str(p.relative_to(ROOT)) for p in sorted((ROOT / "mdc").rglob("*.py"))
               if p.stem != "__init__" and p.stem != "__main__"
               and p.stem not in words and f"mdc.{p.stem}" not in words]
    assert not missing, f"docs/layers.md does not name {missing}"


def _sources():  # the package's and the experiments' code, not a study's pinned copy among the run folders
    return sorted(p for folder in ("mdc", "reproduce") for p in (ROOT / folder).rglob("*.py")
                  if (ROOT / "reproduce" / "runs") not in p.parents)


def test_the_folders_show_the_layers():
    """The root of mdc/ holds the method and its entry points (at most 17 modules: MDC's sampler and its decoders
    are a module of their own beside the process, which the 400-line limit would not hold), reproduce/ the registry
    and the command lines (at most 10); MC-Diffusion's modules share one subpackage."""
    assert len(list((ROOT / "mdc").glob("*.py"))) <= 17
    assert len(list((ROOT / "reproduce").glob("*.py"))) <= 10
    assert {p.name for p in (ROOT / "mdc" / "mc_diffusion").glob("*.py")} >= {"guidance.py", "mask_replace.py",
                                                                             "vqvae.py"}


def test_no_file_over_400_lines_no_function_over_60_lines_or_8_positional_parameters():
    """Keyword-only options aside (an option set such as ElboOptions carries the rest), a function takes at most
    8 positional parameters."""
    found = []
    for path in _sources():
        text = path.read_text()
        if text.count("\n") > 400:
            found.append(f"{path.relative_to(ROOT)}: {text.count(chr(10))} lines")
        for fn in ast.walk(ast.parse(text)):
            if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
                positional = [a.arg for a in fn.args.posonlyargs + fn.args.args if a.arg not in ("self", "cls")]
                if fn.end_lineno - fn.lineno + 1 > 60 or len(positional) > 8:
                    found.append(f"{path.relative_to(ROOT)}:{fn.lineno} {fn.name}")
    assert not found, found
