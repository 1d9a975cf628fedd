"""The paper's tables rebuilt from the run records, with the paper's number in the column beside ours:
the linear probes (Tables 1, 4, 5), captioning (Table 3), the pretraining presets (Tables 6-8), and
MC-Diffusion's guidance table with its figure. Nothing here trains or scores, and nothing reads a run
folder. Table 2 is built in :mod:`reproduce.artifacts.compositionality_table`, Figs. 3-6 in :mod:`reproduce.artifacts.paper_figures`.

Input: the runs of the ledger (:func:`reproduce.running.ledger.for_build`: run name -> notebook, labels, the
artifacts it feeds and its results, ``record``) and the paper's numbers (``reproduce/paper/*.csv``). Over
seeds, a cell is "mean ± std" (:func:`reproduce.artifacts.tables.cell`); probe records are read as the paper's
columns (:mod:`reproduce.artifacts.probe_records`).

One builder per artifact, each taking those runs, the paper's numbers and the output folder and
returning the files it wrote. :data:`reproduce.registry.ARTIFACTS` names the builder of every artifact
and :func:`reproduce.registry.build_artifacts` runs the ones asked for.
"""
from __future__ import annotations

import os
from collections import defaultdict
from typing import Iterable

import numpy as np

from mdc.eval.captioning import table3_rows
from mdc.eval.guidance_sweeps import run_intervals
from mdc.mc_diffusion.guidance import RULES, strength_of
from mdc.base.optim import preset_values
from mdc.plots import plot_guidance_tradeoff
from reproduce.artifacts.probe_records import informative_mean, probe_rows, probe_top1, records_by
from reproduce.artifacts.tables import cell, paper_cell, paper_table, write_table

LOSS_COLUMN = "pretraining loss, first → last 10 steps (per seed)"  # a run that did not train shows here
EXTRA_TASKS = ("count", "relation", "background")  # synthetic tasks without a paper column
STYLE_DATA = {"alt": "CC12M", "descriptive": "Recap-DataComp-10M"}  # the paper's data of each caption style
PAPER_BACKBONE = "ViT-B/32"  # the paper row a synthetic run is printed beside (the smallest backbone)
GRID_COLUMNS = {"relation, grid": "relation", "mean4, grid": "mean4"}  # Table 1's grid-probe columns


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


# ----------------------------------------------------------------------------- tables
def table1(runs: list[dict], paper_dir: str, out: str) -> list[str]:
    """Table 1: linear probe per method and caption style (+ CLIP-LB), random-init floor, paper rows."""
    groups = records_by(runs, "linear_probe", "table1", lambda l: (l.get("style"), l.get("method")))
    paper = paper_table(paper_dir, "table1_linear_probe")
    columns = ["imagenet1k", "food101", "cifar10", "cifar100", "pets"]

    def cells(top1: list[dict], extra: list[str]) -> dict:  # per-column, average and mean4 cells over seeds
        return {**{c: cell([t.get(c) for t in top1]) for c in columns + extra},
                "average": cell([np.mean([t[c] for c in columns if c in t]) for t in top1]),
                "mean4": cell([informative_mean(t) for t in top1])}

    losses = _loss_ends(runs)
    rows = []
    for (style, method), records in sorted(groups.items(), key=lambda kv: (kv[0][0], kv[0][1] != "CLIP-LB")):
        top1 = [probe_top1(r) for r in records]
        extra = [c for c in EXTRA_TASKS if c in top1[0]]
        row = {"data": style, "method": method, "seeds": str(len(records)), **cells(top1, extra),
               **grid_cells(records, False),
               LOSS_COLUMN: ", ".join(losses.get(r.get("checkpoint_id"), "-") for r in records)}
        ref = next((p for p in paper if p["backbone"] == PAPER_BACKBONE and p["pretrain_data"] == STYLE_DATA.get(style)
                    and p["method"] == method), None)
        row["paper average"] = paper_cell(ref["average"]) if ref else "-"
        row["paper"] = f"{PAPER_BACKBONE} {STYLE_DATA.get(style, '')} " + " / ".join(
            paper_cell(ref[c]) for c in columns) if ref else "-"
        rows.append(row)
        if method in ("CLIP", "ARC", "MDC"):  # each method's own random-initialised encoder
            floor = [probe_top1(r, floor=True) for r in records]
            rows.append({"data": style, "method": f"{method} random init", "seeds": str(len(records)),
                         **cells(floor, extra), **grid_cells(records, True), LOSS_COLUMN: "-", "paper average": "-",
                         "paper": "-"})
    return write_table(rows, os.path.join(out, "table1_linear_probe"),
                       "Table 1: linear probe top-1 (%), mean ± std over seeds; on the synthetic world the columns "
                       "hold the tasks standing in for the paper's datasets (imagenet1k: object, food101: texture, "
                       "cifar10: shape, cifar100: shape+texture, pets: colour); mean4: object, shape, texture, count; "
                       "'paper' lists the paper's five numbers in the same column order", TABLE1_NOTES)


TABLE1_NOTES = {
    "relation, grid / mean4, grid": "the grid probe (mdc.eval.grid_probe): the same encoder tokens averaged over 4 x 4 "
                                    "cells instead of one mean, then the same classifier; it keeps where things are, "
                                    "which the pooled features discard",
    "relation": "pooled features read it at chance (25%) for every model, and so does the supervised ceiling trained "
                "with a relation head on its pooled features at mini's budget (23.8%), whose tokens the grid probe "
                "reads at 71.0% (random init 42.1%): reproduce/studies/learnability.md, 'Relation'",
}


def grid_cells(records: list[dict], floor: bool) -> dict[str, str]:
    """Table 1's grid-probe cells over seeds (the floor's grid probe with ``floor``)."""
    tops = [probe_top1(r, floor=floor, grid=True) for r in records]
    values = {"relation": [t.get("relation") for t in tops], "mean4": [informative_mean(t) for t in tops]}
    return {c: cell(values[key]) for c, key in GRID_COLUMNS.items()}


def table3(runs: list[dict], paper_dir: str, out: str) -> list[str]:
    """Table 3: captioning metrics per caption set (ARC beam 6, MDC-10/15/20 with the paper's COCO rows;
    beside them ARC greedy and the sets at matched length), each with its mean length in words and BLEU's
    brevity penalty."""
    paper = {p["method"]: p for p in paper_table(paper_dir, "table3_captioning")}
    per_method = defaultdict(list)
    reference_words = []
    for r in runs:
        if r["notebook"] == "captioning" and "table3" in r["artifacts"]:
            reference_words.append(r["record"]["results"]["dataset"].get("reference_words"))
            for row in table3_rows(r["record"]["results"], "coco"):
                per_method[row.pop("method")].append(row)
    rows = []
    for method, vals in per_method.items():
        row = {"method": method, "seeds": str(len(vals)), "words": cell([v.get("words") for v in vals], scale=1.0),
               "BP (%)": cell([v.get("bp") for v in vals], scale=1.0)}
        for c in ("coco_bleu4", "coco_meteor", "coco_cider", "coco_spice", "coco_rougeL", "coco_llm_judge"):
            row[c.removeprefix("coco_")] = cell([v.get(c) for v in vals], scale=1.0)
            ref = paper.get(method)
            row[f"{c.removeprefix('coco_')} (paper COCO)"] = paper_cell(ref[c]) if ref else "-"
        row["cider, another image"] = cell([v.get("coco_cider_another_image") for v in vals], scale=1.0)
        row["grounded words"] = cell([v.get("grounded_words") for v in vals], scale=1.0)
        row["repeated (%)"] = cell([v.get("repeated") for v in vals], scale=1.0)
        rows.append(row)
    return write_table(rows, os.path.join(out, "table3_captioning"),
                       "Table 3: captioning on the held-out references (pycocoevalcap, x100); paper: MSCOCO. "
                       "Beside them (not in the paper): a caption set's mean length in words (references: "
                       f"{cell(reference_words, scale=1.0)}) and BLEU's brevity penalty BP (below 100: shorter than "
                       "the closest references); ARC greedy; the sets at matched length: MDC at ARC's length and "
                       "at the references' median length per image, ARC's beam with [EOT] held back to the "
                       "references' length; the wrong-image control: a set's CIDEr-D with each caption scored against "
                       "another image's references (a captioner that reads its image scores far above it); distinct words of a caption found in its image's references, and the "
                       "share of its words that repeat an earlier one")


def table4(runs: list[dict], paper_dir: str, out: str) -> list[str]:
    """Table 4: MDC with and without the 1/t weight, per caption style (ImageNet analogue, and mean4)."""
    paper = {p["method"]: p for p in paper_table(paper_dir, "table4_time_weighting")}
    data = probe_rows(runs, "table4", lambda l: (l.get("method"), l.get("style")),
                      {"object": lambda t: t.get("imagenet1k"), "mean4": informative_mean})
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
    data = probe_rows(runs, "table5", lambda l: tuple(l.get("t_interval") or (0.5, 1.0)),
                      {"object": lambda t: t.get("imagenet1k"), "mean4": informative_mean})
    rows = []
    for interval in sorted(data):
        name = f"[{interval[0]:.1f}, {interval[1]:.1f}]"
        rows.append({"t_interval": name, "object": cell(data[interval]["object"]),
                     "mean4": cell(data[interval]["mean4"]), "paper (CC3M, IN-1k)": paper_cell(paper.get(name))})
    return write_table(rows, os.path.join(out, "table5_noise_schedule"),
                       "Table 5: linear probe top-1 (%) per noise schedule (alt captions)")


def tables6_8(runs: list[dict], paper_dir: str, out: str) -> list[str]:
    """Tables 6-8: the pretraining presets of this package beside the paper's hyperparameters."""
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
                       "Tables 6-8: pretraining hyperparameters (presets of mdc.base.optim) beside the paper's")


# ----------------------------------------------------------------------------- MC-Diffusion
def guidance(runs: list[dict], paper_dir: str, out: str) -> list[str]:
    """MC-Diffusion's figure and table: reference metrics and CLIPScore per guidance rule and strength (seed 0's
    run), with 95% bootstrap intervals over images and how far each run's captions moved from the unguided
    ones. One strength scales different log-ratios per rule (CFG: against the null condition; MCS: against a
    condition with ~10% of its tokens masked), so rules compare along their frontiers (the figure), at equal
    reference metric or distance moved, not at equal strength. Each row also gives the scale it ran at
    (records with a scale only: its strength; records without per-image outcomes: no intervals)."""
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
