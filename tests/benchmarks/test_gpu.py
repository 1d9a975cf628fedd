"""``python -m benchmarks gpu`` without CUDA: the section is skipped with its reason (its CPU code
path runs in tests/benchmarks/test_benchmarks.py::test_gpu_section_code_path_on_cpu, make test-slow)."""
import json

import pytest
import torch

from benchmarks.__main__ import main
from benchmarks import gpu
from benchmarks.common import Context, Section
from benchmarks.gpu import run, skip_reason


@pytest.mark.skipif(torch.cuda.is_available(), reason="a CUDA device is present: the section runs")
def test_without_cuda_the_gpu_section_says_why_it_is_skipped(tmp_path, capsys):
    assert "no CUDA device" in skip_reason() and "python -m benchmarks gpu" in skip_reason()
    assert [(r.value, r.note) for r in run(Context()).rows] == [("skipped: no CUDA", skip_reason())]
    results = main(["gpu", "--out", str(tmp_path)])  # `gpu` as a positional name, as --only gpu
    assert list(results["sections"]) == ["gpu"]
    assert skip_reason() in capsys.readouterr().out
    assert json.loads((tmp_path / "benchmarks.json").read_text())["sections"]["gpu"]["rows"][0]["note"] == skip_reason()


def test_unknown_section_names_are_refused(capsys):
    with pytest.raises(SystemExit):
        main(["gpus"])
    assert "unknown section 'gpus'" in capsys.readouterr().err


def test_a_second_try_picks_objectives_leaves_out_compile_and_profiles(monkeypatch, capsys):
    """MDC_GPU_OBJECTIVES / MDC_GPU_COMPILE=0 / MDC_GPU_PROFILE=1: the rows of the objectives asked for, no compiled
    row, and each eager step's profile in the log."""
    monkeypatch.setenv("MDC_GPU_OBJECTIVES", "clip")
    monkeypatch.setenv("MDC_GPU_COMPILE", "0")
    monkeypatch.setenv("MDC_GPU_PROFILE", "1")
    sec = Section("gpu", "test")
    gpu._training(sec, Context(quick=True), torch.device("cpu"), "cpu")
    names = [row.name for row in sec.rows]
    assert names and all(n.startswith("CLIP ") for n in names) and not any("compile" in n for n in names)
    assert "CLIP profile, 3 eager steps, by self_cpu_time_total" in capsys.readouterr().out


def test_a_second_try_picks_the_parts(monkeypatch):
    """MDC_GPU_PARTS=training leaves out sampling and scoring (measured on an earlier try); an unknown part is
    refused by name before anything is measured."""
    monkeypatch.setenv("MDC_GPU_PARTS", "training")
    monkeypatch.setenv("MDC_GPU_OBJECTIVES", "clip")
    monkeypatch.setenv("MDC_GPU_COMPILE", "0")
    names = [row.name for row in gpu.measure(Context(quick=True), torch.device("cpu")).rows]
    assert names and all(n.startswith("CLIP ") for n in names)
    monkeypatch.setenv("MDC_GPU_PARTS", "training,sampleing")
    with pytest.raises(ValueError, match="MDC_GPU_PARTS.*'sampleing'.*training, sampling, scoring"):
        gpu.measure(Context(quick=True), torch.device("cpu"))


@pytest.mark.slow  # compiles the loss on the CPU (about 100 s); the eager rows' test below stays in make test
def test_the_compiled_variants_report_speed_host_time_and_their_names(monkeypatch):
    """Every compiled variant (quick: the whole loss under aot_eager; CUDA adds CUDA graphs) gets its images/s, its
    speed-up over eager and the host's milliseconds to issue a step, as eager does; kernels only where CUDA is."""
    monkeypatch.setenv("MDC_GPU_OBJECTIVES", "mdc")
    sec = Section("gpu", "test")
    gpu._training(sec, Context(quick=True), torch.device("cpu"), "cpu")
    rows = {row.name: row.value for row in sec.rows}
    whole = "compiled whole (aot_eager: quick)"
    assert rows[f"MDC {whole} speed-up"] > 0 and rows[f"MDC training, {whole}"] > 0
    assert rows[f"MDC eager: host ms to issue a step"] > 0 and rows[f"MDC {whole}: host ms to issue a step"] > 0
    assert not any("kernels" in name or "CUDA graphs" in name for name in rows)


def test_the_eager_rows_are_printed_before_compiling_begins(monkeypatch, capsys):
    """A step stopped by its time limit while compiling (the second H200 call: MDC at batch 256, CLIP) still leaves
    the eager step's figures in its log: they are printed before the compiled variants start."""
    monkeypatch.setenv("MDC_GPU_OBJECTIVES", "mdc")

    def stopped(*args):
        raise TimeoutError("stopped by the step's limit while compiling")

    monkeypatch.setattr(gpu, "_compiled", stopped)
    with pytest.raises(TimeoutError):
        gpu._training(Section("gpu", "test"), Context(quick=True), torch.device("cpu"), "cpu")
    out = capsys.readouterr().out
    assert "gpu: MDC training, batch 2 (depth 1: quick):" in out and "gpu: MDC model FLOPs utilisation" in out
