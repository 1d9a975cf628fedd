"""A study's steps on a tree of its science, run as a script with that tree alone on the path (``python -P
compute.py ...``, cwd the tree: :mod:`reproduce.studies.driver.pin`), so that a step executes its pinned commit's
code and nothing of main's; it imports only the standard library here.

    compute.py digest STUDY                                       the steps' digest (:func:`step_digest`)
    compute.py step STUDY KIND PARAMETERS_JSON RESULTS_JSON DIGEST  one step: its results file, as a notebook
                                                                    writes one, where the steps' digest is DIGEST
"""
import hashlib
import inspect
import json
import sys
import time
from importlib import import_module


def step_digest(study) -> str:
    """sha256 of the source of the study's steps and of what they count with (``Study.step_code``)."""
    code = "".join(inspect.getsource(f) for f in (*study.steps.values(), *study.step_code))
    return hashlib.sha256(code.encode()).hexdigest()


def main(argv: list[str]) -> int:
    what, name, *rest = argv
    study = import_module(f"reproduce.studies.{name}").STUDY
    if what == "digest":
        print(step_digest(study))
        return 0
    from mdc.eval.results import write_results  # the tree's own package, as its notebooks write theirs

    kind, parameters, results, pinned = rest
    if (found := step_digest(study)) != pinned:
        print(f"the steps of reproduce.studies.{name} here are {found}, not the pin's {pinned}", file=sys.stderr)
        return 1
    with open(parameters) as f:
        p = json.load(f)
    started = time.perf_counter()
    out = study.steps[kind](p)
    write_results(results, kind, out, parameters=p, checkpoint=p.get("checkpoint"),
                  runtime_s=time.perf_counter() - started)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
