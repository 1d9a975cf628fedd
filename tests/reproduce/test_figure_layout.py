"""Every figure builder's layout, read from matplotlib's own window extents after a draw: no two drawn texts
overlap, no text leaves the canvas, and no legend covers a plotted point (a line's vertex, a marker, an error
bar). The figures are drawn from the committed ledger (every builder, as ``--from-records`` draws them) and
from a small one written here (Fig. 6 with captions that wrap to several lines).
"""
import json
import os

import numpy as np
import pytest
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.collections import LineCollection, PathCollection
from matplotlib.figure import Figure
from matplotlib.text import Text

from conftest import write_records
from reproduce import registry

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
PAPER_DIR = os.path.join(ROOT, "reproduce", "paper")
COMMITTED = os.path.join(ROOT, "reproduce", "records", "mini")
FIGURES = ["fig3", "fig4", "fig5", "fig6", "guidance", "claims", "table2"]  # the artifacts that draw
SLACK = 1.0  # pixels two boxes may share (antialiasing) before they count as overlapping


@pytest.fixture
def drawn(monkeypatch):
    """{file stem: Figure} of every figure a builder saves while the fixture is active."""
    figures = {}
    save = Figure.savefig

    def savefig(self, fname, *args, **kwargs):
        figures[os.path.splitext(os.path.basename(str(fname)))[0]] = self
        return save(self, fname, *args, **kwargs)

    monkeypatch.setattr(Figure, "savefig", savefig)
    return figures


def _drawn_texts(fig) -> list[tuple[str, object]]:
    """[(text, window extent)] of every non-empty text the draw renders (ticks outside the view are not drawn)."""
    texts, draw = [], Text.draw

    def record(self, renderer):
        if self.get_visible() and self.get_text().strip():
            texts.append((self.get_text(), self.get_window_extent(renderer)))
        return draw(self, renderer)

    Text.draw = record
    try:
        FigureCanvasAgg(fig).draw()  # the figures are drawn without pyplot: their canvas draws nothing itself
    finally:
        Text.draw = draw
    return texts


def _overlap(a, b) -> bool:
    return (min(a.x1, b.x1) - max(a.x0, b.x0) > SLACK) and (min(a.y1, b.y1) - max(a.y0, b.y0) > SLACK)


def _plotted_points(ax) -> np.ndarray:
    """Display coordinates of what ``ax`` plots: lines' vertices, scatter markers, error bars (sampled)."""
    points = []
    for line in ax.get_lines():
        if line.get_visible():
            points.append(line.get_transform().transform(np.asarray(line.get_xydata(), dtype=float)))
    for coll in ax.collections:
        if isinstance(coll, PathCollection) and len(coll.get_offsets()):
            points.append(coll.get_offset_transform().transform(np.asarray(coll.get_offsets(), dtype=float)))
        elif isinstance(coll, LineCollection):
            for seg in coll.get_segments():
                seg = np.asarray(seg, dtype=float)
                if len(seg) >= 2:
                    along = np.linspace(0, 1, 9)[:, None]
                    points.append(coll.get_transform().transform(seg[0] + along * (seg[-1] - seg[0])))
    points = np.concatenate(points) if points else np.zeros((0, 2))
    return points[np.isfinite(points).all(axis=1)]


def layout_problems(fig) -> list[str]:
    """What collides in ``fig`` after a draw: overlapping texts, text off the canvas, a legend on plotted points."""
    texts = _drawn_texts(fig)
    canvas = fig.bbox
    problems = [f"{t!r} leaves the canvas ({box.x0:.0f}..{box.x1:.0f} x {box.y0:.0f}..{box.y1:.0f} of "
                f"{canvas.width:.0f} x {canvas.height:.0f})" for t, box in texts
                if box.x0 < -SLACK or box.y0 < -SLACK or box.x1 > canvas.x1 + SLACK or box.y1 > canvas.y1 + SLACK]
    problems += [f"{a!r} overlaps {b!r}" for i, (a, box_a) in enumerate(texts) for b, box_b in texts[i + 1:]
                 if _overlap(box_a, box_b)]
    renderer = fig.canvas.get_renderer()  # the Agg canvas of the draw
    legends = [(ax.get_legend(), [ax]) for ax in fig.axes] + [(legend, fig.axes) for legend in fig.legends]
    for legend, axes in legends:
        if legend is None or not legend.get_visible():
            continue
        box = legend.get_window_extent(renderer)
        for ax in axes:
            pts = _plotted_points(ax)
            inside = (pts[:, 0] > box.x0) & (pts[:, 0] < box.x1) & (pts[:, 1] > box.y0) & (pts[:, 1] < box.y1)
            if inside.any():
                problems.append(f"a legend covers {int(inside.sum())} plotted point(s) of the axes labelled "
                                f"{ax.get_xlabel()!r}")
    return problems


def _check(figures: dict) -> str:
    """Every problem of every figure in ``figures``, one line each ("" when none)."""
    return "\n".join(f"{name}: {p}" for name, fig in sorted(figures.items()) for p in layout_problems(fig))


def test_every_figure_built_from_the_committed_ledger_is_laid_out_without_collisions(tmp_path, drawn):
    files = registry.build_artifacts(COMMITTED, str(tmp_path), PAPER_DIR, FIGURES)
    drawn_names = {os.path.splitext(os.path.basename(f))[0] for fs in files.values() for f in fs if f.endswith(".png")}
    assert drawn_names <= set(drawn) and {"fig6_captions", "guidance_tradeoff"} <= drawn_names
    problems = _check(drawn)
    assert not problems, problems


def test_fig6_lays_out_captions_that_wrap_to_several_lines_without_collisions(tmp_path, drawn):
    """Fig. 6 from a small ledger whose captions and ground truths wrap to one, three and five lines."""
    with open(os.path.join(COMMITTED, "captioning", "alt-s0.json")) as f:
        examples = json.load(f)["results"]["results"]["examples"]
    words = "a small striped purple cross above a dotted green diamond on a noisy background".split()
    for k, e in enumerate(examples):
        e["captions"] = {name: " ".join(words * (1 + (k + j) % 3))[: 60 + 140 * k]
                         for j, name in enumerate(e["captions"])}
        e["references"] = [" ".join(words * (1 + 2 * k))]
    results = {"schema": 1, "kind": "captioning", "results": {"examples": examples}}
    records = write_records(tmp_path / "records", {"captioning/alt-s0": {
        "notebook": "captioning", "labels": {"style": "alt", "seed": 0}, "artifacts": ["fig6"], "results": results}})
    files = registry.build_artifacts(records, str(tmp_path / "figures"), PAPER_DIR, ["fig6"])
    assert files["fig6"] and "fig6_captions" in drawn
    problems = _check(drawn)
    assert not problems, problems
