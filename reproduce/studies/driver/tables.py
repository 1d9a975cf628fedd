"""A study's report from records: mean +- SD over seeds, differences paired by seed with 95% intervals (Student's t;
a probe's mean4 with the claims' items-and-seeds interval), verdicts against a margin, each instrument's measures,
a table with a row per (arm, model), and the tables' file with its closing lines (:func:`write`)."""
from __future__ import annotations

import json
import math
import os

import numpy as np

from reproduce import pretrained
from reproduce.claims.stats import SEED_SD, TASKS, bits, difference, probe_outcomes, t_quantile
from reproduce.running import ledger

SWAPS = ("swap_att", "swap_obj")  # own_swap's subsets, equal items each: their mean is own_swap

def interval(values: list[float]) -> tuple[float, float, float]:
    """(mean, low, high): the 95% Student-t interval over ``values`` (NaN bounds with fewer than two)."""
    v = np.asarray(values, float)
    if len(v) < 2:
        return (float(v.mean()) if len(v) else math.nan), math.nan, math.nan
    half = t_quantile(0.975, len(v) - 1) * v.std(ddof=1) / math.sqrt(len(v))
    return float(v.mean()), float(v.mean() - half), float(v.mean() + half)


def cell(values: dict) -> str:
    v = [x for x in values.values() if x is not None]
    sd = f" +- {np.std(v, ddof=1):.1f}" if len(v) > 1 else ""
    return f"{np.mean(v):.1f}{sd} ({len(v)})" if v else "-"


def paired(arm: dict, paper: dict) -> tuple[float, float, float]:
    seeds = sorted(s for s in arm if s in paper and arm[s] is not None and paper[s] is not None)
    return interval([arm[s] - paper[s] for s in seeds])


def span(mean: float, lo: float, hi: float) -> str:
    """A difference as "+m [+lo, +hi]"; "+m" without an interval; "-" without a mean."""
    return "-" if math.isnan(mean) else f"{mean:+.1f}" if math.isnan(lo) else f"{mean:+.1f} [{lo:+.1f}, {hi:+.1f}]"


def verdict(values: dict, margin: float, bound: float = None, words=("yes", "no")) -> str:
    """``words[0]`` if the 95% interval lies above ``margin`` (or, with ``bound``, the mean reaches ``margin`` and
    the interval lies above ``bound``); ``words[1]`` if it lies below ``margin``; else not resolved."""
    mean, lo, hi = interval([v for v in values.values() if v is not None])
    if math.isnan(lo) or math.isnan(margin):
        return "not resolved"
    if (lo > margin) if bound is None else (mean >= margin and lo > bound):
        return words[0]
    return words[1] if hi < margin else "not resolved"


def by_kind(runs: list[dict], notebook: str) -> dict:
    """{(arm, objective or stage, seed): record results} of one kind."""
    out = {}
    for r in runs:
        if r["notebook"] == notebook:
            lab = r["labels"]
            out[(lab["arm"], lab.get("objective") or lab.get("stage"), lab["seed"])] = r["record"]["results"]
    return out


def probe_measures(res: dict) -> dict:
    top1 = {d.split("/")[-1]: 100 * v["top1"] for d, v in res["datasets"].items()}
    floor = {d.split("/")[-1]: 100 * v["top1"] for d, v in res.get("random_init", {}).get("datasets", {}).items()}
    grid = {d.split("/")[-1]: 100 * v["top1"] for d, v in res.get("grid", {}).get("datasets", {}).items()}
    return {"mean4": np.mean([top1[t] for t in TASKS]), **{t: top1[t] for t in TASKS},
            "grid relation": grid.get("relation"), "floor mean4": np.mean([floor[t] for t in TASKS]) if floor else None}


def binding_measures(res: dict, objective: str, column: str = "own_swap") -> dict:
    variant = "elbo" if objective == "mdc" else "exact"
    scores = res["columns"][column]["scores"]
    get = lambda v: 100 * scores[v]["accuracy"] if v in scores else None  # noqa: E731
    own, other = get(variant), get(f"{variant}_shuffled")
    return {"own": own, "another image": other, "no image": get(f"{variant}_blind"),
            "own - another": None if own is None or other is None else own - other,
            "items": res["columns"][column]["items"]}


def repetition_measures(res: dict) -> dict:
    """The descriptive repetition step's measures (%): its own captions and another scene's image."""
    own, other = res["views"]["own"], res["views"]["other_image"]
    pct = lambda x: None if x is None else 100 * x  # noqa: E731
    return {"shape_twice": pct(own["shape_twice"]), "shape_twice, 2+ objects": pct(own["shape_twice_many"]),
            "shape_twice, another image": pct(other["shape_twice"]), "pairs_exist": pct(own["pairs_exist"]),
            "pairs_exist, another image": pct(other["pairs_exist"])}


def caption_measures(cap: dict, words: dict | None, name: str) -> dict:
    m = cap["metrics"].get(name)
    if m is None:
        return {}
    w = (words or {}).get("sets", {}).get(name, {})
    return {"CIDEr": 100 * m["cider"], "CIDEr, another image": 100 * m["cider_another_image"],
            "BLEU-4": 100 * m["bleu4"], "words": m["words"], "repeated": 100 * m["repeated"],
            "repeated content": 100 * w["repeated_content"] if "repeated_content" in w else None,
            "references' repeated content": 100 * words["references"]["repeated_content"] if words else None}


def series_of(runs: list[dict], step: tuple, captions=None) -> dict[str, dict]:
    """{table: {(arm, model): {measure: {seed: value}}}} of a study's records: the probe, the binding part (own_swap,
    own_attribute), the study's step (``step``: its notebook, its table and its measures(results, objective)) and
    the captions, each caption set as ``captions(arm, stage, sets)`` lists it as (row, set) (default: every set)."""
    notebook, table, measures = step
    out: dict[str, dict] = {"probe": {}, "binding": {}, table: {}, "captions": {}}
    captions = captions or (lambda arm, stage, sets: [((arm, f"{stage} {name}"), name) for name in sets])

    def put(name, row, seed, values):
        for k, v in values.items():
            out[name].setdefault(row, {}).setdefault(k, {})[seed] = v

    for (arm, o, s), res in by_kind(runs, "linear_probe").items():
        put("probe", (arm, o.upper()), s, probe_measures(res))
    for (arm, o, s), res in by_kind(runs, "compositionality").items():
        for column in ("own_swap", "own_attribute"):
            put("binding", (arm, o.upper()), s, {f"{column} {k}": v for k, v in binding_measures(res, o, column).items()
                                                 if k != "items"})
    for (arm, o, s), res in by_kind(runs, notebook).items():
        put(table, (arm, o.upper()), s, measures(res, o))
    words = by_kind(runs, "caption_words")
    for (arm, stage, s), res in by_kind(runs, "captioning").items():
        for row, name in captions(arm, stage, list(res["metrics"])):
            put("captions", row, s, caption_measures(res, words.get((arm, stage, s)), name))
    return out


def finetune_check(runs: list[dict]) -> list[str]:
    """Fine-tuning runs that hit their cap while their validation loss still improved (the rule forbids it)."""
    out = []
    for r in runs:
        for o, f in ((r["record"]["results"].get("finetune") or {}).items() if r["notebook"] == "captioning" else ()):
            if f and f.get("stopped") == "cap":
                out.append(f"{r['name']} {o}: stopped at its cap of {f['steps']} steps (best step {f['best_step']})")
    return out


def write(folder: str, sections: list[str], found: dict, kept: str) -> str:
    """``folder``/tables.md: the ``sections``, then the fine-tuning runs that hit their cap, the float16 models kept
    in ``folder``/weights (under the line ``kept``) and the records' package (``found``:
    :func:`reproduce.running.ledger.read_all`); returns its text."""
    runs = ledger.for_build(found)
    text = "\n\n".join(sections + [
        "Fine-tuning runs that hit their cap: " + ("; ".join(finetune_check(runs)) or "none"),
        f"{kept}:\n" + ("\n".join(pretrained.listing(os.path.join(folder, "weights"), found)) or "none kept"),
        ledger.provenance(found) if found else "No records yet."])
    os.makedirs(folder, exist_ok=True)
    with open(os.path.join(folder, "tables.md"), "w") as f:
        f.write(text + "\n")
    return text


def binding_outcomes(res: dict, objective: str, view: str = "") -> dict[str, np.ndarray]:
    """own_swap's per-item outcomes {subset: [N] 0/1} of a binding part, by the objective's Table 2 scorer, with the
    item's own image (``view`` "") or another item's ("_shuffled")."""
    variant = ("elbo" if objective == "mdc" else "exact") + view
    return {s: bits(res["own_subsets"][s]["records"]["correct"][variant]) for s in SWAPS}


# instrument -> (its per-item outcomes (results, objective) -> {part: [N] 0/1}, the parts, the items' ids or None)
PER_ITEM = {"probe": (lambda res, objective: probe_outcomes(res), TASKS, lambda res: None),
            "binding": (binding_outcomes, SWAPS,
                        lambda res: {s: res["own_subsets"][s]["records"]["ids"] for s in SWAPS})}


def contrast(records: dict, terms: list[tuple[float, str, str]], outcome, parts=None, ids=None,
             seed_sd: float = math.nan) -> dict:
    """sum c x outcome(arm, objective) over ``terms`` (c, arm, objective) of ``records`` ({(arm, objective, seed):
    results}), per seed that has every term: its mean, 95% interval, per-seed values and their SD, in points. With
    per-item outcomes over ``parts`` (:data:`PER_ITEM`) the interval is the claims' (items and seeds; ``seed_sd``
    stands for the seeds' spread with one seed, NaN: no interval), and every record must hold the same items
    (``ids``); with a scalar ``outcome`` (points), Student's t over seeds."""
    seeds = sorted({s for (_, _, s) in records if all((a, o, s) in records for _, a, o in terms)})
    out = {"mean": math.nan, "low": math.nan, "high": math.nan, "seeds": len(seeds), "per_seed": [], "sd": math.nan}
    if not seeds:
        return out
    if parts:
        if ids and len({json.dumps(ids(records[(a, o, s)])) for s in seeds for _, a, o in terms}) > 1:
            raise ValueError(f"the records of {sorted({(a, o) for _, a, o in terms})} were scored on different "
                             f"items; a per-item contrast needs the same items in every record")
        pairs = []
        for s in seeds:
            y = [(c, outcome(records[(a, o, s)], o)) for c, a, o in terms]
            zero = {t: np.zeros(len(y[0][1][t])) for t in parts}
            pairs.append(tuple({t: sum((abs(c) * v[t] for c, v in y if sign * c > 0), zero[t]) for t in parts}
                               for sign in (1, -1)))
        d = difference(pairs, seed_sd=seed_sd, tasks=parts)
        out.update(mean=d["mean"], low=d["low"], high=d["high"], per_seed=d["per_seed"])
    else:
        values = [sum(c * outcome(records[(a, o, s)], o) for c, a, o in terms) for s in seeds]
        out.update(zip(("mean", "low", "high"), interval(values)), per_seed=values)
    if len(seeds) > 1:
        out["sd"] = float(np.std(out["per_seed"], ddof=1))
    return out


def probe_difference(runs: list[dict], plus: list[tuple], minus: list[tuple]) -> tuple[float, float, float]:
    """The summed mean4 of the probes ``plus`` minus those of ``minus`` (each an (arm, objective)), paired by seed
    and item (:func:`contrast`), in points, with the claims' 95% interval (NaN where no seed has them all)."""
    d = contrast(by_kind(runs, "linear_probe"), [(1, *k) for k in plus] + [(-1, *k) for k in minus],
                 *PER_ITEM["probe"], seed_sd=SEED_SD)
    return d["mean"], d["low"], d["high"]


def render(title: str, series: dict, headline: str, order: tuple[str, ...], judge=None, deltas=None) -> str:
    """A Markdown table: a row per (arm, model) in ``order`` (its first arm the reference), each measure's mean +- SD
    (n), the headline's difference from the reference arm with its 95% interval (``deltas(arm, model)`` or
    Student's t over paired seeds), ``judge``'s verdict."""
    base_arm = order[0]
    rows = sorted(series, key=lambda k: (order.index(k[0]) if k[0] in order else 99, k[1]))
    measures = list(dict.fromkeys(m for k in rows for m in series[k]))
    head = ["arm", "model", *measures, f"{headline}: arm - {base_arm} [95%]"] + (["verdict"] if judge else [])
    lines = [f"### {title}", "", "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for arm, model in rows:
        data, base = series[(arm, model)], series.get((base_arm, model), {})
        if arm == base_arm:
            d = "(reference arm)"
        else:
            d = span(*(deltas(arm, model) if deltas else paired(data.get(headline, {}), base.get(headline, {}))))
        cells = [arm, model, *(cell(data.get(m, {})) for m in measures), d] + ([judge(arm, model)] if judge else [])
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)
