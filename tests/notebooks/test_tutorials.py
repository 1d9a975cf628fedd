"""The tutorials as committed: executed, thin, free of machine paths, checked by nbval in `make test`.

(Running them is nbval's job: `make test` passes notebooks/tutorials with --nbval-lax and the
sanitize file; these checks are static and take a second.)
"""
import glob
import os
import re

import nbformat
import pytest

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
FOLDER = os.path.join(ROOT, "notebooks", "tutorials")
NOTEBOOKS = sorted(glob.glob(os.path.join(FOLDER, "*.ipynb")))
ALLOWED_IMPORTS = {"mdc", "matplotlib", "torch", "os"}  # the package, display, tensors, paths
MACHINE_PATH = re.compile(r"(?:/tmp/|/work/|/root/|/home/|/Users/|/private/var/|[A-Z]:\\\\)")


def _code(nb):
    return [c for c in nb.cells if c.cell_type == "code"]


def test_the_four_tutorials_exist():
    assert [os.path.basename(p) for p in NOTEBOOKS] == ["01_quickstart.ipynb", "02_sampler.ipynb",
                                                         "03_likelihoods.ipynb", "04_your_data.ipynb"]


@pytest.mark.parametrize("path", NOTEBOOKS, ids=os.path.basename)
def test_committed_executed_with_checked_outputs(path):
    nb = nbformat.read(path, as_version=4)
    assert nb.metadata.kernelspec.name == "python3"
    assert nb.cells[0].cell_type == "markdown" and nb.cells[0].source.startswith("# ")
    code = _code(nb)
    assert all(c.execution_count for c in code), "every code cell ran (outputs are committed)"
    assert not [o for c in code for o in c.outputs if o.output_type == "error"]
    checked = [c for c in code if c.source.startswith("# NBVAL_CHECK_OUTPUT")]
    assert checked and all(c.outputs for c in checked)
    assert len(nb.cells) <= 25


@pytest.mark.parametrize("path", NOTEBOOKS, ids=os.path.basename)
def test_thin_notebooks_without_machine_paths(path):
    nb = nbformat.read(path, as_version=4)
    text = nbformat.writes(nb)
    assert not MACHINE_PATH.findall(text), MACHINE_PATH.findall(text)[:3]
    for cell in _code(nb):
        assert not re.search(r"^\s*(def|class) ", cell.source, re.M), "helpers belong in mdc/"
        for module in re.findall(r"^\s*(?:from|import)\s+([\w.]+)", cell.source, re.M):
            assert module.split(".")[0] in ALLOWED_IMPORTS, module


def test_make_test_runs_them_with_nbval_and_the_sanitizer():
    makefile = open(os.path.join(ROOT, "Makefile")).read()
    recipe = makefile.split("\ntest:")[1].split("\n\n")[0]
    assert "$(TUTORIALS)" in recipe and "$(NBVAL)" in recipe
    assert re.search(r"NBVAL\s*:=.*--nbval-lax.*--nbval-sanitize-with \$\(TUTORIALS\)/sanitize.cfg", makefile)
    assert re.search(r"TUTORIALS\s*:=\s*notebooks/tutorials", makefile)


def test_sanitizer_normalises_paths_timings_progress_and_addresses():
    from nbval.plugin import get_sanitize_patterns  # nbval's own reading of the file

    with open(os.path.join(FOLDER, "sanitize.cfg")) as f:
        rules = [(re.compile(regex), replace) for regex, replace in get_sanitize_patterns(f.read())]
    assert len(rules) >= 5

    def clean(text):
        for regex, replace in rules:
            text = regex.sub(replace, text)
        return text

    a = "saved to /tmp/mdc-tutorial-ab12/run/x.json in 3.2 s at 0x7f3a9c; mdc tiny: 100%|##| 5/5 [00:01<00:00, 4.1it/s]"
    b = "saved to /var/folders/q/mdc-tutorial-zz99/run/x.json in 12 s at 0x55aa10; mdc tiny:  40%|#| 2/5 [00:09<00:02]"
    assert clean(a) == clean(b)
    kept = "tokens_per_step= 2: 8 steps\n4096 training pairs, images (4096, 3, 32, 32)\n267,904 parameters"
    assert clean(kept) == kept  # what the checked cells print survives
