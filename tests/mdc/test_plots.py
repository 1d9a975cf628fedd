"""Saved figures are a function of their data: building figures/ twice from the same records writes the
same bytes, so a rebuild leaves the committed files untouched."""
import time

from reproduce.artifacts.paper_figures import plot_caption_lengths


def test_a_figure_saved_twice_is_the_same_file(tmp_path):
    lengths = {"alt": {"edges": [5, 10, 15, 20], "fraction": [0.2, 0.5, 0.3], "mean": 11.0}}
    first, second = tmp_path / "a" / "fig", tmp_path / "b" / "fig"
    plot_caption_lengths(lengths, path=str(first))
    time.sleep(1.1)  # a timestamp in the file would differ by now
    plot_caption_lengths(lengths, path=str(second))
    for ext in (".png", ".pdf"):
        assert (first.parent / f"fig{ext}").read_bytes() == (second.parent / f"fig{ext}").read_bytes(), ext
