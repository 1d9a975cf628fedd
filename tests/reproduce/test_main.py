"""python -m reproduce (reproduce/__main__.py): no build overwrites a richer figures/ unless asked; without
--seeds a build takes the seeds the ledger holds; --seed-plan runs as many seeds per run as its plan says."""
import csv
import json
import os
import shutil

import pytest

from reproduce.__main__ import main

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
RECORDS = os.path.join(ROOT, "reproduce", "records", "mini")


def _seeds(figures) -> set[str]:
    """The seeds of the claims table's rows that ran (claim 8's read "not run" on records without per-image CIDEr)."""
    with open(os.path.join(figures, "claims.csv")) as f:
        return {row["seeds"] for row in csv.DictReader(f) if not row["verdict"].startswith("not run")}


def _committed_figures(tmp_path):
    """A figures folder holding the committed claims table; returns it and the most seeds a row of it has
    (the seed plan gave every row at least three, some more)."""
    figures = tmp_path / "figures"
    figures.mkdir()
    for ext in ("md", "csv", "tex"):
        shutil.copy(os.path.join(ROOT, "figures", f"claims.{ext}"), figures)
    seeds = {int(n) for n in _seeds(figures)}
    assert min(seeds) >= 3
    return figures, max(seeds)


def _build(tmp_path, figures, *extra):
    return main(["--profile", "mini", "--from-records", "--records", RECORDS, "--only", "claims",
                 "--figures", str(figures), "--out", str(tmp_path / "runs"), *extra])


def test_a_one_seed_build_leaves_a_richer_figures_folder_alone(tmp_path, capsys):
    figures, most = _committed_figures(tmp_path)
    before = (figures / "claims.csv").read_bytes()
    assert _build(tmp_path, figures, "--seeds", "1") == 0
    assert (figures / "claims.csv").read_bytes() == before
    elsewhere = tmp_path / "runs" / "mini" / "figures"
    assert _seeds(elsewhere) == {"1"}
    said = [line for line in capsys.readouterr().out.splitlines() if "--overwrite-figures" in line]
    assert len(said) == 1 and f"holds {most} seeds" in said[0] and str(elsewhere) in said[0]


def test_asked_explicitly_a_one_seed_build_overwrites(tmp_path):
    figures, _ = _committed_figures(tmp_path)
    assert _build(tmp_path, figures, "--seeds", "1", "--overwrite-figures") == 0
    assert _seeds(figures) == {"1"}


def test_without_seeds_a_build_takes_the_seeds_the_ledger_holds(tmp_path):
    figures, _ = _committed_figures(tmp_path)
    before = (figures / "claims.csv").read_bytes()
    assert _build(tmp_path, figures) == 0
    assert (figures / "claims.csv").read_bytes() == before  # the same seeds, the same table


def test_a_richer_build_writes_into_figures(tmp_path):
    figures = tmp_path / "figures"
    assert _build(tmp_path, figures, "--seeds", "1") == 0 and _seeds(figures) == {"1"}
    assert _build(tmp_path, figures, "--seeds", "3") == 0 and _seeds(figures) == {"3"}


def test_the_dry_run_of_a_seed_plan_shows_its_runs_and_run_hours(tmp_path, capsys):
    plan = tmp_path / "plan.json"
    plan.write_text(json.dumps({"default": 3, "seeds": {"mdc-alt": 6}}))  # the ledger holds five
    assert main(["--profile", "mini", "--seed-plan", str(plan), "--dry-run", "--records", RECORDS,
                 "--out", str(tmp_path / "runs")]) == 0
    out = capsys.readouterr().out
    would = [line.split()[2] for line in out.splitlines() if line.startswith("would run")]
    # the plan's extra seed runs; recorded seeds run only where the ledger's records no longer match their runs
    # (a notebook's code or an instrument changed after the ledger was written) or a run that executes reads
    # their output, each with the line why; never a sixth seed of another run
    assert [name for name in would if name.endswith("-s5")] == ["pretrain/mdc-alt-s5", "probe/mdc-alt-s5"]
    again = [name for name in would if name.startswith("pretrain/") and not name.endswith("-s5")]
    assert all(f"{name}: recorded, but " in out or f"{name}: recorded under another key" in out for name in again)
    assert would[-1] == "figures"
    assert "seed plan" in out and "6 seeds for mdc-alt, 3 elsewhere" in out
    assert "run-hours left" in out and "in this plan" in out


def test_a_plan_and_seeds_together_or_a_bad_plan_are_one_line_errors(tmp_path, capsys):
    plan = tmp_path / "plan.json"
    plan.write_text(json.dumps({"default": 3, "seeds": {"mdc-alt": 0}}))
    for argv, code in ((["--seeds", "3", "--seed-plan", str(plan)], 2), (["--seed-plan", str(plan)], 1)):
        with pytest.raises(SystemExit) as exit_:
            main(["--profile", "mini", "--dry-run", "--out", str(tmp_path / "runs"), *argv])
        err = capsys.readouterr().err.strip().splitlines()
        assert exit_.value.code == code and len(err) == 1 and err[0].startswith("error: "), err
    assert "'mdc-alt'" in err[0] and str(plan) in err[0]
