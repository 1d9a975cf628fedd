"""python -m benchmarks [NAME ...] [--quick] [--only NAME ...] [--checkpoint DIR] [--threads N] [--out DIR]

Runs the sections in one process, prints a table per section as it completes and writes
OUT/benchmarks.md and OUT/benchmarks.json (default OUT: figures). Every ratio comes from
contestants timed side by side in this process (interleaved rounds, medians), so it holds on
the machine at hand; absolute figures describe that machine and its load at the time.
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import sys
import time

import torch

from benchmarks import data, flops, gpu, sampling, scoring, train_step
from benchmarks.common import Context, Section

SECTIONS = {"train": train_step.run, "flops": flops.run, "sampling": sampling.run, "scoring": scoring.run,
            "data": data.run, "gpu": gpu.run}


def _cell(value) -> str:
    if isinstance(value, float):
        return f"{value:,.4g}" if abs(value) < 1000 else f"{value:,.0f}"
    if isinstance(value, int):
        return f"{value:,}"
    return "-" if value is None else str(value)


def table(sec: Section) -> list[list[str]]:
    rows = [["measurement", "value", "unit", "target", "note"]]
    for r in sec.rows:
        target = f"{r.target} ({'met' if r.met else 'NOT met'})" if r.target else ""
        rows.append([r.name, _cell(r.value), r.unit, target, r.note])
    return rows


def text_table(sec: Section) -> str:
    rows = table(sec)
    widths = [max(len(row[i]) for row in rows) for i in range(4)]
    lines = [f"== {sec.title} ({sec.seconds:.0f} s)"]
    for row in rows:
        lines.append("  ".join(cell.ljust(w) if i != 1 else cell.rjust(w) for i, (cell, w) in
                               enumerate(zip(row[:4], widths))) + ("  " + row[4] if row[4] else ""))
    return "\n".join(lines + [f"   {note}" for note in sec.notes])


def markdown(sections: list[Section], meta: dict) -> str:
    quick = " QUICK smoke run: the figures are not meaningful." if meta["quick"] else ""
    out = ["# Benchmarks", "", f"`{meta['command']}` on {meta['date']}: {meta['machine']}; torch {meta['torch']}, "
           f"torch threads: {meta['threads']}; load average (1 min) {meta['load']['start']} at the start, "
           f"{meta['load']['end']} at the end, on {os.cpu_count()} cores.{quick}", ""]
    for sec in sections:
        rows = table(sec)
        out += [f"## {sec.title}", "", "| " + " | ".join(rows[0]) + " |", "|" + "---|" * len(rows[0])]
        out += ["| " + " | ".join(cell.replace("|", "\\|") for cell in row) + " |" for row in rows[1:]]
        out += [""] + [f"{note}" for note in sec.notes] + [""]
    return "\n".join(out)


def _load() -> float | None:
    """The machine's 1-minute load average (runnable processes, this one included), where the OS has one."""
    return round(os.getloadavg()[0], 2) if hasattr(os, "getloadavg") else None


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(prog="python -m benchmarks", description=__doc__.split("\n\n")[1],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("sections", nargs="*", metavar="NAME", help="the sections to run (as --only), e.g. gpu")
    p.add_argument("--quick", action="store_true", help="smoke run: tiny sizes, one round each (figures meaningless)")
    p.add_argument("--only", nargs="+", choices=list(SECTIONS), metavar="NAME",
                   help=f"run only these sections: {', '.join(SECTIONS)}")
    p.add_argument("--checkpoint", help="an MDC checkpoint folder for the scoring section (default: train one here)")
    p.add_argument("--threads", type=int, help="torch intra-op threads (default: torch's choice)")
    p.add_argument("--out", default="figures", help="folder for benchmarks.md and benchmarks.json")
    args = p.parse_args(argv)
    unknown = [n for n in args.sections if n not in SECTIONS]
    if unknown:
        p.error(f"unknown section {unknown[0]!r}; choose from {', '.join(SECTIONS)}")
    args.only = list(dict.fromkeys((args.only or []) + args.sections)) or None
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.checkpoint and "scoring" in (args.only or SECTIONS):
        scoring.load_checkpoint(args.checkpoint)  # a bad path fails now, not after the sections before it
    ctx = Context(quick=args.quick, checkpoint=args.checkpoint)
    meta = {"command": " ".join(["python -m benchmarks", *(argv if argv is not None else sys.argv[1:])]),
            "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
            "machine": f"{platform.machine()}, {os.cpu_count()} cores"
                       + (f", {torch.cuda.get_device_name()}" if torch.cuda.is_available() else ""),
            "torch": torch.__version__, "threads": torch.get_num_threads(), "quick": args.quick,
            "load": {"start": _load()}}
    sections = []
    for name in args.only or SECTIONS:
        start = time.perf_counter()
        sec = SECTIONS[name](ctx)
        sec.seconds = time.perf_counter() - start
        sections.append(sec)
        print(text_table(sec) + "\n", flush=True)
    meta["load"]["end"] = _load()
    os.makedirs(args.out, exist_ok=True)
    results = {"meta": meta, "sections": {s.name: s.as_dict() for s in sections}}
    with open(os.path.join(args.out, "benchmarks.json"), "w") as f:
        json.dump(results, f, indent=1)
    with open(os.path.join(args.out, "benchmarks.md"), "w") as f:
        f.write(markdown(sections, meta))
    print(f"wrote {os.path.join(args.out, 'benchmarks.md')} and benchmarks.json")
    return results


if __name__ == "__main__":
    main()
