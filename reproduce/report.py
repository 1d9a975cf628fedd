"""Every paper artifact rebuilt from the run records: tables (Markdown, CSV, LaTeX) with the
paper's number in the column beside ours, figures (PNG, PDF). Nothing here trains or scores, and
nothing reads a run folder.

Input: the runs of the ledger (:func:`reproduce.ledger.for_build`: run name -> notebook, labels, the
artifacts it feeds and its results, ``record``) and the paper's numbers (``reproduce/paper/*.csv``). Over seeds, a cell is "mean ± std" (sample std; "mean"
alone for one seed). Synthetic probe tasks stand in for the paper's datasets as
``mdc.world.evalsets.PROBE_TASKS`` says (object -> ImageNet-1k, texture -> Food101, shape ->
CIFAR-10, shape_texture -> CIFAR-100, colour -> Pets); a real-data run reports the real ones.

One builder per artifact (``table1`` ... ``fig6``, ``tables6_8``, ``guidance``), each taking
those runs, the paper's numbers and the output folder and returning the
files it wrote. :data:`reproduce.registry.ARTIFACTS` names the builder of every artifact and
:func:`reproduce.registry.build_artifacts` runs the ones asked for.
"""
from __future__ import annotations

import csv
import json
import os
from collections import defaultdict
from typing import Callable, Iterable, Mapping, Sequence

import numpy as np

# synthetic probe task -> the paper's Table 1 column it stands in for (mdc.world.evalsets.PROBE_TASKS)
PROBE_COLUMNS = {"object": "imagenet1k", "texture": "food101", "shape": "cifar10", "shape_texture": "cifar100",
                 "colour": "pets"}
REAL_COLUMNS = {"imagenet1k": "imagenet1k", "food101": "food101", "cifar10": "cifar10", "cifar100": "cifar100",
                "pets": "pets", "wds/imagenet1k": "imagenet1k"}
LOSS_COLUMN = "pretraining loss, first → last 10 steps (per seed)"  # a run that did not train shows here
EXTRA_TASKS = ("count", "relation", "background")  # synthetic tasks without a paper column
STYLE_DATA = {"alt": "CC12M", "descriptive": "Recap-DataComp-10M"}  # the paper's data of each caption style
PAPER_BACKBONE = "ViT-B/32"  # the paper row a synthetic run is printed beside (the smallest backbone)
# Table 2: the paper's row (reproduce/paper/table2_compositionality.csv) of each scorer
PAPER_ROWS = {"cosine": "CLIP", "exact": "ARC", "elbo": "MDC (Monte Carlo)", "heuristic": "MDC (Heuristic)"}
# How Table 2's numbers are computed (mdc.eval.accuracy, mdc.eval.compositionality): notes under the table
TABLE2_RULES = {
    "ties": "each benchmark's own rule: ARO's argmax takes the first maximum, so a tie with the true caption is "
            "correct on the order tasks (true caption listed first) and an error on VG-Relation and VG-Attribution "
            "(false caption first); SugarCrepe counts pos > neg, a tie is an error",
    "interval": "95% percentile cluster bootstrap (1000 resamples) with the image as the unit: an image's items "
                "(COCO-Order's five captions, SugarCrepe items of one image across sub-files) resample together; "
                "the macro suites' groups are fixed from the full file; over several seeds, the mean over seeds "
                "and the interval of the seed-averaged per-item outcomes (test-item noise only); ↑: the interval "
                "lies above chance",
    "per token": "the score divided by the caption's token count (exact: the caption tokens and [EOT]; elbo, "
                 "heuristic: the caption tokens); cosine is left unchanged",
    "SugarCrepe": "add = {add_att, add_obj}, replace = {replace_att, replace_obj, replace_rel}, swap = {swap_att, "
                  "swap_obj}; the sub-files' items pooled, and (sub-file mean) SugarCrepe's own mean over sub-files",
    "no image": "the same scorer without the image: the model's learned null condition for the MDC scorers of a "
                "model trained with one (cond_drop_prob > 0), else log p(t) estimated as the log-mean-exp of "
                "log p(t | i_k) over K other images of the suite (K in the run's settings, blind_images); the same "
                "noise keys as the score with the image",
    "the image adds": "accuracy with the image minus without it (points), with its paired cluster-bootstrap interval",
    "image-debiased": "log p(t | i) - alpha log p(t) (VisualGPTScore's debiasing), for exact and Monte Carlo only: "
                      "the heuristic without the image reveals in another order",
    "*": "a no-image accuracy at least 10 points from chance: the text alone separates the captions",
}


# ----------------------------------------------------------------------------- inputs
def paper_table(paper_dir: str, name: str) -> list[dict]:
    """Rows of ``paper_dir/<name>.csv`` (numbers as floats where they parse)."""
    def num(v):
        try:
            return float(v)
        except ValueError:
            return v or None

    with open(os.path.join(paper_dir, f"{name}.csv")) as f:
        return [{k: num(v) for k, v in row.items()} for row in csv.DictReader(f)]


def cell(values: Sequence[float], scale: float = 100.0) -> str:
    """"mean ± std" over seeds (percent by default), "mean" for one value, "-" for none."""
    values = [scale * v for v in values if v is not None and np.isfinite(v)]
    if not values:
        return "-"
    if len(values) == 1:
        return f"{values[0]:.1f}"
    return f"{np.mean(values):.1f} ± {np.std(values, ddof=1):.1f}"


def paper_cell(value) -> str:
    return "-" if value is None or value == "" else f"{value:.1f}" if isinstance(value, float) else str(value)


def write_table(rows: list[dict], path: str, caption: str = "", notes: Mapping[str, str] | None = None) -> list[str]:
    """Write rows (dicts of strings) as ``path``.md / .csv / .tex; returns the files. ``notes``
    ({term: what it means}) follow the Markdown table as a list."""
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    columns = list(dict.fromkeys(k for r in rows for k in r))
    files = [f"{path}.md", f"{path}.csv", f"{path}.tex"]
    with open(files[0], "w") as f:
        f.write((f"{caption}\n\n" if caption else "") + "| " + " | ".join(columns) + " |\n|"
                + "---|" * len(columns) + "\n")
        f.writelines("| " + " | ".join(str(r.get(c, "")) for c in columns) + " |\n" for r in rows)
        if notes:
            f.write("\n" + "".join(f"- {term}: {text}\n" for term, text in notes.items()))
    with open(files[1], "w", newline="") as f:
        w = csv.DictWriter(f, columns)
        w.writeheader()
        w.writerows(rows)

    def tex(s):
        for plain, latex in (("±", r"$\pm$"), ("→", r"$\to$"), ("%", r"\%"), ("_", r"\_"), ("&", r"\&")):
            s = str(s).replace(plain, latex)
        return s

    with open(files[2], "w") as f:
        f.write("\\begin{table}[t]\n\\centering\n" + (f"\\caption{{{tex(caption)}}}\n" if caption else "")
                + "\\begin{tabular}{" + "l" * len(columns) + "}\n\\toprule\n"
                + " & ".join(tex(c) for c in columns) + " \\\\\n\\midrule\n"
                + "".join(" & ".join(tex(r.get(c, "")) for c in columns) + " \\\\\n" for r in rows)
                + "\\bottomrule\n\\end{tabular}\n\\end{table}\n")
    return files


def _group(runs: Iterable[dict], notebook: str, artifact: str, key: Callable[[dict], tuple]) -> dict:
    """Results records of ``notebook`` runs feeding ``artifact``, grouped by ``key(labels)``."""
    out = defaultdict(list)
    for r in runs:
        if r["notebook"] == notebook and artifact in r["artifacts"]:
            out[key(r["labels"])].append(r["record"])
    return out


def _probe_top1(record: dict, floor: bool = False) -> dict[str, float]:
    """{column or task: top-1} of a linear_probe record (its random-init floor with ``floor``)."""
    res = record["results"]["random_init"] if floor else record["results"]
    out = {}
    for name, r in res["datasets"].items():
        task = name.split("/", 1)[1] if name.startswith("wds/") else name
        out[PROBE_COLUMNS.get(task, REAL_COLUMNS.get(name, task))] = r["top1"]
    return out


def _loss_ends(runs: Iterable[dict], n: int = 10) -> dict[str, str]:
    """{checkpoint id: "first → last"}: a pretraining run's mean loss over its first and last ``n`` logged
    steps (its results' ``losses``), keyed by the weights it wrote, which the probes of those weights record too."""
    out = {}
    for r in runs:
        record = r["record"]
        losses = (record.get("results") or {}).get("losses")
        if r["notebook"] == "pretrain" and record.get("checkpoint_id") and losses:
            out[record["checkpoint_id"]] = f"{np.mean(losses[:n]):.2f} → {np.mean(losses[-n:]):.2f}"
    return out


def _informative_mean(top1: Mapping[str, float]) -> float | None:
    """Mean of the synthetic tasks the learnability study found informative (object, shape, texture, count)."""
    keys = ("imagenet1k", "cifar10", "food101", "count")
    return float(np.mean([top1[k] for k in keys])) if all(k in top1 for k in keys) else None


# ----------------------------------------------------------------------------- tables
def table1(runs: list[dict], paper_dir: str, out: str) -> list[str]:
    """Table 1: linear probe per method and caption style (+ CLIP-LB), random-init floor, paper rows."""
    groups = _group(runs, "linear_probe", "table1", lambda l: (l.get("style"), l.get("method")))
    paper = paper_table(paper_dir, "table1_linear_probe")
    columns = ["imagenet1k", "food101", "cifar10", "cifar100", "pets"]

    def cells(top1: list[dict], extra: list[str]) -> dict:  # per-column, average and mean4 cells over seeds
        return {**{c: cell([t.get(c) for t in top1]) for c in columns + extra},
                "average": cell([np.mean([t[c] for c in columns if c in t]) for t in top1]),
                "mean4": cell([_informative_mean(t) for t in top1])}

    losses = _loss_ends(runs)
    rows = []
    for (style, method), records in sorted(groups.items(), key=lambda kv: (kv[0][0], kv[0][1] != "CLIP-LB")):
        top1 = [_probe_top1(r) for r in records]
        extra = [c for c in EXTRA_TASKS if c in top1[0]]
        row = {"data": style, "method": method, "seeds": str(len(records)), **cells(top1, extra),
               LOSS_COLUMN: ", ".join(losses.get(r.get("checkpoint_id"), "-") for r in records)}
        ref = next((p for p in paper if p["backbone"] == PAPER_BACKBONE and p["pretrain_data"] == STYLE_DATA.get(style)
                    and p["method"] == method), None)
        row["paper average"] = paper_cell(ref["average"]) if ref else "-"
        row["paper"] = f"{PAPER_BACKBONE} {STYLE_DATA.get(style, '')} " + " / ".join(
            paper_cell(ref[c]) for c in columns) if ref else "-"
        rows.append(row)
        if method in ("CLIP", "ARC", "MDC"):  # each method's own random-initialised encoder
            floor = [_probe_top1(r, floor=True) for r in records]
            rows.append({"data": style, "method": f"{method} random init", "seeds": str(len(records)),
                         **cells(floor, extra), LOSS_COLUMN: "-", "paper average": "-", "paper": "-"})
    return write_table(rows, os.path.join(out, "table1_linear_probe"),
                       "Table 1: linear probe top-1 (%), mean ± std over seeds; on the synthetic world the columns "
                       "hold the tasks standing in for the paper's datasets (imagenet1k: object, food101: texture, "
                       "cifar10: shape, cifar100: shape+texture, pets: colour); mean4: object, shape, texture, count; "
                       "'paper' lists the paper's five numbers in the same column order")


def _table2_cell(results: list[dict], column: str, variant: str, baseline: str | None = None,
                 macro: bool = False) -> str:
    """"acc [lo, hi]" (percent; ↑ when the interval lies above chance) of ``variant`` over the seeds'
    results, or the difference from ``baseline`` (points), from their per-item records
    (:func:`mdc.eval.accuracy.over_seeds`); without records "mean ± std" over seeds."""
    from mdc.eval.accuracy import over_seeds

    got = over_seeds(results, column, variant, baseline, macro=macro)
    if got is None:
        return "-" if baseline or macro else cell([r["table2"].get(variant, {}).get(column) for r in results])
    a, lo, hi = (100 * x for x in got)
    if np.isnan(a):
        return "-"
    if baseline:
        return f"{a:+.1f} [{lo:+.1f}, {hi:+.1f}]"
    return f"{a:.1f} [{lo:.1f}, {hi:.1f}]" + ("↑" if lo > 100 * results[0]["columns"][column]["chance"] else "")


def _table2_models(runs: list[dict]) -> list[dict]:
    """Table 2's results, one per model: the runs of one model's parts (the same labels but for ``part``:
    reproduce.registry.TABLE2_PARTS, disjoint suites) joined into one."""
    models: dict[str, list[dict]] = {}
    for r in runs:
        if r["notebook"] == "compositionality" and "table2" in r["artifacts"]:
            model = json.dumps({k: v for k, v in r["labels"].items() if k != "part"}, sort_keys=True)
            models.setdefault(model, []).append(r)
    joined = []
    for parts in models.values():
        results = {**parts[0]["record"]["results"], "columns": {}, "sugarcrepe_subsets": {}, "table2": {}}
        for r in parts:
            part = r["record"]["results"]
            twice = set(results["columns"]) & set(part.get("columns", {}))
            if twice:
                raise ValueError(f"{r['name']}: Table 2 column(s) {sorted(twice)} scored by another part as well")
            results["columns"] |= part.get("columns", {})
            results["sugarcrepe_subsets"] |= part.get("sugarcrepe_subsets", {})
            for variant, cells in part["table2"].items():
                results["table2"].setdefault(variant, {}).update(cells)
        joined.append(results)
    return joined


def table2(runs: list[dict], paper_dir: str, out: str) -> list[str]:
    """Table 2: compositionality per scorer (CLIP cosine, ARC exact, MDC Monte Carlo and heuristic), each cell
    the accuracy with its 95% interval; where scored, each likelihood scorer without the image, what the image
    adds (with - without, paired interval) and image-debiased (rows below it)."""
    from mdc.eval.compositionality import COLUMNS

    paper = {p["method"]: p for p in paper_table(paper_dir, "table2_compositionality")}
    by_variant, far = defaultdict(list), defaultdict(set)  # far: blind cells at least 10 points from chance
    for results in _table2_models(runs):
        for variant in results["table2"]:
            if variant.endswith(("_blind_lengthnorm", "_debiased_lengthnorm")):
                continue  # per token, only the raw scores
            by_variant[variant].append(results)
            far[variant] |= {c for c, e in results.get("columns", {}).items()
                             if e["scores"].get(variant, {}).get("far_from_chance")}
    by_variant |= {f"{v}_adds": by_variant[v] for v in list(by_variant) if f"{v}_blind" in by_variant}
    order = ["cosine", "exact", "elbo", "heuristic", "elbo_trained_t"]
    kinds = ("", "_lengthnorm", "_blind", "_adds", "_debiased")

    def split(variant):  # (base, kind)
        kind = next((k for k in kinds[1:] if variant.endswith(k)), "")
        return variant.removesuffix(kind) if kind else variant, kind

    rows = []
    for variant in sorted(by_variant, key=lambda v: (order.index(split(v)[0]) if split(v)[0] in order else 9,
                                                     kinds.index(split(v)[1]))):
        base, kind = split(variant)
        name = "MDC (Monte Carlo, trained t only)" if base == "elbo_trained_t" else PAPER_ROWS.get(base, base)
        label = name + {"": "", "_lengthnorm": " per token", "_blind": ", no image",
                        "_adds": ", the image adds (points)", "_debiased": ", image-debiased"}[kind]
        results = by_variant[variant]
        row = {"method": label, "seeds": str(len(results))}
        for c in COLUMNS:
            row[c] = (_table2_cell(results, c, base, f"{base}_blind") if kind == "_adds" else
                      _table2_cell(results, c, variant) + ("*" if c in far[variant] else ""))
            ref = paper.get(PAPER_ROWS.get(base)) if not kind else None
            row[f"{c} (paper)"] = paper_cell(ref[c]) if ref else "-"
        for c in COLUMNS[4:] if kind in ("", "_lengthnorm") else ():
            row[f"{c} (sub-file mean)"] = _table2_cell(results, c, variant, macro=True)
        rows.append(row)
    caption = ("Table 2: compositionality accuracy (%) [95% cluster-bootstrap interval, the image the unit], "
               "↑ interval above chance; chance 50 (pairs), 20 (order); ties as each benchmark scores them")
    if any(split(v)[1] == "_blind" for v in by_variant):
        caption += ("; no image: the scorer without the image (null condition, or log-mean-exp over K other "
                    "images), the image adds: with - without (points, paired interval), image-debiased: "
                    "log p(t|i) - log p(t); * no-image accuracy at least 10 points from chance (the text alone "
                    "decides); SugarCrepe's published text-only baselines sit near 50 by construction")
    return write_table(rows, os.path.join(out, "table2_compositionality"), caption, TABLE2_RULES)


def table3(runs: list[dict], paper_dir: str, out: str) -> list[str]:
    """Table 3: captioning metrics per caption set (ARC beam 6, MDC-10/15/20) with the paper's COCO rows."""
    from mdc.eval.captioning import table3_rows

    paper = {p["method"]: p for p in paper_table(paper_dir, "table3_captioning")}
    per_method = defaultdict(list)
    for r in runs:
        if r["notebook"] == "captioning" and "table3" in r["artifacts"]:
            for row in table3_rows(r["record"]["results"], "coco"):
                per_method[row.pop("method")].append(row)
    rows = []
    for method, vals in per_method.items():
        row = {"method": method, "seeds": str(len(vals))}
        for c in ("coco_bleu4", "coco_meteor", "coco_cider", "coco_spice", "coco_rougeL", "coco_llm_judge"):
            row[c.removeprefix("coco_")] = cell([v.get(c) for v in vals], scale=1.0)
            ref = paper.get(method)
            row[f"{c.removeprefix('coco_')} (paper COCO)"] = paper_cell(ref[c]) if ref else "-"
        row["grounded words"] = cell([v.get("grounded_words") for v in vals], scale=1.0)
        row["repeated (%)"] = cell([v.get("repeated") for v in vals], scale=1.0)
        rows.append(row)
    return write_table(rows, os.path.join(out, "table3_captioning"),
                       "Table 3: captioning on the held-out references (pycocoevalcap, x100); paper: MSCOCO. "
                       "Beside them (not in the paper): distinct words of a caption found in its image's "
                       "references, and the share of its words that repeat an earlier one")


def _probe_rows(runs, artifact: str, key, columns: dict[str, Callable[[dict], float | None]]) -> dict:
    """{key(labels): {column: [values over seeds]}} from the probe runs feeding ``artifact``."""
    out = {}
    for k, records in _group(runs, "linear_probe", artifact, key).items():
        tops = [_probe_top1(r) for r in records]
        out[k] = {c: [f(t) for t in tops] for c, f in columns.items()}
    return out


def table4(runs: list[dict], paper_dir: str, out: str) -> list[str]:
    """Table 4: MDC with and without the 1/t weight, per caption style (ImageNet analogue, and mean4)."""
    paper = {p["method"]: p for p in paper_table(paper_dir, "table4_time_weighting")}
    data = _probe_rows(runs, "table4", lambda l: (l.get("method"), l.get("style")),
                       {"object": lambda t: t.get("imagenet1k"), "mean4": _informative_mean})
    rows = []
    for method in ("MDC (w/o t)", "MDC"):
        row = {"method": method}
        for style, paper_col in (("alt", "cc12m_imagenet1k"), ("descriptive", "recap_datacomp_10m_imagenet1k")):
            v = data.get((method, style), {})
            row[f"{style}: object"] = cell(v.get("object", []))
            row[f"{style}: mean4"] = cell(v.get("mean4", []))
            row[f"{style} (paper {paper_col})"] = paper_cell(paper.get(method, {}).get(paper_col))
        rows.append(row)
    return write_table(rows, os.path.join(out, "table4_time_weighting"),
                       "Table 4: linear probe top-1 (%) with and without the 1/t loss weight")


def table5(runs: list[dict], paper_dir: str, out: str) -> list[str]:
    """Table 5: noise schedules t ~ U[w_l, w_u] on alt captions."""
    paper = {p["t_interval"]: p["cc3m_imagenet1k"] for p in paper_table(paper_dir, "table5_noise_schedule")}
    data = _probe_rows(runs, "table5", lambda l: tuple(l.get("t_interval") or (0.5, 1.0)),
                       {"object": lambda t: t.get("imagenet1k"), "mean4": _informative_mean})
    rows = []
    for interval in sorted(data):
        name = f"[{interval[0]:.1f}, {interval[1]:.1f}]"
        rows.append({"t_interval": name, "object": cell(data[interval]["object"]),
                     "mean4": cell(data[interval]["mean4"]), "paper (CC3M, IN-1k)": paper_cell(paper.get(name))})
    return write_table(rows, os.path.join(out, "table5_noise_schedule"),
                       "Table 5: linear probe top-1 (%) per noise schedule (alt captions)")


def tables6_8(runs: list[dict], paper_dir: str, out: str) -> list[str]:
    """Tables 6-8: the pretraining presets of this package beside the paper's hyperparameters."""
    from mdc.optim import preset_values

    rows = []
    for p in paper_table(paper_dir, "hyperparameters"):
        preset = p["backbone"].lower().replace("/", "-").replace("vit-", "vit-")
        ours = preset_values(preset, "arc")
        rows.append({"backbone": p["backbone"], "base lr": f"{ours['lr']:g}", "paper base lr": f"{p['base_lr']:g}",
                     "weight decay": f"{ours['weight_decay']:g}", "paper weight decay": f"{p['weight_decay']:g}",
                     "warmup": str(ours["warmup_steps"]), "paper warmup": f"{p['warmup_steps']:.0f}",
                     "betas": "/".join(map(str, ours["betas"])), "paper betas": f"{p['beta1']}/{p['beta2']}",
                     "batch": str(ours["global_batch"]), "paper batch": f"{p['batch_size']:.0f}",
                     "epochs": str(ours["epochs"]), "paper epochs": f"{p['epochs']:.0f}",
                     "grad clip (ARC)": str(ours["grad_clip_norm"] or "-"),
                     "paper grad clip": str(p["grad_clip_norm"] or "-")})
    return write_table(rows, os.path.join(out, "tables6-8_hyperparameters"),
                       "Tables 6-8: pretraining hyperparameters (presets of mdc.optim) beside the paper's")


# ----------------------------------------------------------------------------- figures
def fig3(runs: list[dict], paper_dir: str, out: str) -> list[str]:
    """Fig. 3: caption length distributions of the pretraining sets (data runs)."""
    from mdc.plots import plot_caption_lengths

    dists = {}
    for r in runs:
        res = r["record"]["results"]
        if r["notebook"] == "data" and "fig3" in r["artifacts"] and res.get("lengths"):
            label = r["labels"].get("data") or r["labels"].get("style")
            dists[label] = res["lengths"]
    base = os.path.join(out, "fig3_caption_lengths")
    plot_caption_lengths(dists, base)
    return [base + ".png", base + ".pdf"]


def fig4(runs: list[dict], paper_dir: str, out: str) -> list[str]:
    """Fig. 4: probe top-1 of image-conditioned BERT per fixed masking ratio, against MDC."""
    from mdc.plots import plot_mask_ratios

    data = _probe_rows(runs, "fig4", lambda l: (l.get("method"), l.get("mask_ratio")),
                       {"object": lambda t: t.get("imagenet1k"), "mean4": _informative_mean})
    bert = {k[1]: v for k, v in data.items() if k[0] == "BERT"}
    mdc_ = next((v for k, v in data.items() if k[0] == "MDC"), None)
    base = os.path.join(out, "fig4_mask_ratios")
    plot_mask_ratios(bert, mdc_, base)
    return [base + ".png", base + ".pdf"]


def fig5(runs: list[dict], paper_dir: str, out: str) -> list[str]:
    """Fig. 5: probe top-1 against the number of pretraining pairs (MDC, descriptive captions)."""
    from mdc.plots import plot_data_scaling

    points = defaultdict(lambda: defaultdict(list))
    for r in runs:
        if r["notebook"] == "linear_probe" and "fig5" in r["artifacts"] and r["labels"].get("method") == "MDC":
            pairs = r["labels"].get("pairs")
            top = _probe_top1(r["record"])
            points[pairs]["object"].append(top.get("imagenet1k"))
            points[pairs]["mean4"].append(_informative_mean(top))
    base = os.path.join(out, "fig5_data_scaling")
    plot_data_scaling({k: dict(v) for k, v in points.items()}, base)
    return [base + ".png", base + ".pdf"]


def fig6(runs: list[dict], paper_dir: str, out: str, k: int = 3) -> list[str]:
    """Fig. 6: qualitative captions (MDC-10/15/20, ARC) of the first captioning run's examples."""
    from mdc.eval.captioning import example_images
    from mdc.plots import plot_captions

    run = next((r for r in runs if r["notebook"] == "captioning" and "fig6" in r["artifacts"]), None)
    if run is None:
        return []
    examples = (run["record"]["results"].get("examples") or [])[:k]
    if not examples:
        return []
    base = os.path.join(out, "fig6_captions")
    plot_captions(example_images(examples), {name: [e["captions"][name] for e in examples] for name in examples[0]["captions"]},
                  [e.get("references") for e in examples], base)
    return [base + ".png", base + ".pdf"]


def guidance(runs: list[dict], paper_dir: str, out: str) -> list[str]:
    """MC-Diffusion's figure and table: reference metrics and CLIPScore per guidance rule and strength (seed 0's
    run), with 95% bootstrap intervals over images and how far each run's captions moved from the unguided
    ones. One strength scales different log-ratios per rule (CFG: against the null condition; MCS: against a
    condition with ~10% of its tokens masked), so rules compare along their frontiers (the figure), at equal
    reference metric or distance moved, not at equal strength. Each row also gives the scale it ran at
    (records with a scale only: its strength; records without per-image outcomes: no intervals)."""
    from mdc.eval.guidance_sweeps import run_intervals
    from mdc.guidance import RULES, strength_of
    from mdc.plots import plot_guidance_tradeoff

    run = next((r for r in runs if r["notebook"] == "guidance" and "guidance" in r["artifacts"]), None)
    if run is None:
        return []
    res = run["record"]["results"]
    base = os.path.join(out, "guidance_tradeoff")
    plot_guidance_tradeoff(res, base)
    ci = run_intervals(res, seed=run["record"].get("parameters", {}).get("seed", 0))

    def strength(r):
        return r["strength"] if r.get("strength") is not None else strength_of(r["guidance"], r["scale"])

    def with_ci(r, key, scale, digits):
        value, lo_hi = r.get(key), ci.get(r["label"], {}).get(key)
        if value is None:
            return "-"
        text = f"{scale * value:.{digits}f}"
        return text if lo_hi is None else f"{text} [{scale * lo_hi[0]:.{digits}f}, {scale * lo_hi[1]:.{digits}f}]"

    none = next((x for x in res["runs"] if x["guidance"] == "none"), {})

    def delta(r):  # the paired difference from the unguided run, with its interval
        d = ci.get(r["label"], {}).get("delta_clipscore")
        if r["scale"] is None or r.get("clipscore") is None or none.get("clipscore") is None:
            return "-"
        text = f"{r['clipscore'] - none['clipscore']:+.3f}"
        return text if d is None else f"{text} [{d[0]:+.3f}, {d[1]:+.3f}]"

    rows = [{"guidance": {**RULES, "none": "unguided"}.get(r["guidance"], r["guidance"]),
             "strength": "0" if r["scale"] is None else f"{strength(r):g}",
             "scale": "-" if r["scale"] is None else f"{r['scale']:g}",
             "changed": "-" if r.get("changed") is None else f"{100 * r['changed']:.0f}",
             "word edits": "-" if r.get("word_edit") is None else f"{100 * r['word_edit']:.1f}",
             "bleu4": with_ci(r, "bleu4", 100, 1), "meteor": cell([r.get("meteor")]),
             "cider": with_ci(r, "cider", 100, 1), "CLIPScore": with_ci(r, "clipscore", 1, 3),
             "CLIPScore - unguided": delta(r)} for r in res["runs"]]
    notes = {"changed": "% of images whose caption differs from the unguided one",
             "word edits": "mean word-level edit distance to the unguided caption, % of the longer caption",
             "[lo, hi]": "95% percentile bootstrap over images (1,000 resamples, the same images for every run, "
                         "so differences are paired); BLEU-4 recomputed from the resampled images' counts, CIDEr "
                         "as the mean of per-image CIDEr with the whole set's IDF"}
    return [base + ".png", base + ".pdf"] + write_table(
        rows, os.path.join(out, "guidance_tradeoff"),
        "MC-Diffusion guidance: reference metrics (x100) and CLIPScore per rule and guidance strength; compare "
        "rules at equal reference metric or distance moved (the frontier figure), not at equal strength", notes)
