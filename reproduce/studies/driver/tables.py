"""A study's report from records: mean +- SD over seeds, differences paired by seed with 95% intervals (Student's t;
a probe's mean4 with the claims' items-and-seeds interval), verdicts against a margin, each instrument's measures,
a table with a row per (arm, model), and the tables' file with its closing lines (:func:`write`)."""
from __future__ import annotations

import math
import os

import numpy as np

from reproduce import pretrained
from reproduce.claims.stats import TASKS, difference, t_quantile
from reproduce.running import ledger


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


def caption_measures(cap: dict, words: dict | None, name: str) -> dict:
    m = cap["metrics"].get(name)
    if m is None:
        return {}
    w = (words or {}).get("sets", {}).get(name, {})
    return {"CIDEr": 100 * m["cider"], "CIDEr, another image": 100 * m["cider_another_image"],
            "BLEU-4": 100 * m["bleu4"], "words": m["words"], "repeated": 100 * m["repeated"],
            "repeated content": 100 * w["repeated_content"] if "repeated_content" in w else None,
            "references' repeated content": 100 * words["references"]["repeated_content"] if words else None}


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


def _correct(res: dict) -> dict:
    return {t: np.frombuffer(res["datasets"][f"wds/{t}"]["correct"].encode(), dtype=np.uint8) - ord("0")
            for t in TASKS}


def probe_difference(runs: list[dict], plus: list[tuple], minus: list[tuple]) -> tuple[float, float, float]:
    """The summed mean4 of the probes ``plus`` minus those of ``minus`` (each an (arm, objective)), paired by seed
    and item, in points, with the claims' 95% interval (items and seeds; NaN where no seed has them all)."""
    probes = by_kind(runs, "linear_probe")
    seeds = sorted({s for (_, _, s) in probes if all((*k, s) in probes for k in (*plus, *minus))})

    def side(keys, s):  # per task [N]: how many of ``keys``' probes get each item right
        decoded = [_correct(probes[(*k, s)]) for k in keys]
        return {t: sum(c[t].astype(int) for c in decoded) for t in TASKS}

    try:
        d = difference([(side(plus, s), side(minus, s)) for s in seeds])
    except ValueError:  # no seed on every side, or seeds probed on other items
        return math.nan, math.nan, math.nan
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
