"""Claim 8's rows: paired per-image CIDEr-D differences over seeds, at matched length, with the claims' verdicts."""
import numpy as np
import pytest

from conftest import write_records
from reproduce import registry
from reproduce.claims import caption_claims, claim_rows
from reproduce.running import ledger
from reproduce.claims.stats import difference

IMAGES = 300


def _runs(tmp_path, shift: dict, seeds=(0, 1, 2), arc=0.8, another=0.0):
    """Captioning records of the registry's mini runs: ARC beam 6 at CIDEr ``arc`` per image on average, each
    other set shifted by ``shift[name]`` (fractions), per-image noise shared by the seeds (image difficulty);
    every set at ``another`` against another image's references (the wrong-image control; None: not kept)."""
    rng = np.random.default_rng(0)
    difficulty = rng.normal(0, 0.3, IMAGES)
    index = {}
    for r in registry.build("mini", seeds=len(seeds)):
        if r.notebook != "captioning":
            continue
        metrics = {}
        for name in ("arc-beam6", "arc-beam6-ref", "mdc-10", "mdc-arc", "mdc-ref"):
            per = arc + shift.get(name, 0.0) + difficulty + rng.normal(0, 0.2, IMAGES) + rng.normal(0, 0.02)
            metrics[name] = {"cider": arc + shift.get(name, 0.0),  # the corpus score: their mean
                             "cider_per_image": [round(float(x), 4) for x in per]}
            if another is not None:
                metrics[name]["cider_another_image"] = another
        results = {"dataset": {"name": "coco", "image_ids": list(range(IMAGES))}, "metrics": metrics}
        index[r.name] = {"notebook": "captioning", "labels": r.labels, "artifacts": list(r.artifacts),
                         "results": {"kind": "captioning", "results": results}}  # a results file's content
    assert len(index) == len(seeds)
    return write_records(tmp_path / "records", index)


def _rows(tmp_path, records):
    files = registry.build_artifacts(records, str(tmp_path / "figures"), "unused", ["claims"])
    table = open(files["claims"][0]).read()
    rows = [line.split(" | ") for line in table.splitlines() if line.startswith("| ") and "---" not in line][1:]
    return {row[1]: row for row in rows if row[0].endswith("8. MDC's captions are comparable to ARC's (Tab. 3)")}


def test_claim_8_rows_pair_the_sets_at_matched_length(tmp_path):
    records = _runs(tmp_path, {"mdc-arc": 0.0, "mdc-ref": 0.0, "mdc-10": 0.25})
    rows = _rows(tmp_path, records)
    assert list(rows) == [c.what for c in caption_claims.CAPTION_CLAIMS]
    matched = rows["MDC at ARC's length - ARC (beam 6), CIDEr-D"]
    assert matched[2] == "TOST; margin +-8" and matched[3] == "3"  # a tenth of ARC's 80 - 0 CIDEr points
    verdict = lambda row: row[-1].rstrip(" |")  # noqa: E731
    assert verdict(matched) == "reproduced"  # equal within the margin
    assert verdict(rows["MDC - ARC (beam 6), both at the references' length, CIDEr-D"]) == "reproduced"
    unmatched = rows["MDC-10 - ARC (beam 6), lengths unmatched, CIDEr-D"]
    assert verdict(unmatched) == "contradicted: MDC-10 above ARC (beam 6) by more than 8"
    assert float(unmatched[4]) == pytest.approx(25, abs=2)


def test_the_difference_is_in_cider_points_over_the_same_images(tmp_path):
    records = _runs(tmp_path, {"mdc-arc": 0.05}, another=0.3)
    runs = ledger.for_build(ledger.read_all(str(records)))  # the runs as the builders read them
    claim = caption_claims.CAPTION_CLAIMS[0]
    d = caption_claims.caption_difference(runs, claim)
    pairs = caption_claims.paired_images(runs, claim)
    assert d == difference(pairs, seed_sd=caption_claims.SEED_SD, tasks=("cider",))
    assert d["seeds"] == 3 and d["items"] == IMAGES and d["mean"] == pytest.approx(5, abs=2.5)
    assert caption_claims.margin(runs) == pytest.approx(5.0, abs=0.2)  # a tenth of ARC's gain over another image: 80 - 30
    one = [r for r in runs if r["labels"].get("seed") == 0]
    assert caption_claims.caption_difference(one, claim)["v_seeds"] == caption_claims.SEED_SD ** 2
    runs[1]["record"]["results"]["dataset"]["image_ids"] = list(range(1, IMAGES + 1))
    with pytest.raises(ValueError, match="other test images"):
        caption_claims.paired_images(runs, claim)
    assert "not run (no captioning run holds per-image CIDEr" in claim_rows._caption_row(claim, [])["verdict"]


def test_without_the_wrong_image_control_the_margin_falls_back(tmp_path):
    """Records made before the control was kept: the margin is the fallback's 8 points, and the row says so."""
    rows = _rows(tmp_path, _runs(tmp_path, {"mdc-arc": 0.0}, another=None))
    assert rows["MDC at ARC's length - ARC (beam 6), CIDEr-D"][2].startswith("TOST; margin +-8")


def test_a_build_of_the_claims_alone_reads_the_captioning_runs_claim_8_rests_on():
    """--only claims selects every run the claims table reads: the probes and the captioning runs (claim 8)."""
    runs = registry.build("mini", seeds=2)
    chosen = {r.name for r in registry.select(runs, ["claims"])}
    assert {"captioning/alt-s0", "captioning/alt-s1", "probe/mdc-descriptive-s1"} <= chosen
