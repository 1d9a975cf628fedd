"""One run of the reproduction, in its own process (used by :mod:`reproduce.running.runner`).

    python -m reproduce.running.execute NOTEBOOK OUTPUT_NOTEBOOK PARAMETERS_JSON
    python -m reproduce.running.execute --command "torchrun ... -m mdc.train ..." --results RESULTS_JSON PARAMETERS_JSON
    python -m reproduce.running.execute --figures PARAMETERS_JSON

The first form executes a notebook with papermill (kernel python3, working directory the
repository root; under a study's pin, :data:`SCIENCE` names the exported tree whose ``mdc`` the
kernel imports). The second runs a pretraining command line (torchrun on GPU nodes) and
writes the results file the pretraining notebook would have written, from the JSON line
``mdc.train`` prints at the end. The third is the figures run (:func:`build_figures`): every artifact
rebuilt from the ledger's records, as ``python -m reproduce --from-records`` builds them; no notebook
builds them, since notebooks import the package alone and the builders are the reproduction's.

Either way the process dies with its runner: a watchdog thread ends this process group and every
process below it (the pretraining command, torchrun's workers in their own sessions; the notebook
kernel follows its own parent, this process) as soon as the process that started it is gone, so a
killed runner leaves nothing writing into the run folder.
"""
from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
import threading
import time

from mdc.base.processes import kill_tree

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCIENCE = "MDC_SCIENCE"  # a tree first on the path of the notebook's kernel (or the command): a study's pinned mdc/


def die_with_parent(interval_s: float = 0.5) -> None:
    """Start a daemon thread that SIGKILLs this process group, and every process below this one, once the parent
    process is gone."""
    parent = os.getppid()
    if parent <= 1:  # already orphaned (or started by init): nothing to watch
        return

    def watch():
        while os.getppid() == parent:
            time.sleep(interval_s)
        kill_tree(os.getpid())  # this group, and torchrun's workers in sessions of their own

    threading.Thread(target=watch, name="die-with-parent", daemon=True).start()


def build_figures(params: dict) -> dict[str, list[str]]:
    """The figures run: every artifact, or those in ``only``, rebuilt from the records in ``records`` (those of
    ``runs``; default all) into ``figures_dir`` (:func:`reproduce.registry.build_artifacts`); each Markdown table
    printed (the run's log), and the files each artifact produced written to ``output_dir``/results.json with
    the parameters but the run list and the folders. Returns {artifact: files written}."""
    from mdc.eval.results import write_results
    from reproduce.registry import PAPER_DIR, build_artifacts

    files = build_artifacts(params["records"], params["figures_dir"], params.get("paper_dir") or PAPER_DIR,
                            params.get("only") or None, params.get("runs") or None)
    for path in (path for written in files.values() for path in written if path.endswith(".md")):
        with open(path) as f:
            print(f.read())
    recorded = {"only": [], **{k: v for k, v in params.items() if k not in ("paper_dir", "output_dir", "runs")}}
    write_results(os.path.join(params["output_dir"], "results.json"), "figures", {"files": files}, parameters=recorded)
    return files


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("paths", nargs="+",
                   help="NOTEBOOK OUTPUT PARAMETERS_JSON, or PARAMETERS_JSON with --command or --figures")
    p.add_argument("--command", help="a pretraining command line to run instead of a notebook")
    p.add_argument("--results", help="with --command: where to write the results file")
    p.add_argument("--figures", action="store_true", help="the figures run: the artifacts from the records")
    args = p.parse_args(argv)
    if os.getpgrp() == os.getpid():  # its own process group (as the runner starts it): safe to end it whole
        die_with_parent()
    with open(args.paths[-1]) as f:
        params = json.load(f)
    if os.environ.get(SCIENCE):  # this process runs main's tooling; what it starts imports the pinned package
        os.environ["PYTHONPATH"] = os.environ[SCIENCE] + os.pathsep + os.environ.get("PYTHONPATH", "")
    if args.figures:
        build_figures(params)
        return 0
    if args.command:
        done = subprocess.run(shlex.split(args.command), cwd=ROOT, stdout=subprocess.PIPE, text=True)
        sys.stdout.write(done.stdout)
        if done.returncode:
            return done.returncode
        from mdc.eval.results import write_results

        result = json.loads(done.stdout.strip().splitlines()[-1])
        write_results(args.results, "pretrain", {**result, "objective": params.get("objective")},
                      parameters=params, checkpoint=result.get("checkpoint"))
        return 0
    import papermill

    notebook, output = args.paths[:2]
    papermill.execute_notebook(notebook, output, parameters=params, kernel_name="python3", cwd=ROOT,
                               progress_bar=False, log_output=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
