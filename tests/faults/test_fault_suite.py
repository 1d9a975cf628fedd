"""The fault suite's record (docs/reliability.md) is written by a run of the whole suite only."""
import os
import shutil
import subprocess
import sys

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))


def test_a_run_of_part_of_the_fault_suite_leaves_its_record_alone(tmp_path):
    doc = tmp_path / "reliability.md"
    shutil.copy(os.path.join(ROOT, "docs", "reliability.md"), doc)
    before = doc.read_text()
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-m", "faults", "-k",
                           "bad_values", os.path.join(ROOT, "tests", "faults", "test_faults.py")],
                          cwd=ROOT, env=os.environ | {"MDC_FAULT_DOC": str(doc)}, capture_output=True, text=True)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "1 passed" in done.stdout
    assert doc.read_text() == before  # "did not complete" rows for the tests it did not select would be wrong
