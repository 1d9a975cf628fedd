"""Figures of intervals and verdicts, drawn from rows the builders computed: the claims' forest plot
(:func:`plot_forest`, for :mod:`reproduce.claims.claim_rows`) and Table 2's positive controls
(:func:`plot_controls`, for :mod:`reproduce.artifacts.compositionality_table`). They live here, below both
callers, because the artifact builders never import the claims."""
from __future__ import annotations

from typing import Mapping, Sequence

import numpy as np
from matplotlib.lines import Line2D
from matplotlib.patches import Patch

from mdc.plots import PaperFigure, save_figure

# A verdict's colour, by how it begins (the first match)
VERDICT_COLOURS = (("reproduced", "tab:green"), ("contradicted", "tab:red"), ("no effect", "tab:blue"),
                   ("not resolved", "tab:gray"), ("not run", "lightgray"))


def verdict_colour(verdict: str) -> str:
    return next((c for prefix, c in VERDICT_COLOURS if verdict.startswith(prefix)), "black")


def _forest_positions(rows: Sequence[Mapping]) -> tuple[list[float], list[tuple[float, str]]]:
    """Each row's y (top to bottom) and each claim's heading (y, claim), a heading above its rows."""
    ys, headings, y, last = [], [], 0.0, None
    for r in rows:
        if r["group"] != last:
            headings.append((y, r["group"]))
            y, last = y - 1.0, r["group"]
        ys.append(y)
        y -= 1.0
    return ys, headings


def _forest_axis(ax, rows: Sequence[Mapping], unit: str) -> None:
    """One axis of the forest plot: per row its margin band, 95% interval (thin), 90% interval where TOST
    decides (thick), mean coloured by its verdict, the verdict named at the right; claims as bold headings."""
    ys, headings = _forest_positions(rows)
    for y, r in zip(ys, rows):
        ax.fill_betweenx([y - 0.35, y + 0.35], -r["margin"], r["margin"], color="0.88", lw=0)
        colour = verdict_colour(r["verdict"])
        if r.get("mean") is not None:
            ax.plot([r["low"], r["high"]], [y, y], color=colour, lw=1.2)
            if r["tost"]:
                ax.plot([r["tost_low"], r["tost_high"]], [y, y], color=colour, lw=4, alpha=0.6, solid_capstyle="butt")
            ax.plot([r["mean"]], [y], "o", color=colour, markersize=5)
        ax.text(1.02, y, r["verdict"], transform=ax.get_yaxis_transform(), va="center", ha="left", fontsize=7,
                color=colour)
    ax.axvline(0, color="k", lw=0.6)
    labels = [(y, r["label"], "normal") for y, r in zip(ys, rows)] + [(y, g, "bold") for y, g in headings]
    ax.set_yticks([y for y, _, _ in labels], [t for _, t, _ in labels], fontsize=7)
    for tick, (_, _, weight) in zip(ax.get_yticklabels(), labels):
        tick.set_weight(weight)
    ax.tick_params(axis="y", length=0)
    ax.set_ylim(min(ys) - 0.7, max(y for y, _ in headings) + 0.7)
    ax.set_xlabel(unit, fontsize=8)


def plot_forest(rows: Sequence[Mapping], path: str | None = None) -> PaperFigure:
    """The claims as a forest plot: ``rows`` ({group, label, unit, mean, low, high, tost, tost_low, tost_high,
    margin, verdict}; mean None: not run), one axis per unit (mean4 points, CIDEr-D points) in the rows'
    order, each row's mean with its 95% interval (thin) and, where TOST decides (``tost``), its 90% one
    (thick), its margin a grey band around 0 and its verdict as the colour and the label at the right."""
    units = list(dict.fromkeys(r["unit"] for r in rows))
    sizes = [sum(r["unit"] == u for r in rows) + len({r["group"] for r in rows if r["unit"] == u}) for u in units]
    fig = PaperFigure(figsize=(12, 0.22 * sum(sizes) + 1.1 * len(units) + 0.3))
    grid = fig.add_gridspec(len(units), 1, height_ratios=[s + 3 for s in sizes])
    for i, unit in enumerate(units):
        ax = fig.add_subplot(grid[i])
        _forest_axis(ax, [r for r in rows if r["unit"] == unit], unit)
    handles = [Line2D([], [], color="0.3", lw=1.2), Line2D([], [], color="0.3", lw=4, alpha=0.6), Patch(color="0.88")]
    fig.legend(handles, ["95% interval", "90% interval (where TOST decides)", "margin ±m around 0"],
               loc="upper center", ncol=3, frameon=False, fontsize=7)
    fig.tight_layout(rect=(0, 0, 1, 1 - 0.35 / fig.get_figheight()))
    save_figure(fig, path)
    return fig


def plot_controls(panels: Sequence[Mapping], path: str | None = None) -> PaperFigure:
    """Table 2's positive controls: per column (``panels``: {column, items, margin, status, scorers: {scorer:
    {"own" | "shuffled" | "blind": (accuracy, low, high) or None}}}, accuracies in %) each scorer's accuracy
    with its own image, another item's image and no image side by side with their 95% intervals, the level
    the own-image bar must reach (shuffled + margin) marked; a column whose control did not pass (``status``:
    :func:`mdc.eval.positive_controls.control_status`) is greyed."""
    kinds = (("own", "own image", "tab:blue"), ("shuffled", "another item's image", "tab:orange"),
             ("blind", "no image", "tab:gray"))
    cols = min(3, len(panels))
    rows = -(-len(panels) // cols)
    fig = PaperFigure(figsize=(3.6 * cols, 2.8 * rows + 0.5))
    for i, p in enumerate(panels):
        ax = fig.add_subplot(rows, cols, i + 1)
        scorers, passed = list(p["scorers"]), p["status"] == "passed"
        for k, (kind, name, colour) in enumerate(kinds):
            for j, s in enumerate(scorers):
                got = p["scorers"][s].get(kind)
                if got is None or not np.isfinite(got[0]):
                    continue
                a, lo, hi = got
                ax.bar(j + (k - 1) * 0.27, a, 0.25, color=colour, alpha=1.0 if passed else 0.3)
                ax.errorbar([j + (k - 1) * 0.27], [a], yerr=[[a - lo], [hi - a]], fmt="none", ecolor="k", lw=0.8)
        for j, s in enumerate(scorers):
            shuffled = p["scorers"][s].get("shuffled")
            if shuffled is not None and np.isfinite(shuffled[0]):
                ax.plot([j - 0.4, j - 0.14], [shuffled[0] + p["margin"]] * 2, color="k", lw=1.5)
        ax.set_xticks(range(len(scorers)), scorers, fontsize=7)
        ax.set_ylim(0, 115)
        ax.set_ylabel("accuracy (%)", fontsize=8)
        ax.set_title(f"{p['column']} ({p['items']} items): {p['status'].replace('passed', 'control passed')}",
                     fontsize=8, color="k" if passed else "0.45")
        if not passed:
            ax.set_facecolor("0.95")
    handles = [Patch(color=colour) for _, _, colour in kinds] + [Line2D([], [], color="k", lw=1.5)]
    names = [name for _, name, _ in kinds] + ["what the own image must reach: another item's + margin"]
    fig.legend(handles, names, loc="upper center", ncol=4, frameon=False, fontsize=8)
    fig.tight_layout(rect=(0, 0, 1, 1 - 0.4 / fig.get_figheight()))
    save_figure(fig, path)
    return fig
