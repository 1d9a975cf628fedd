"""The binding study (reproduce/studies/binding.py): its arms' training commands, the time budget, an arm scored
from the shipped weights into a record, and the report of the records."""
import json
import os

import pytest

from mdc.eval.suites import load_suites, synthetic_data
from reproduce.studies import binding
from reproduce.studies.binding import ARMS, Arm


def _flag(cmd, name):
    return cmd[cmd.index(name) + 1]


def test_arms_train_the_mini_recipe_with_only_their_budget_or_interval_changed():
    assert [a.name for a in ARMS] == ["mdc-x1", "mdc-x2", "mdc-x4", "arc-x1", "arc-x2", "arc-x4", "mdc-x1-t0.0-1.0",
                                      "mdc-x1-t0.3-0.8", "mdc-x1-t0.4-0.9"]
    x4 = binding.train_command(Arm("arc", 4), "DATA", "RUN")
    assert (_flag(x4, "--objective"), _flag(x4, "--steps"), _flag(x4, "--warmup-steps")) == ("arc", "8960", "896")
    assert _flag(x4, "--seed") == "0" and "--t-interval" not in x4 and "--resume" in x4
    t = binding.train_command(Arm("mdc", 1, (0.3, 0.8)), "DATA", "RUN")
    assert t[t.index("--t-interval") + 1:][:2] == ["0.3", "0.8"] and _flag(t, "--steps") == "2240"


def test_arms_with_records_are_skipped_and_the_budget_defers_what_does_not_fit(tmp_path):
    (tmp_path / "mdc-x1.json").write_text("{}")
    now, later = binding.pending(ARMS, str(tmp_path), budget_s=3600)
    assert [a.name for a in now] == ["arc-x1", "mdc-x1-t0.0-1.0"]  # 300 s, then 2,040 s; 1.2 h would not fit
    assert "mdc-x1" not in [a.name for a in now + later] and "mdc-x4" in [a.name for a in later]
    assert binding.pending(ARMS, str(tmp_path), None)[1] == []


@pytest.fixture(scope="module")
def suites(tmp_path_factory):
    data = synthetic_data(str(tmp_path_factory.mktemp("evalsets")), 0, 64, 4)
    return load_suites(data, list(binding.SUITES), attribute_min_count=1)


def test_a_shipped_arm_is_scored_into_its_record_and_the_report(suites, tmp_path):
    record = binding.run_arm(Arm("mdc", 1), str(tmp_path / "work"), suites, records=str(tmp_path / "binding"))
    assert record["weights"] == "shipped seed-0 mini" and record["train_seconds"] is None
    assert set(record["suites"]) == set(binding.SUITES) and set(record["binding"]) <= set(binding.SWAPS)
    for cell in record["suites"].values():
        assert 0 <= cell["own"] <= 1 and 0 <= cell["shuffled"] <= 1 and cell["items"] == 4
    assert json.loads((tmp_path / "binding" / "mdc-x1.json").read_text()) == record
    text = binding.report(str(tmp_path / "binding"))
    assert "| mdc-x1 | " in text and "Not yet run: mdc-x2, mdc-x4, arc-x1" in text
    assert binding.main(["--report", "--records", str(tmp_path / "binding")]) == 0
    assert os.path.isfile(tmp_path / "binding.md")


def test_the_budget_is_read_again_before_each_arm(tmp_path, monkeypatch):
    """An arm that ran slow leaves less time: the next arm starts only if it still fits."""
    clock = iter([0.0, 0.0, 3000.0, 3000.0])  # the start, then after the first arm ran 50 minutes
    monkeypatch.setattr(binding.time, "monotonic", lambda: next(clock))
    monkeypatch.setattr(binding, "load_suites", lambda *a, **k: {})
    monkeypatch.setattr(binding, "synthetic_data", lambda *a: "unused")
    ran = []
    (tmp_path / "binding").mkdir()

    def run_arm(arm, work, suites, records):
        ran.append(arm.name)
        (tmp_path / "binding" / f"{arm.name}.json").write_text("{}")

    monkeypatch.setattr(binding, "run_arm", run_arm)
    monkeypatch.setattr(binding, "report", lambda records: "")
    binding.main(["--work", str(tmp_path / "work"), "--arms", "mdc-x1-t0.3-0.8", "mdc-x1-t0.4-0.9",
                  "--time-budget", "75", "--records", str(tmp_path / "binding")])
    assert ran == ["mdc-x1-t0.3-0.8"]  # 2,040 s of the 4,500 fitted; after 3,000 s the second no longer does
