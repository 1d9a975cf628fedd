"""How many seeds each run of a profile gets, and the rule that no build overwrites a richer ``figures/``.

A seed plan is a JSON file ``{"default": 3, "seeds": {"mdc-alt": 6, ...}}``: a pretraining run named in
``seeds`` (by its name without ``pretrain/`` and ``-s<seed>``) runs seeds 0 .. n-1 and its linear probe
follows it; every other run (the other pretraining runs, Table 2, captioning, guidance) runs seeds
0 .. default-1. ``python -m reproduce.power --write-plan FILE`` writes one from the power table
(:mod:`reproduce.power`); ``python -m reproduce --seed-plan FILE`` runs it. Without ``--seeds`` or
``--seed-plan`` the runner takes the plan the ledger holds (:func:`from_ledger`): as many seeds of each
pretraining run as it has records for, so a build on a fresh clone rebuilds what was committed.

A run's key does not depend on the plan (a seed's runs are the same runs however many seeds there are),
so a plan that adds seeds reuses every record of the seeds it keeps.

No build overwrites a richer result: :func:`richer_figures` compares the seeds per claim row of the
build with those of the target folder's ``claims.csv``; where the folder holds more for some row, the
runner builds into ``OUT/<profile>/figures`` instead and says so in one line, unless
``--overwrite-figures`` asks for the folder.
"""
from __future__ import annotations

import csv
import json
import os
import re
from dataclasses import dataclass

from reproduce.running import ledger
from reproduce.claims.caption_claims import CAPTION_CLAIMS
from reproduce.claims.claim_rows import CLAIMS
from reproduce.graph import Run


@dataclass(frozen=True)
class SeedPlan:
    """Seeds per pretraining run (``seeds``: (name, n) pairs) and for every other run (``default``)."""

    default: int = 3
    seeds: tuple[tuple[str, int], ...] = ()

    def __post_init__(self):
        for name, n in (("default", self.default), *self.seeds):
            if not isinstance(n, int) or n < 1:
                raise ValueError(f"seed plan: {name!r} must be a whole number of seeds >= 1, not {n!r}")

    def of(self, run: str) -> int:
        """Seeds of pretraining run ``run`` (its name without ``pretrain/`` and ``-s<seed>``)."""
        return dict(self.seeds).get(run, self.default)

    @property
    def most(self) -> int:
        return max([self.default, *(n for _, n in self.seeds)])

    def describe(self) -> str:
        """"6 seeds for mdc-alt, arc-descriptive, 3 elsewhere" (runs of the same count together)."""
        by_count: dict[int, list[str]] = {}
        for name, n in self.seeds:
            if n != self.default:
                by_count.setdefault(n, []).append(name)
        parts = [f"{n} seeds for {', '.join(names)}" for n, names in sorted(by_count.items(), reverse=True)]
        return ", ".join(parts + [f"{self.default} {'elsewhere' if parts else 'for every run'}"])

    def to_json(self) -> dict:
        return {"default": self.default, "seeds": dict(self.seeds)}


def read(path: str) -> SeedPlan:
    """The plan in JSON file ``path``; a bad file or field is a ValueError naming it."""
    try:
        with open(path) as f:
            data = json.load(f)
    except (OSError, json.JSONDecodeError) as exn:
        raise ValueError(f"seed plan {path}: {exn}") from None
    if not isinstance(data, dict) or not isinstance(data.get("seeds", {}), dict):
        raise ValueError(f"seed plan {path}: want {{\"default\": N, \"seeds\": {{run: N}}}}, got {data!r:.80}")
    unknown = set(data) - {"default", "seeds", "about"}
    if unknown:
        raise ValueError(f"seed plan {path}: unknown field {sorted(unknown)[0]!r}")
    try:
        return SeedPlan(data.get("default", 3), tuple(sorted(data.get("seeds", {}).items())))
    except ValueError as exn:
        raise ValueError(f"{path}: {exn}") from None


def write(path: str, plan: SeedPlan, about: str = "") -> None:
    with open(path, "w") as f:
        json.dump({**({"about": about} if about else {}), **plan.to_json()}, f, indent=1)
        f.write("\n")


def _seed(run: Run) -> int | None:
    return run.labels.get("seed") if run.notebook != "data" else None


def _pretrain_name(name: str) -> str:
    return re.sub(r"-s\d+$", "", name.split("/", 1)[1])


def apply(runs: list[Run], plan: SeedPlan) -> list[Run]:
    """``runs`` (a profile's runs for at least ``plan.most`` seeds) as the plan keeps them (module docstring)."""
    kept: set[str] = set()
    out = []
    for r in runs:  # the registry lists a run after its dependencies
        seed = _seed(r)
        if r.notebook == "pretrain":
            keep = seed < plan.of(_pretrain_name(r.name))
        elif r.notebook == "linear_probe":
            keep = all(d in kept for d in r.deps)
        else:
            keep = seed is None or (seed < plan.default and all(d in kept for d in r.deps))
        if keep:
            kept.add(r.name)
            out.append(r)
    return out


def from_ledger(records: str, runs: list[Run]) -> SeedPlan:
    """The plan the ledger ``records`` holds: per pretraining run of ``runs`` (any seeds), as many seeds
    0 .. n-1 as it has records for without a gap (at least 1); ``default`` the fewest of them."""
    counts = {}
    for name in dict.fromkeys(_pretrain_name(r.name) for r in runs if r.notebook == "pretrain"):
        n = 0
        while ledger.read(records, f"pretrain/{name}-s{n}") is not None:
            n += 1
        counts[name] = n
    default = max(1, min(counts.values(), default=1))
    return SeedPlan(default, tuple(sorted((k, n) for k, n in counts.items() if n > default)))


def claim_seeds(runs: list) -> dict[str, int]:
    """{claim row: seeds with a probe run on both sides} among ``runs`` (Runs or the builders' dicts); claim 8's
    rows: the seeds of Table 3's captioning runs (both sides are one run's caption sets)."""
    def field(r, name):
        return getattr(r, name) if isinstance(r, Run) else r[name]

    labels = [field(r, "labels") for r in runs if field(r, "notebook") == "linear_probe"]

    def seeds(want):
        return {lab.get("seed", 0) for lab in labels if all(lab.get(k) == v for k, v in want.items())}

    captioned = len({field(r, "labels").get("seed", 0) for r in runs
                     if field(r, "notebook") == "captioning" and "table3" in field(r, "artifacts")})
    return {c.what: len(seeds(c.a) & seeds(c.b)) for c in CLAIMS} | {c.what: captioned for c in CAPTION_CLAIMS}


def richer_figures(figures: str, runs: list[Run]) -> str | None:
    """Why a build of ``runs`` into ``figures`` would lose seeds (its ``claims.csv`` holds more for some
    claim row than ``runs`` give), or None."""
    path = os.path.join(figures, "claims.csv")
    if not os.path.isfile(path):
        return None
    with open(path, newline="") as f:
        held = {row["difference (mean4, points)"]: int(row["seeds"]) for row in csv.DictReader(f)
                if row.get("seeds", "").isdigit()}
    build = claim_seeds(runs)
    fewer = [w for w, n in held.items() if build.get(w, 0) < n]
    if not fewer:
        return None
    return (f"{figures} holds {max(held[w] for w in fewer)} seeds of {len(fewer)} claim row(s) "
            f"({fewer[0]}, ...), this build {min(build.get(w, 0) for w in fewer)}")
