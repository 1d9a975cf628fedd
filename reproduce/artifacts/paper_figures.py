"""The paper's figures rebuilt from the run records (Figs. 3-6): one builder per artifact, taking the runs
(:func:`reproduce.running.ledger.for_build`), the paper's numbers folder and the output folder and returning the
files it wrote (PNG and PDF), and the drawing of each figure that only the reproduction draws. Fig. 6
draws with :func:`mdc.plots.plot_captions`, which users call on their own captions too."""
from __future__ import annotations

import os
from collections import defaultdict
from typing import Mapping, Sequence

import numpy as np
from matplotlib.figure import Figure

from mdc.eval.captioning import example_images
from mdc.plots import PaperFigure, plot_captions, save_figure
from reproduce.artifacts.probe_records import informative_mean, probe_rows, probe_top1


# ----------------------------------------------------------------------------- drawing
def _mean_std(values) -> tuple[float, float]:
    v = [100 * x for x in values if x is not None and np.isfinite(x)]
    return (float(np.mean(v)), float(np.std(v, ddof=1)) if len(v) > 1 else 0.0) if v else (np.nan, 0.0)


def plot_caption_lengths(distributions: Mapping[str, Mapping], path: str | None = None) -> Figure:
    """Fig. 3: tokenized caption lengths per dataset; ``{label: {"fraction": [...], "edges": [...], "mean"}}``."""
    fig = PaperFigure(figsize=(5.5, 3.2))
    ax = fig.add_subplot()
    for label, d in distributions.items():
        edges = np.asarray(d["edges"], dtype=float)
        ax.step(edges[:-1], 100 * np.asarray(d["fraction"]), where="post", label=f"{label} (mean {d['mean']:.1f})")
    ax.set(xlabel="caption length (CLIP BPE tokens)", ylabel="captions (%)")
    ax.legend(frameon=False)
    fig.tight_layout()
    save_figure(fig, path)
    return fig


def plot_mask_ratios(bert: Mapping[float, Mapping[str, Sequence]], mdc: Mapping[str, Sequence] | None,
                     path: str | None = None, metric: str = "object") -> Figure:
    """Fig. 4: probe top-1 (%) of image-conditioned BERT per fixed masking ratio; MDC as a band."""
    fig = PaperFigure(figsize=(5, 3.2))
    ax = fig.add_subplot()
    ratios = sorted(bert)
    stats = [_mean_std(bert[r][metric]) for r in ratios]
    ax.errorbar([100 * r for r in ratios], [m for m, _ in stats], yerr=[s for _, s in stats], marker="o",
                capsize=3, label="BERT (fixed ratio)")
    if mdc:
        m, s = _mean_std(mdc[metric])
        ax.axhline(m, color="C1", label="MDC, t ~ U[0.5, 1]")
        ax.axhspan(m - s, m + s, color="C1", alpha=0.2)
    ax.set(xlabel="masking ratio (%)", ylabel=f"linear probe top-1 (%), {metric}")
    ax.legend(frameon=False)
    fig.tight_layout()
    save_figure(fig, path)
    return fig


def plot_data_scaling(points: Mapping[int, Mapping[str, Sequence]], path: str | None = None,
                      metric: str = "object") -> Figure:
    """Fig. 5: probe top-1 (%) against the number of pretraining pairs; ``{pairs: {metric: [per seed]}}``."""
    fig = PaperFigure(figsize=(5, 3.2))
    ax = fig.add_subplot()
    xs = sorted(points)
    stats = [_mean_std(points[x][metric]) for x in xs]
    ax.errorbar(xs, [m for m, _ in stats], yerr=[s for _, s in stats], marker="o", capsize=3)
    ax.set(xlabel="pretraining image-caption pairs", ylabel=f"linear probe top-1 (%), {metric}")
    if xs and min(xs) > 0:
        ax.set_xscale("log")
    fig.tight_layout()
    save_figure(fig, path)
    return fig


# ----------------------------------------------------------------------------- builders
def fig3(runs: list[dict], paper_dir: str, out: str) -> list[str]:
    """Fig. 3: caption length distributions of the pretraining sets (data runs)."""
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
    data = probe_rows(runs, "fig4", lambda l: (l.get("method"), l.get("mask_ratio")),
                      {"object": lambda t: t.get("imagenet1k"), "mean4": informative_mean})
    bert = {k[1]: v for k, v in data.items() if k[0] == "BERT"}
    mdc_ = next((v for k, v in data.items() if k[0] == "MDC"), None)
    base = os.path.join(out, "fig4_mask_ratios")
    plot_mask_ratios(bert, mdc_, base)
    return [base + ".png", base + ".pdf"]


def fig5(runs: list[dict], paper_dir: str, out: str) -> list[str]:
    """Fig. 5: probe top-1 against the number of pretraining pairs (MDC, descriptive captions)."""
    points = defaultdict(lambda: defaultdict(list))
    for r in runs:
        if r["notebook"] == "linear_probe" and "fig5" in r["artifacts"] and r["labels"].get("method") == "MDC":
            pairs = r["labels"].get("pairs")
            top = probe_top1(r["record"])
            points[pairs]["object"].append(top.get("imagenet1k"))
            points[pairs]["mean4"].append(informative_mean(top))
    base = os.path.join(out, "fig5_data_scaling")
    plot_data_scaling({k: dict(v) for k, v in points.items()}, base)
    return [base + ".png", base + ".pdf"]


def fig6(runs: list[dict], paper_dir: str, out: str, k: int = 3) -> list[str]:
    """Fig. 6: qualitative captions (MDC-10/15/20, ARC) of the first captioning run's examples."""
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
