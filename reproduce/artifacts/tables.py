"""How every table of the reproduction is written: the paper's numbers read from its CSV files
(``reproduce/paper/*.csv``), a cell over seeds ("mean ± std", sample std; "mean" alone for one seed),
and one table as Markdown (with notes), CSV and LaTeX."""
from __future__ import annotations

import csv
import os
from typing import Mapping, Sequence

import numpy as np


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
