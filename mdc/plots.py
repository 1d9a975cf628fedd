"""The figures a user draws, one function per figure: captions beside their images, a training run's
loss, MC-Diffusion's guidance trade-off, the sampler's unmasking path and the ELBO's spread. Figures are
drawn on matplotlib's Agg canvas (no pyplot, no display needed), saved as PNG and PDF side by side, and
show inline in Jupyter. The paper's figures drawn only from run records live beside their builders
(``reproduce/artifacts/paper_figures.py``)."""
from __future__ import annotations

import io
import os
import textwrap
from typing import Mapping, Sequence

import numpy as np
from matplotlib import colormaps
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.ticker import FormatStrFormatter, NullFormatter, NullLocator
from PIL import Image

from mdc.base.checkpoint import read_metrics
from mdc.eval.captioning import row_label
from mdc.eval.guidance_sweeps import run_intervals
from mdc.mc_diffusion.guidance import RULES, strength_of


class PaperFigure(Figure):
    """A matplotlib Figure that Jupyter displays as PNG without pyplot or an inline backend."""

    def _repr_png_(self) -> bytes:
        buffer = io.BytesIO()
        self.savefig(buffer, format="png", dpi=100, bbox_inches="tight")
        return buffer.getvalue()


def save_figure(fig, path: str | None) -> None:
    """Save ``fig`` as ``path``.png and ``path``.pdf (any extension of ``path`` replaced); nothing without a path."""
    if path:
        base = os.path.splitext(path)[0]
        os.makedirs(os.path.dirname(os.path.abspath(base)), exist_ok=True)
        for ext, stamp in ((".png", {}), (".pdf", {"CreationDate": None})):  # no date: same data, same bytes
            fig.savefig(base + ext, dpi=150, bbox_inches="tight", metadata=stamp)


def plot_captions(images: Sequence, captions_by_model: Mapping[str, Sequence[str]],
                  references: Sequence[Sequence[str]] | None = None, path: str | None = None, width: int = 70):
    """Fig. 6: each image beside its captions, one line per model (``{"mdc-10": [caption per
    image], ..., "arc-beam6": [...]}``), optionally with its first reference ("GT"). Each panel is as
    tall as its image or its text, whichever is taller, the text measured as drawn (captions wrap at
    ``width`` characters), so no caption runs into the next panel's.

    ``images``: PIL images, HxWx3 arrays or file paths. Saves ``path`` as .png and .pdf when
    given; returns the figure (a matplotlib Figure).
    """
    for name, captions in captions_by_model.items():
        if len(captions) != len(images):
            raise ValueError(f"captions_by_model[{name!r}] holds {len(captions)} captions for {len(images)} images")
    fig_width, side, pad, gap = 10.0, 2.2, 0.1, 0.3  # inches: the figure, an image's side, margins, between panels
    fig = PaperFigure(figsize=(fig_width, 2.4 * len(images)))  # its height is set below, from the text
    renderer = FigureCanvasAgg(fig).get_renderer()
    panels = []
    for i in range(len(images)):
        lines = [(row_label(name), captions[i]) for name, captions in captions_by_model.items()]
        if references is not None and references[i]:
            lines.append(("GT", references[i][0]))
        panels.append(_caption_rows(fig, renderer, lines, width))
    label_width = max((w for rows in panels for _, _, _, w in rows), default=0.0)
    heights = [max(side, sum(h for _, _, h, _ in rows)) for rows in panels]
    total = 2 * pad + sum(heights) + gap * max(0, len(images) - 1)
    fig.set_size_inches(fig_width, total)
    top = total - pad
    for image, rows, height in zip(images, panels, heights):
        if isinstance(image, (str, os.PathLike)):
            image = Image.open(image).convert("RGB")
        ax = fig.add_axes((pad / fig_width, (top - side) / total, side / fig_width, side / total))
        ax.imshow(np.asarray(image))
        ax.axis("off")
        y = top
        for label, caption, h, _ in rows:
            label.set_position((side + 3 * pad, y))
            caption.set_position((side + 3 * pad + label_width + 1.5 * pad, y))
            y -= h
        top -= height + gap
    save_figure(fig, path)
    return fig


def _caption_rows(fig, renderer, lines, width: int) -> list[tuple]:
    """[(label text, caption text, row height, label width)] of one Fig. 6 panel, in inches as drawn; the
    texts are placed in inches from the figure's lower left corner (their positions set by the caller)."""
    rows = []
    for label, caption in lines:
        wrapped = "\n".join(textwrap.wrap(caption, width) or [""])
        texts = [fig.text(0, 0, s, va="top", ha="left", fontsize=9, transform=fig.dpi_scale_trans, **kw)
                 for s, kw in ((f"{label}:", {"weight": "bold"}), (wrapped, {}))]
        boxes = [t.get_window_extent(renderer) for t in texts]
        height = max(b.height for b in boxes) / fig.dpi + 0.09  # the row and the space under it
        rows.append((*texts, height, boxes[0].width / fig.dpi))
    return rows


def plot_loss_curve(metrics_path: str, path: str | None = None, title: str = "") -> Figure:
    """Training loss per step from a run's ``metrics.jsonl``."""
    rows = read_metrics(metrics_path)
    fig = PaperFigure(figsize=(5, 3))
    ax = fig.add_subplot()
    ax.plot([r["step"] for r in rows], [r["loss"] for r in rows])
    ax.set(xlabel="step", ylabel="loss", title=title)
    fig.tight_layout()
    save_figure(fig, path)
    return fig


def _interval_bars(ax, points, ci, xkey, scale, colour) -> None:
    """95% intervals of ``points`` [(x, y, label)] as error bars: x from ``ci[label][xkey]`` (x ``scale``),
    y from ``ci[label]["clipscore"]``; points without an interval get none."""
    for x, y, label in points:
        c = ci.get(label, {})
        xerr = [[x - scale * c[xkey][0]], [scale * c[xkey][1] - x]] if xkey in c else None
        yerr = [[y - c["clipscore"][0]], [c["clipscore"][1] - y]] if "clipscore" in c else None
        if xerr or yerr:
            ax.errorbar([x], [y], xerr=xerr, yerr=yerr, fmt="none", ecolor=colour, elinewidth=0.7, alpha=0.6)


LABEL_OFFSETS = ((3, 3), (3, -9), (-8, 3), (-8, -9), (6, -3), (-11, -3), (0, 6), (0, -13))  # points, in turn


def _place_labels(fig, labels) -> None:
    """Each point label at the first of :data:`LABEL_OFFSETS` where it stays inside its axes and overlaps no
    label placed before it; a label with no such place is left out (its line still shows the point)."""
    renderer = FigureCanvasAgg(fig).get_renderer()
    placed = []
    for label in labels:
        for offset in LABEL_OFFSETS:
            label.xyann = offset
            box = label.get_window_extent(renderer)
            inside = label.axes.bbox.padded(-1).contains(box.x0, box.y0) and \
                label.axes.bbox.padded(-1).contains(box.x1, box.y1)
            if inside and not any(box.overlaps(b) for b in placed):
                placed.append(box)
                break
        else:
            label.set_visible(False)


def plot_guidance_tradeoff(results: Mapping, path: str | None = None,
                           metrics: Sequence[str] = ("bleu4", "meteor", "cider")) -> Figure:
    """MC-Diffusion's guidance figure as trade-off frontiers: per reference metric (x, %), CLIPScore (y)
    over each rule's own strengths, one line per rule ("CFG", "MCS (as printed)", "MCS (mirrored)"),
    each starting from the unguided model (strength 0, a star), points labelled by strength. One
    strength scales different log-ratios per rule, so read the rules at equal x, not at equal labels.
    Where the runs carry them: 95% bootstrap intervals over images as error bars
    (:func:`mdc.eval.guidance_sweeps.run_intervals`), and a last panel of CLIPScore against how far
    the captions moved from the unguided ones (mean word edit distance, %). Without CLIPScore the y
    axis is the strength. ``results``: the ``results`` of a ``kind="guidance"`` results file; runs
    recorded with a scale only (earlier files) are placed at that scale's strength."""
    runs = results["runs"]
    clip = any(r.get("clipscore") is not None for r in runs)
    ci = run_intervals(results) if clip else {}
    panels = list(metrics) + (["word_edit"] if clip and any(r.get("word_edit") is not None for r in runs) else [])

    def strength(r):
        return r["strength"] if r.get("strength") is not None else strength_of(r["guidance"], r["scale"])

    fig, labels = PaperFigure(figsize=(3.8 * len(panels), 3.6)), []
    for i, metric in enumerate(panels):
        ax = fig.add_subplot(1, len(panels), i + 1)
        shown = [r for r in runs if r.get(metric) is not None and (r.get("clipscore") is not None or not clip)]
        base = [(100 * r[metric], r["clipscore"] if clip else 0.0, 0.0, r["label"]) for r in shown
                if r["guidance"] == "none"][:1]
        for (guidance, name), colour in zip(RULES.items(), ("C0", "C1", "C2")):
            pts = sorted(((100 * r[metric], r["clipscore"] if clip else strength(r), strength(r), r["label"])
                          for r in shown if r["guidance"] == guidance), key=lambda p: p[2])
            if pts:
                line = base + [p for p in pts if p[2] != 0 or not base]
                ax.plot([p[0] for p in line], [p[1] for p in line], "o-", color=colour, label=name)
                _interval_bars(ax, [(x, y, label) for x, y, _, label in pts], ci, metric, 100, colour)
                labels += [ax.annotate(f"{s:g}", (x, y), textcoords="offset points", xytext=(3, 3), fontsize=7,
                                       color=colour) for x, y, s, _ in pts]
        if clip and base:
            ax.plot([base[0][0]], [base[0][1]], "*", color="k", markersize=10, label="unguided")
            _interval_bars(ax, [(base[0][0], base[0][1], base[0][3])], ci, metric, 100, "k")
        name = {"bleu4": "BLEU-4 (%)", "meteor": "METEOR (%)", "cider": "CIDEr (%)",
                "word_edit": "word edits from the unguided captions (%)"}.get(metric, metric)
        ax.set(xlabel=name, ylabel="CLIPScore" if clip else "guidance strength (no CLIPScore)")
    handles, names = fig.axes[0].get_legend_handles_labels() if fig.axes else ([], [])
    fig.legend(handles, names, loc="upper center", ncol=len(names) + 1, frameon=False, fontsize=8,
               title="numbers beside the points: guidance strength", title_fontsize=7)  # above the panels, off the data
    fig.tight_layout(rect=(0, 0, 1, 0.88))
    _place_labels(fig, labels)
    save_figure(fig, path)
    return fig


def plot_unmasking(trace: Sequence[Mapping], tokenizer, row: int = 0, path: str | None = None) -> Figure:
    """Fig. 2(b) from a real run: the unmasking path of one caption, step by step.

    ``trace``: the records of ``mdc.generate(..., trace=trace)`` (:func:`mdc.unmasking.mdc_sample`).
    One line per step, one column per caption position: the colour is the confidence (max
    probability) of every still-masked position at that step, the token written is the one
    revealed there (its confidence beside it); revealed positions stay white below.
    """
    conf = np.stack([r["confidence"][row].numpy() for r in trace])[:, 1:-1]  # [steps, N'] caption positions
    revealed = np.stack([r["revealed"][row].numpy() for r in trace])[:, 1:-1]
    tokens = trace[-1]["tokens"][row, 1:-1].tolist()
    steps, n = conf.shape
    grid = np.where(conf >= 0, conf, np.nan)  # masked positions only
    fig = PaperFigure(figsize=(max(4.0, 0.75 * n + 1.5), 0.36 * steps + 1.2))
    ax = fig.add_subplot()
    im = ax.imshow(grid, cmap=colormaps["viridis"].with_extremes(bad="white"), vmin=0, vmax=1, aspect="auto")
    for s, i in zip(*np.nonzero(revealed)):
        word = tokenizer.decode([tokens[i]])
        ax.text(i, s, f"{word}\n{conf[s, i]:.2f}", ha="center", va="center", fontsize=7,
                color="white" if conf[s, i] < 0.6 else "black", weight="bold")
    ax.set(xlabel="caption position", ylabel="step", xticks=range(n), xticklabels=range(1, n + 1),
           yticks=range(steps), yticklabels=range(1, steps + 1))
    ax.set_title(tokenizer.decode(trace[-1]["tokens"][row]), fontsize=9)
    fig.colorbar(im, ax=ax, label="confidence of a masked position", fraction=0.03)
    fig.tight_layout()
    save_figure(fig, path)
    return fig


def plot_elbo_spread(spread: Mapping, path: str | None = None) -> Figure:
    """Spread of the Monte-Carlo ELBO (Eq. 8) against its sample count, from
    :func:`mdc.tutorial.elbo_spread`: left, one caption's estimate (i.i.d. vs stratified mask
    counts); right, the true-minus-false difference, also with paired noise; 1/sqrt(S) dotted."""
    sizes = np.asarray(spread["sizes"], dtype=float)
    fig = PaperFigure(figsize=(9, 3.4))
    for k, (what, title, modes) in enumerate((("caption", "ELBO of one caption", ("i.i.d.", "stratified")),
                                               ("difference", "true minus false ELBO", None))):
        ax = fig.add_subplot(1, 2, k + 1)
        for mode in modes or [m for m in spread if m != "sizes"]:
            ax.plot(sizes, spread[mode][what], "o-", label=mode)
        first = spread["i.i.d."][what][0]
        ax.plot(sizes, first * np.sqrt(sizes[0] / sizes), ":", color="gray", label="1/sqrt(S)")
        ax.set(xscale="log", yscale="log", xlabel="samples S", ylabel="std over seeds (nats)", title=title)
        ax.xaxis.set_minor_locator(NullLocator())
        ax.set_xticks(sizes, [f"{s:g}" for s in sizes])
        ax.yaxis.set_major_formatter(FormatStrFormatter("%g"))
        low, high = ax.get_ylim()  # within one decade the minor ticks need labels; over more they crowd
        ax.yaxis.set_minor_formatter(FormatStrFormatter("%g") if high / low < 10 else NullFormatter())
        ax.tick_params(axis="y", which="minor", labelsize=7)
        ax.legend(frameon=False, fontsize=8)
    fig.tight_layout()
    save_figure(fig, path)
    return fig
