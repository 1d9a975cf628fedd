"""Paper figures, one function per artifact. Figures are drawn on matplotlib's Agg canvas
(no pyplot, no display needed), saved as PNG and PDF side by side, and show inline in Jupyter."""
from __future__ import annotations

import io
import os
import textwrap
from typing import Mapping, Sequence

import numpy as np
from matplotlib.figure import Figure


class PaperFigure(Figure):
    """A matplotlib Figure that Jupyter displays as PNG without pyplot or an inline backend."""

    def _repr_png_(self) -> bytes:
        buffer = io.BytesIO()
        self.savefig(buffer, format="png", dpi=100, bbox_inches="tight")
        return buffer.getvalue()


def _save(fig, path: str | None) -> None:
    if path:
        base = os.path.splitext(path)[0]
        os.makedirs(os.path.dirname(os.path.abspath(base)), exist_ok=True)
        for ext in (".png", ".pdf"):
            fig.savefig(base + ext, dpi=150, bbox_inches="tight")


def plot_captions(images: Sequence, captions_by_model: Mapping[str, Sequence[str]],
                  references: Sequence[Sequence[str]] | None = None, path: str | None = None, width: int = 70):
    """Fig. 6: each image beside its captions, one line per model (``{"mdc-10": [caption per
    image], ..., "arc-beam6": [...]}``), optionally with its first reference ("GT").

    ``images``: PIL images, HxWx3 arrays or file paths. Saves ``path`` as .png and .pdf when
    given; returns the figure (a matplotlib Figure).
    """
    from PIL import Image

    from mdc.eval.captioning import row_label

    for name, captions in captions_by_model.items():
        if len(captions) != len(images):
            raise ValueError(f"captions_by_model[{name!r}] holds {len(captions)} captions for {len(images)} images")
    fig = PaperFigure(figsize=(10, 2.4 * len(images)))
    grid = fig.add_gridspec(len(images), 2, width_ratios=[1, 3.2], wspace=0.05)
    for i, image in enumerate(images):
        if isinstance(image, (str, os.PathLike)):
            image = Image.open(image).convert("RGB")
        ax = fig.add_subplot(grid[i, 0])
        ax.imshow(np.asarray(image))
        ax.axis("off")
        lines = [(row_label(name), captions[i]) for name, captions in captions_by_model.items()]
        if references is not None and references[i]:
            lines.append(("GT", references[i][0]))
        text = fig.add_subplot(grid[i, 1])
        text.axis("off")
        y = 1.0
        for label, caption in lines:
            wrapped = textwrap.wrap(caption, width) or [""]
            text.text(0.0, y, f"{label}:", va="top", ha="left", fontsize=9, weight="bold", transform=text.transAxes)
            text.text(0.2, y, "\n".join(wrapped), va="top", ha="left", fontsize=9, transform=text.transAxes)
            y -= 0.14 * len(wrapped) + 0.04
    _save(fig, path)
    return fig


def plot_loss_curve(metrics_path: str, path: str | None = None, title: str = "") -> Figure:
    """Training loss per step from a run's ``metrics.jsonl``."""
    import json

    with open(metrics_path) as f:
        rows = [json.loads(line) for line in f if line.strip()]
    fig = PaperFigure(figsize=(5, 3))
    ax = fig.add_subplot()
    ax.plot([r["step"] for r in rows], [r["loss"] for r in rows])
    ax.set(xlabel="step", ylabel="loss", title=title)
    fig.tight_layout()
    _save(fig, path)
    return fig
