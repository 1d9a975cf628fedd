"""The words study's tables, figure, seed plan and decision rules (reproduce/studies/words/PLAN.md), from records.

Every table is one instrument: a row per arm and model, each measure as mean +- SD over seeds (n), its difference
from the paper arm paired by seed with a 95% interval (Student's t over the seeds; the probe's mean4 with the
claims' interval, :func:`reproduce.claims.stats.difference`, which adds the test items' variance), the controls
beside it and, where a rule is fixed, the verdict. Decision rules (the thresholds come from the controls):

- uses its words: S, the shape word's accuracy after the true colour minus after another colour (neighbour use,
  ``shape_after_colour``, own image; MDC at mask ratio 0.75, the middle of its trained t, ARC teacher-forced), in
  points. The positive control is the paper arm's ARC (its 95% interval must lie above 0); the margin m_w is a
  tenth of the control's mean (the claims' margin convention). Uses its words: the 95% interval lies above m_w;
  does not: it lies below m_w; else not resolved;
- binds: own_swap accuracy with the item's own image minus with another item's image, points. Binds: the mean is
  at least the control margin (:func:`mdc.eval.positive_controls.control_margin` of the suite's items) and the
  95% interval lies above 0; does not: the interval lies below that margin; else not resolved. The paper arm's ARC
  is the positive control;
- repeats less: repeated content words (% of a caption's content words that repeat an earlier one) at the
  references' length (``mdc-ref``, ``arc-beam6-ref``), arm minus paper. The margin m_r is a tenth of the paper
  arm's excess over its references (the control). Repeats less: the interval lies below -m_r; more: above m_r.
  The row ``t0-1`` is the paper arm's MDC fine-tuned at t ~ U[0, 1], set against the paper arm's fine-tune.
"""
from __future__ import annotations

import json
import math
import os
import re
import tempfile

import numpy as np

from mdc.eval.metrics import FUNCTION_WORDS
from mdc.eval.positive_controls import control_margin
from reproduce import power, pretrained
from reproduce.claims.stats import TASKS, difference, t_quantile
from reproduce.running import ledger

REFERENCE_NEIGHBOURS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "words", "reference_neighbours.json")
MARGIN_FRACTION = 0.10
WORDS_RATIO = {"mdc": "0.75", "arc": "teacher_forced"}
MATCHED = {"mdc": "mdc-ref", "arc": "arc-beam6-ref"}
ORDER = ("paper", "t0-1", "rotary", "hidden", "quarter", "x2", "x4")
T01 = ("finetuned-t0-1", "t0-1", "finetuned")  # the paper arm's MDC fine-tuned at t ~ U[0, 1]: stage -> arm, stage


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


def _by(runs: list[dict], notebook: str) -> dict:
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


def words_measures(res: dict, objective: str) -> dict:
    m = res["neighbours"]["measures"]
    ratio = WORDS_RATIO[objective]
    out = {"S": 100 * m["shape_after_colour"][ratio]["own"]["difference"],
           "S, another image": 100 * m["shape_after_colour"][ratio]["other_image"]["difference"]}
    if "colour_given_shape" in m:
        out["colour given shape: visible - hidden"] = 100 * m["colour_given_shape"][ratio]["own"]["difference"]
    for suite, b in (res.get("binding") or {}).items():
        out[f"diagnostic {suite.split('/')[-1]}"] = None if b.get("own") is None else 100 * b["own"]
    return out


def caption_measures(cap: dict, words: dict | None, name: str) -> dict:
    m = cap["metrics"].get(name)
    if m is None:
        return {}
    w = (words or {}).get("sets", {}).get(name, {})
    return {"CIDEr": 100 * m["cider"], "CIDEr, another image": 100 * m["cider_another_image"],
            "BLEU-4": 100 * m["bleu4"], "words": m["words"], "repeated": 100 * m["repeated"],
            "repeated content": 100 * w["repeated_content"] if "repeated_content" in w else None,
            "references' repeated content": 100 * words["references"]["repeated_content"] if words else None}


def repetition(texts) -> dict:
    """Mean over ``texts`` of their words, the share of words that repeat an earlier word (as
    ``mdc.eval.metrics.descriptiveness`` counts them) and the share of content words (outside
    ``FUNCTION_WORDS``) that repeat an earlier content word."""
    rows = []
    for text in texts:
        words = re.findall(r"[a-z0-9]+", text.lower())
        content = [w for w in words if w not in FUNCTION_WORDS]
        rows.append((len(words), 1 - len(set(words)) / max(len(words), 1),
                     1 - len(set(content)) / len(content) if content else 0.0))
    return {k: sum(r[i] for r in rows) / max(len(rows), 1) for i, k in
            enumerate(("words", "repeated", "repeated_content"))} | {"captions": len(rows)}


def _correct(res: dict) -> dict:
    return {t: np.frombuffer(res["datasets"][f"wds/{t}"]["correct"].encode(), dtype=np.uint8) - ord("0")
            for t in TASKS}


def probe_difference(runs: list[dict], plus: list[tuple], minus: list[tuple]) -> tuple[float, float, float]:
    """The summed mean4 of the probes ``plus`` minus those of ``minus`` (each an (arm, objective)), paired by seed
    and item, in points, with the claims' 95% interval (items and seeds; NaN where no seed has them all)."""
    probes = _by(runs, "linear_probe")
    seeds = sorted({s for (_, _, s) in probes if all((*k, s) in probes for k in (*plus, *minus))})

    def side(keys, s):  # per task [N]: how many of ``keys``' probes get each item right
        decoded = [_correct(probes[(*k, s)]) for k in keys]
        return {t: sum(c[t].astype(int) for c in decoded) for t in TASKS}

    try:
        d = difference([(side(plus, s), side(minus, s)) for s in seeds])
    except ValueError:  # no seed on every side, or seeds probed on other items
        return math.nan, math.nan, math.nan
    return d["mean"], d["low"], d["high"]


def probe_delta(runs: list[dict], arm: str, objective: str) -> tuple[float, float, float]:
    """mean4 of ``arm`` minus the paper arm's, paired by seed, with the claims' 95% interval."""
    return probe_difference(runs, [(arm, objective)], [("paper", objective)])


def probe_gap(runs: list[dict]) -> str:
    """A table: per arm, MDC's mean4 minus ARC's (the arm's ARC, else the paper arm's), and that gap minus the
    paper arm's, paired by seed, with the claims' 95% intervals."""
    arms = {(a, o) for (a, o, _) in _by(runs, "linear_probe")}
    lines = ["### Probe gap (mean4: MDC - ARC, points; an arm without ARC against the paper arm's ARC)", "",
             "| arm | MDC - ARC [95%] | gap - the paper arm's gap [95%] |", "|---|---|---|"]
    for arm in sorted({a for a, o in arms if o == "mdc"}, key=lambda a: ORDER.index(a) if a in ORDER else 99):
        arc = (arm, "arc") if (arm, "arc") in arms else ("paper", "arc")
        gap = probe_difference(runs, [(arm, "mdc")], [arc])
        moved = probe_difference(runs, [(arm, "mdc"), ("paper", "arc")], [arc, ("paper", "mdc")])
        lines.append(f"| {arm} | {span(*gap)} | {'(reference arm)' if arm == 'paper' else span(*moved)} |")
    return "\n".join(lines)


def series_of(runs: list[dict]) -> dict[str, dict]:
    """{instrument: {(arm, model): {measure: {seed: value}}}} from the records."""
    out: dict[str, dict] = {"probe": {}, "binding": {}, "words": {}, "captions": {}}

    def put(instrument, row, seed, values):
        for k, v in values.items():
            out[instrument].setdefault(row, {}).setdefault(k, {})[seed] = v

    for (arm, o, s), res in _by(runs, "linear_probe").items():
        put("probe", (arm, o.upper()), s, probe_measures(res))
    for (arm, o, s), res in _by(runs, "compositionality").items():
        for column in ("own_swap", "own_attribute"):
            put("binding", (arm, o.upper()), s, {f"{column} {k}": v for k, v in binding_measures(res, o, column).items()
                                                 if k != "items"})
    for (arm, o, s), res in _by(runs, "neighbours").items():
        put("words", (arm, o.upper()), s, words_measures(res, o))
    words = _by(runs, "caption_words")
    for (arm, stage, s), res in _by(runs, "captioning").items():
        counts = words.get((arm, stage, s))
        arm, stage = T01[1:] if stage == T01[0] else (arm, stage)  # its own row, against the paper's fine-tune
        for name in res["metrics"]:
            label = "own length" if name == "mdc-None" else name
            put("captions", (arm, f"{stage} {label}"), s, caption_measures(res, counts, name))
    return out


def render(title: str, series: dict, headline: str, judge=None, deltas=None) -> str:
    """A Markdown table: a row per (arm, model), each measure's mean +- SD (n), the headline's difference from the
    paper arm with its 95% interval (``deltas(arm, model)`` or Student's t over paired seeds), ``judge``'s verdict."""
    rows = sorted(series, key=lambda k: (ORDER.index(k[0]) if k[0] in ORDER else 99, k[1]))
    measures = list(dict.fromkeys(m for k in rows for m in series[k]))
    head = ["arm", "model", *measures, f"{headline}: arm - paper [95%]"] + (["verdict"] if judge else [])
    lines = [f"### {title}", "", "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for arm, model in rows:
        data, base = series[(arm, model)], series.get(("paper", model), {})
        if arm == "paper":
            d = "(reference arm)"
        else:
            d = span(*(deltas(arm, model) if deltas else paired(data.get(headline, {}), base.get(headline, {}))))
        cells = [arm, model, *(cell(data.get(m, {})) for m in measures), d] + ([judge(arm, model)] if judge else [])
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def judges(series: dict) -> dict:
    """The decision rules (module docstring) as functions of (arm, model), from the controls in ``series``."""
    words, binding, captions = series["words"], series["binding"], series["captions"]
    control = interval(list(words.get(("paper", "ARC"), {}).get("S", {}).values()))
    m_w = MARGIN_FRACTION * control[0] if control[1] > 0 else math.nan  # NaN: the control failed

    def uses(arm, model):
        return verdict(words[(arm, model)].get("S", {}), m_w, words=("uses its words", "does not use its words"))

    def binds(arm, model):
        items = 60 * 2  # own_swap: swap_att and swap_obj at OWN_ITEMS each
        return verdict(binding[(arm, model)].get("own_swap own - another", {}), 100 * control_margin(items), 0.0,
                       ("binds", "does not bind"))

    def repeats(arm, model):
        stage, name = model.split(" ", 1)
        if name not in MATCHED.values() or arm == "paper":
            return ""
        paper = captions.get(("paper", model), {})
        refs = [v for v in paper.get("references' repeated content", {}).values() if v is not None]
        own = [v for v in paper.get("repeated content", {}).values() if v is not None]
        m_r = MARGIN_FRACTION * (np.mean(own) - np.mean(refs)) if own and refs else math.nan
        mean, lo, hi = paired(captions[(arm, model)].get("repeated content", {}), paper.get("repeated content", {}))
        if math.isnan(lo) or math.isnan(m_r):
            return "not resolved"
        return "repeats less" if hi < -abs(m_r) else "repeats more" if lo > abs(m_r) else "not resolved"

    return {"words": uses, "binding": binds, "captions": repeats, "margin_words": m_w}


def finetune_check(runs: list[dict]) -> list[str]:
    """Fine-tuning runs that hit their cap while their validation loss still improved (the rule forbids it)."""
    out = []
    for r in runs:
        for o, f in ((r["record"]["results"].get("finetune") or {}).items() if r["notebook"] == "captioning" else ()):
            if f and f.get("stopped") == "cap":
                out.append(f"{r['name']} {o}: stopped at its cap of {f['steps']} steps (best step {f['best_step']})")
    return out


def figure(series: dict, runs: list[dict], path: str) -> str:
    """One figure: each instrument's headline, arm minus paper with its 95% interval, per arm and model."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = [("probe", "mean4 (points)", "mean4"),
              ("binding", "own_swap: own - another image", "own_swap own - another"),
              ("words", "S: shape after true - another colour", "S"),
              ("captions", "repeated content words, matched length", "repeated content")]
    fig, axes = plt.subplots(1, len(panels), figsize=(4 * len(panels), 3.6), constrained_layout=True)
    for ax, (instrument, label, measure) in zip(axes, panels):
        rows = [k for k in sorted(series[instrument], key=lambda k: (ORDER.index(k[0]) if k[0] in ORDER else 99, k[1]))
                if k[0] != "paper" and (instrument != "captions" or k[1].split(" ", 1)[-1] in MATCHED.values())]
        for y, (arm, model) in enumerate(rows):
            if instrument == "probe":
                mean, lo, hi = probe_delta(runs, arm, model.lower())
            else:
                mean, lo, hi = paired(series[instrument][(arm, model)].get(measure, {}),
                                      series[instrument].get(("paper", model), {}).get(measure, {}))
            if not math.isnan(mean):
                ax.errorbar(mean, y, xerr=None if math.isnan(lo) else [[mean - lo], [hi - mean]], fmt="o", capsize=3)
        ax.axvline(0, color="grey", lw=0.8)
        ax.set_yticks(range(len(rows)), [f"{a} {m}" for a, m in rows], fontsize=7)
        ax.set_title(label, fontsize=8)
        ax.set_xlabel("arm - paper, 95% interval", fontsize=7)
    fig.savefig(path, dpi=150, metadata={"Software": None})
    plt.close(fig)
    return path


def build(records: str, folder: str) -> str:
    """``folder``/tables.md (one table per instrument, the verdicts, the fine-tuning check, ``folder``/weights'
    kept models, the records' package) and ``folder``/words.png from the ledger ``records``; returns the text."""
    found = ledger.read_all(records)
    runs = ledger.for_build(found)
    series = series_of(runs)
    rule = judges(series)
    text = "\n\n".join([
        "# The words study: tables",
        "Mean +- SD over seeds (n); arm - paper paired by seed, with its 95% interval; the verdicts follow the "
        "decision rules of reproduce/studies/words/PLAN.md.",
        render("Probe (pooled mean4, its tasks, the grid relation; control: the random-init floor)", series["probe"],
               "mean4", deltas=lambda a, m: probe_delta(runs, a, m.lower())),
        probe_gap(runs),
        render("Binding (own_swap, own_attribute: own / another item's / no image; MDC's diagnostic in the next table)",
               series["binding"], "own_swap own", judge=rule["binding"]),
        render(f"Neighbour use (S in points; m_w = {rule['margin_words']:.1f}, a tenth of the paper ARC's S)",
               series["words"], "S", judge=rule["words"]),
        render("Captions (alt world; CIDEr-D x 100 with another image's references as the control; repetition in %)",
               series["captions"], "repeated content", judge=rule["captions"]),
        "Fine-tuning runs that hit their cap: " + ("; ".join(finetune_check(runs)) or "none"),
        "Seed 0 of every arm's descriptive MDC and ARC, in float16 (`mdc.load(<folder>)`):\n"
        + ("\n".join(pretrained.listing(os.path.join(folder, "weights"), found)) or "none kept"),
        ledger.provenance(found) if found else "No records yet."])
    os.makedirs(folder, exist_ok=True)
    with open(os.path.join(folder, "tables.md"), "w") as f:
        f.write(text + "\n")
    if found:
        figure(series, runs, os.path.join(folder, "words.png"))
    return text


def _reference_rows(reference: str, neighbours: dict) -> list[dict]:
    """Per objective and decision quantity, the reference run's per-seed values, one model's items' variance at the
    study's items (points^2) and the effect the rule reads (its margin)."""
    runs = ledger.for_build(ledger.read_all(reference))
    s = {o: [r["measures"]["shape_after_colour"][WORDS_RATIO[o]]["own"] for r in neighbours.values()
             if r["objective"] == o] for o in ("mdc", "arc")}
    m_w, refs, rows = MARGIN_FRACTION * 100 * float(np.mean([e["difference"] for e in s["arc"]])), None, []
    for o, variant in (("mdc", "elbo"), ("arc", "exact")):
        rows.append({"quantity": "uses its words (S)", "objective": o, "items": 1000, "effect": m_w,
                     "values": [100 * e["difference"] for e in s[o]],  # the bootstrap's 95% half-width / 1.96
                     "v_items": float(np.mean([(100 * (e["interval"][1] - e["interval"][0]) / 3.92) ** 2
                                               for e in s[o]]))})
        own = [100 * r["record"]["results"]["columns"]["own_swap"]["scores"][variant]["accuracy"] for r in runs
               if r["notebook"] == "compositionality" and r["labels"].get("part") == "own"
               and r["labels"]["method"] == o.upper()]
        p, items = np.mean(own) / 100, 2 * 60  # own_swap: swap_att and swap_obj at OWN_ITEMS each
        rows.append({"quantity": "binds (own_swap)", "objective": o, "values": own, "items": items,
                     "v_items": 100**2 * p * (1 - p) / items, "effect": 100 * control_margin(items)})
        caps = [100 * r["record"]["results"]["metrics"][MATCHED[o]]["repeated"] for r in runs
                if r["notebook"] == "captioning"]
        refs = _reference_repetition(runs) if refs is None else refs
        rows.append({"quantity": "repeats less (all words, matched length)", "objective": o, "values": caps,
                     "items": 0, "v_items": 0.0, "effect": MARGIN_FRACTION * (np.mean(caps) - refs)})
    return rows


def _reference_repetition(runs: list[dict]) -> float:
    """The references' repeated words (%) of the captioning test split the reference run's evaluation sets hold."""
    from mdc.world.evalsets import write_evalsets

    p = next(r["params"] for r in runs if r["name"] == "data/evalsets")
    with tempfile.TemporaryDirectory() as tmp:
        write_evalsets(tmp, p["seed"], p["image_size"], 1, 1, p["n_items"], p["n_caption_train"])
        with open(os.path.join(tmp, "captions", "dataset_scenes.json")) as f:
            images = json.load(f)["images"]
    return 100 * repetition([s["raw"] for im in images if im["split"] == "test" for s in im["sentences"]])["repeated"]


def write_seed_plan(reference: str, path: str, neighbours_file: str = REFERENCE_NEIGHBOURS) -> str:
    """Seeds per objective before any arm is read: for each decision quantity, reproduce.power's seeds for 80%
    power to see an arm - paper difference of the rule's margin (seed SD sqrt(2) x the reference's, items'
    variance twice one model's), at least ``power.FLOOR_SEEDS``; a quantity asking more than ``power.MAX_SEEDS``
    (or none) leaves the floor. Writes ``path``; returns the table."""
    with open(neighbours_file) as f:
        neighbours = json.load(f)
    rows, seeds = _reference_rows(reference, neighbours), {}
    for row in rows:
        row["sd"], e = float(np.std(row["values"], ddof=1)), abs(row["effect"])
        row["seeds"] = power.needed_seeds(e, math.sqrt(2) * row["sd"], 2 * row["v_items"], 0.975)
        k = row["seeds"] if row["seeds"] is not None and row["seeds"] <= power.MAX_SEEDS else power.FLOOR_SEEDS
        seeds[row["objective"]] = max(seeds.get(row["objective"], power.FLOOR_SEEDS), k)
        if row["seeds"] is None and row["v_items"] > 0:  # power's "never": the items at which seeds could do
            need = row["items"] * 2 * row["v_items"] * (1.959964 + 0.841621) ** 2 / e**2
            row["seeds_text"] = f"never at {row['items']:,} items (> {math.ceil(need):,})"
    table = ["| quantity | objective | reference seeds | mean | seed SD | effect (margin) | seeds for 80% power |",
             "|---|---|---|---|---|---|---|"]
    table += [f"| {r['quantity']} | {r['objective']} | {len(r['values'])} | {np.mean(r['values']):.1f} | "
              f"{r['sd']:.1f} | {r['effect']:.1f} | {r.get('seeds_text') or r['seeds'] or 'never'} |" for r in rows]
    plan = {"about": "python -m reproduce.studies.words --plan-seeds: reproduce.power's seeds for the study's "
                     "decision rules, from the reference run before any arm was read", "default": power.FLOOR_SEEDS,
            "seeds": seeds, "rows": [{k: v for k, v in r.items()} for r in rows]}
    with open(path, "w") as f:
        json.dump(plan, f, indent=1, default=float)
        f.write("\n")
    return "\n".join(table) + f"\n\nseeds: {seeds} (written to {os.path.relpath(path)})"
