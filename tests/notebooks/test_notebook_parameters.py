"""Every assignment in a notebook's parameters cell is a parameter papermill reads, with its help.

papermill skips a parameters-cell line it cannot parse (one with a second '=' in its comment, for
instance) with only a warning: the value then never shows in ``papermill --help-notebook``, and a run
passing it logs "Passed unknown parameter" while the notebook silently keeps its default. And every
notebook, tutorials included, is valid in its own nbformat version."""
import ast
import glob
import os
import warnings

import nbformat
import papermill
import pytest

FOLDER = os.path.join(os.path.dirname(__file__), "..", "..", "notebooks")
NOTEBOOKS = sorted(glob.glob(os.path.join(FOLDER, "*.ipynb")))
TUTORIALS = sorted(glob.glob(os.path.join(FOLDER, "tutorials", "*.ipynb")))


def _assigned(source: str) -> list[str]:
    """Names assigned at the top level of a parameters cell."""
    names = []
    for node in ast.parse(source).body:
        if isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names += [t.id for t in targets if isinstance(t, ast.Name)]
    return names


@pytest.mark.parametrize("path", NOTEBOOKS, ids=os.path.basename)
def test_papermill_reads_every_parameter_with_its_help(path):
    cells = [c for c in nbformat.read(path, as_version=4).cells if "parameters" in c.metadata.get("tags", [])]
    assert len(cells) == 1, f"{path}: {len(cells)} cells tagged 'parameters'"
    read = papermill.inspect_notebook(path)
    names = _assigned(cells[0].source)
    assert names, f"{path}: its parameters cell assigns nothing"
    assert [n for n in names if n not in read] == [], f"{path}: papermill does not see these parameters"
    assert [n for n in names if not read[n]["help"]] == [], f"{path}: parameters without a help comment"


@pytest.mark.parametrize("path", NOTEBOOKS + TUTORIALS, ids=os.path.basename)
def test_every_notebook_is_valid_in_its_format(path):
    """Its nbformat version's schema, cell ids included (4.5): reading one without them warns on every
    ``python -m reproduce`` (the runner reads each notebook's code) and Jupyter rewrites it on save."""
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        nbformat.validate(nbformat.read(path, as_version=nbformat.NO_CONVERT))
