"""What an evaluation run's parameters cost: the scale between a run's record and the run as it is now.

A record says how long its run took with the parameters (and the code) it ran with. When the run now has
others (more probe test images, a control added to Table 2, a lighter guidance sweep), its seconds are not
the run's any more. Each evaluation kind here has a cost model: its work counted in units from the run's
effective parameters, each unit weighed by its measured seconds (:data:`UNITS`, measured on the shipped
``mini`` weights by ``reproduce/cost/units.py``), summed to modeled seconds. The estimate is the
record's seconds times modeled(now) / modeled(record): the machine's speed comes from the record, the units
only weigh a kind's parts against each other. A run no record speaks for is its modeled seconds
(:func:`planned_seconds`) times the machine's speed that the records of its kind show (``reproduce.running.ledger``).

The work of a run now comes from its notebook's defaults (the ``parameters`` cell) overridden by the
registry's parameters, and from the evaluation sets its ``data/evalsets`` dependency writes; the work of a
record from the parameters and sizes its results recorded.

- ``linear_probe``: images through the encoder (train and test of every task) and the classifiers' training
  rows x epochs (pooled; the grid's, 16 times wider, where ``grid``), each for the trained encoder and the
  random-init floor (whose extraction is shared between runs, so not counted);
- ``compositionality``: candidate captions per suite kind (ARO's order task, the template suites, the
  in-distribution ``own`` suites) x the score variants' groups: with the image, without it over
  ``blind_images`` reference images, with another item's image (``shuffled``);
- ``guidance``: images x the sweep's captions per rule (each generated and scored by the reference metrics),
  and its guided compositionality's candidates x settings.

Other kinds (data, pretraining, captioning, figures), and runs that do not read the synthetic evaluation sets
(the paper profile's), have no model here: their record is taken as it is, with a note where its parameters
differ from the run's.
"""
from __future__ import annotations

import ast
import json
import os
from functools import lru_cache

from mdc.eval.suites import OWN_SUITES
from mdc.world.evalsets import PROBE_TEST_ITEMS, PROBE_TEST_OTHER, SUGARCREPE_FILES
from reproduce import graph

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
UNITS_FILE = os.path.join(ROOT, "reproduce", "cost", "unit_seconds.json")
ORDER_CAPTIONS = 5  # ARO's order task: captions per image, each an item of 5 candidates
GROUPS = ("image", "blind", "shuffled")
UNREADABLE = (KeyError, TypeError, ValueError, OSError)  # parameters or a record this model cannot read


@lru_cache(maxsize=None)
def units(path: str = UNITS_FILE) -> dict:
    """The measured seconds per unit (``reproduce/cost/units.py`` wrote them)."""
    with open(path) as f:
        return json.load(f)


def notebook_defaults(notebook: str) -> dict:
    """The literal values of a notebook's ``parameters`` cell (in :data:`reproduce.graph.NOTEBOOKS`), by name."""
    return _parameter_literals(os.path.join(graph.NOTEBOOKS, f"{notebook}.ipynb"))


@lru_cache(maxsize=None)
def _parameter_literals(path: str) -> dict:
    with open(path) as f:
        cells = json.load(f)["cells"]
    cell = next(c for c in cells if "parameters" in c.get("metadata", {}).get("tags", []))
    out = {}
    for node in ast.parse("".join(cell["source"])).body:
        if isinstance(node, ast.Assign) and isinstance(node.targets[0], ast.Name):
            try:
                out[node.targets[0].id] = ast.literal_eval(node.value)
            except ValueError:
                pass
    return out


def suite_kind(name: str) -> str:
    return "order" if name.endswith("_order") else "own" if name.startswith("own") else "template"


def planned_suites(suites, n_items: int, order_images: int | None = None,
                   own_items: int | None = None) -> dict[str, int]:
    """Candidate captions per suite kind of a run scoring ``suites`` on synthetic sets of ``n_items`` per file
    (the order task's captions of its first ``order_images`` images only, the in-distribution suites' first
    ``own_items`` items only, where given)."""
    names = [suites] if isinstance(suites, str) else list(suites)
    out = {}
    for name in names:
        files = {"sugarcrepe": len(SUGARCREPE_FILES), "own": len(OWN_SUITES), "all": None}.get(name, 1)
        if files is None:
            return planned_suites(["aro_relation", "aro_attribute", "aro_coco_order", "sugarcrepe", "own"], n_items,
                                  order_images, own_items)
        kind = suite_kind(name)
        first = {"order": order_images, "own": own_items}.get(kind)
        items = n_items if first is None else min(first, n_items)
        per_file = ORDER_CAPTIONS * 5 * items if kind == "order" else 2 * items
        out[kind] = out.get(kind, 0) + files * per_file
    return out


def suite_names(columns) -> list[str]:
    """The suites (as :func:`planned_suites` reads them) behind Table 2's columns: SugarCrepe's and the own
    suites' columns are groups of their files."""
    names = {"sugarcrepe" if c.startswith("sugarcrepe") else "own" if c.startswith("own") else c for c in columns}
    return sorted(names)


def recorded_suites(columns: dict) -> dict[str, int]:
    """Candidate captions per suite kind of a compositionality record's columns (items in the files x candidates;
    the order task's and the in-distribution suites' items scored, which ``order_images`` and ``own_items`` may
    make fewer than their files')."""
    out = {}
    for name, c in columns.items():
        kind = suite_kind(name)
        items = c.get("items") if kind in ("order", "own") else c.get("total") or c.get("items")
        out[kind] = out.get(kind, 0) + int(items or 0) * int(c.get("candidates") or 2)
    return out


def _evalsets(run, runs: dict | None) -> dict:
    dep = (runs or {}).get("data/evalsets")
    return dep.params if dep is not None and "data/evalsets" in run.deps else {}


def planned_work(run, runs: dict | None = None) -> dict | None:
    """The work of ``run`` as it would execute now (None: a kind without a cost model, or a run that does not
    read the synthetic evaluation sets, whose sizes the model counts in)."""
    if run.notebook not in MODELS or "data/evalsets" not in run.deps:
        return None
    p = {**notebook_defaults(run.notebook), **run.params}
    sets = _evalsets(run, runs)
    if run.notebook == "linear_probe":
        n_train = sets.get("n_probe_train", p.get("n_probe_train"))
        tests = [sets.get("n_probe_test") or PROBE_TEST_ITEMS.get(t, PROBE_TEST_OTHER) for t in p["synthetic_tasks"]]
        return _probe_work(n_train, tests, p["epochs"], p["grid"])
    if run.notebook == "compositionality":
        method = run.labels.get("method", "MDC")  # CLIP's cosine has no image-free score
        blind = p["blind_images"] if p["blind"] and method != "CLIP" else 0
        suites = planned_suites(p["suites"], sets.get("n_items", 500), p.get("order_images"), p.get("own_items"))
        return _composition_work(method, suites, blind, p["shuffled"])
    if run.notebook == "guidance":
        images = min(p["max_images"] or 10**9, sets.get("n_items", p["synthetic_images"]))
        comp = planned_suites("all", p["composition_items"]) if p["composition_items"] else {}
        return _guidance_work(images, p["guidances"], len(p["strengths"]), comp, len(p["composition_strengths"]))
    return None


def recorded_work(record: dict) -> dict | None:
    """The work a record's run did, from the parameters and sizes its results hold (None: no model, or a
    record whose results do not say)."""
    notebook, results = record.get("notebook"), record.get("results") or {}
    p = results.get("parameters") or {}
    r = results.get("results") or {}
    try:
        if notebook == "linear_probe":
            sets = r["datasets"].values()
            return _probe_work(next(iter(sets))["n_train"], [d["n_test"] for d in sets], p.get("epochs", 10),
                               p["grid"])
        if notebook == "compositionality":
            s = r["settings"]
            blind = any(v.endswith("_blind") for v in s["variants"])
            return _composition_work(record.get("labels", {}).get("method", "MDC"), recorded_suites(r["columns"]),
                                     s["blind_images"] if blind else 0, bool(s["shuffled"]))
        if notebook == "guidance":
            scored = (r.get("compositionality") or {}).get("columns") or {}
            comp = planned_suites(suite_names(scored), p["composition_items"]) if scored else {}
            return _guidance_work(r["dataset"]["images"], p["guidances"], len(p["strengths"]), comp,
                                  len(p.get("composition_strengths") or []))
    except (KeyError, StopIteration, TypeError):
        return None
    return None


def _probe_work(n_train: int, tests: list[int], epochs: int, grid: int) -> dict:
    return {"images": len(tests) * n_train + sum(tests), "rows_epochs": len(tests) * n_train * epochs,
            "grid": int(bool(grid))}


def _composition_work(method: str, candidates: dict, blind_images: int, shuffled: bool) -> dict:
    return {"objective": str(method).lower().split()[0], "candidates": candidates, "blind_images": blind_images,
            "shuffled": int(bool(shuffled))}


def _guidance_work(images: int, guidances, strengths: int, composition: dict, composition_strengths: int) -> dict:
    return {"images": images, "captions": {"none": 1, **{g: strengths for g in guidances}},
            "composition": composition, "composition_settings": (1 + len(guidances) * composition_strengths)
            if composition else 0}


def _probe_seconds(w: dict, u: dict) -> float:
    fit = u["fit_pooled_per_row_epoch"] + w["grid"] * u["fit_grid_per_row_epoch"]
    return w["images"] * u["extract_per_image"] + 2 * w["rows_epochs"] * fit


def _composition_seconds(w: dict, u: dict) -> float:
    per = u.get(w["objective"], u["mdc"])
    weight = {"image": 1, "blind": w["blind_images"], "shuffled": w["shuffled"]}
    return sum(n * sum(weight[g] * per[kind].get(g, 0.0) for g in GROUPS) for kind, n in w["candidates"].items())


def _guidance_seconds(w: dict, u: dict) -> float:
    captions = w["images"] * sum(n * (u[f"caption_{g}"] + u.get("metrics_per_caption", 0.0))
                                 for g, n in w["captions"].items())
    scoring = w["composition_settings"] * sum(n * u["composition"][kind] for kind, n in w["composition"].items())
    return captions + scoring


MODELS = {"linear_probe": _probe_seconds, "compositionality": _composition_seconds, "guidance": _guidance_seconds}


def modeled_seconds(notebook: str, work: dict, unit_seconds: dict | None = None) -> float:
    """A run's modeled seconds: its ``work`` weighed by the measured seconds per unit."""
    return MODELS[notebook](work, (unit_seconds or units())[notebook])


def planned_seconds(run, runs: dict | None = None, unit_seconds: dict | None = None) -> float | None:
    """The modeled seconds of ``run``'s work as it would execute now (None: no model for it): what estimates a
    run no record speaks for, with the units' one-thread seconds standing for the machine's."""
    try:
        work = planned_work(run, runs)
    except UNREADABLE:
        return None
    return None if work is None else modeled_seconds(run.notebook, work, unit_seconds)


def _count(value) -> str:
    return f"{value:,}" if isinstance(value, int) else str(value)


def describe(then: dict, now: dict) -> str:
    """What changed between two works, e.g. ``images 32,000 -> 38,240; grid 0 -> 1``; a count by kind
    gives its total and the kinds that changed (``candidates 5,400 -> 10,800 (own 0 -> 5,400)``)."""
    changed = []
    for k in now:
        a, b, name = then.get(k), now[k], k.replace("_", " ")
        if a == b:
            continue
        if isinstance(b, dict):
            a = a or {}
            parts = ", ".join(f"{x} {a.get(x, 0):,} -> {b.get(x, 0):,}" for x in sorted({*a, *b})
                              if a.get(x, 0) != b.get(x, 0))
            changed.append(f"{name} {sum(a.values()):,} -> {sum(b.values()):,} ({parts})")
        else:
            changed.append(f"{name} {_count(a)} -> {_count(b)}")
    return "; ".join(changed)


def scale(run, record: dict, runs: dict | None = None, unit_seconds: dict | None = None) -> tuple[float, str]:
    """(modeled(now) / modeled(record), what changed) for ``run`` against ``record``: (1.0, "") where the work is
    the same; (1.0, a note) where a kind without a model, or a record that does not say its work, ran with
    other parameters."""
    try:
        now, then = planned_work(run, runs), recorded_work(record)
    except UNREADABLE:  # parameters this model does not know: no scaling
        now, then = None, None
    if now is None or then is None:
        if record.get("params") == run.params:
            return 1.0, ""
        return 1.0, ("as recorded: other parameters, which no cost model here scales" if now is None else
                     "as recorded: other parameters, and its record does not say its work")
    if now == then:
        return 1.0, ""
    a, b = modeled_seconds(run.notebook, then, unit_seconds), modeled_seconds(run.notebook, now, unit_seconds)
    return (b / a if a > 0 else 1.0), describe(then, now)
