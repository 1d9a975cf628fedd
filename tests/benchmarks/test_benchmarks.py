"""The benchmark suite runs and writes its files (figures are printed, never asserted), and its helpers."""
import importlib.metadata
import json
import math
import os
import subprocess
import sys

import pytest
import torch

import mdc
from conftest import ROOT

ENV = dict(os.environ, OMP_NUM_THREADS="1")


def _quick(tmp_path, *only):
    cmd = [sys.executable, "-m", "benchmarks", "--quick", "--threads", "1", "--out", str(tmp_path)]
    done = subprocess.run(cmd + (["--only", *only] if only else []), cwd=ROOT, env=ENV, capture_output=True,
                          text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    results = json.loads((tmp_path / "benchmarks.json").read_text())
    markdown = (tmp_path / "benchmarks.md").read_text()
    for name, section in results["sections"].items():
        assert section["rows"] and section["title"] in markdown and section["title"] in done.stdout, name
    return results


def test_quick_run_writes_table_json_and_markdown(tmp_path):
    results = _quick(tmp_path, "scoring", "data", "gpu")
    assert list(results["sections"]) == ["scoring", "data", "gpu"] and results["meta"]["quick"]
    load = results["meta"]["load"]  # the machine's load is part of the record: figures are read against it
    assert set(load) == {"start", "end"} and all(v is None or v >= 0 for v in load.values())
    assert "load average" in (tmp_path / "benchmarks.md").read_text()
    rows = {r["name"]: r for r in results["sections"]["data"]["rows"]}
    assert rows["shards written, npy, 1 process"]["target"] == ">= 2000"
    assert all(isinstance(r["met"], bool) for r in rows.values() if r["target"])
    for size in ("640x480", "256 px"):  # photographs: decode per image with draft and without, the workers a GPU needs
        assert {f"JPEG to 224 px, photographs {size}, {d}" for d in ("draft", "no draft")} <= set(rows)
        workers = rows[f"workers per H200, photographs {size}"]
        assert workers["unit"] == "workers" and all(int(n) >= 1 for n in workers["value"].split(" / "))
    if not torch.cuda.is_available():
        assert results["sections"]["gpu"]["rows"][0]["value"] == "skipped: no CUDA"


def test_flops_section_prints_each_models_step_beside_the_matmul(tmp_path):
    results = _quick(tmp_path, "flops")
    rows = {r["name"]: r for r in results["sections"]["flops"]["rows"]}
    assert rows["matmul 256 x 256, fp32"]["value"] > 0
    for name in ("tiny", "mini"):
        for obj in ("MDC", "ARC", "CLIP"):
            label = f"{name} {obj}, batch 4"
            assert rows[f"{label}: step"]["value"] > 0 and "GFLOP/image counted" in rows[f"{label}: step"]["note"]
            assert rows[f"{label}: achieved"]["value"] > 0
            assert rows[f"{label}: fraction of the matmul's GFLOP/s"]["value"] > 0
    assert rows["mini MDC, batch 4: fraction of the matmul's GFLOP/s"]["target"] == ">= 0.6"
    alt, desc = (rows[f"mini MDC pretraining run, {s} captions"]["value"] for s in ("alt", "descriptive"))
    assert 0 < alt < desc  # alt captions are shorter
    shares = [r["value"] for name, r in rows.items() if name.startswith("mini MDC step, time in")]
    assert sum(shares) == pytest.approx(100, abs=1)


def test_flop_count_includes_cpu_attention():
    """The step's count includes SDPA's CPU kernel, which FlopCounterMode alone misses (backward: the
    scores recomputed and four products, 2.5 x the forward), and leaves no gradients behind."""
    from benchmarks.flops import batch, count

    model = mdc.create_model("tiny", "clip")
    images, tokens = batch(model, 2)
    per_op = count(model, images, tokens)
    assert per_op["aten._scaled_dot_product_flash_attention_for_cpu"] > 0
    assert per_op["aten._scaled_dot_product_flash_attention_for_cpu_backward"] == pytest.approx(
        2.5 * per_op["aten._scaled_dot_product_flash_attention_for_cpu"])
    assert all(p.grad is None for p in model.parameters())


@pytest.mark.slow
def test_quick_run_of_every_section(tmp_path):
    results = _quick(tmp_path)
    assert list(results["sections"]) == ["train", "flops", "sampling", "scoring", "data", "gpu"]
    sampling = {r["name"]: r for r in results["sections"]["sampling"]["rows"]}
    assert sampling["MDC cache speedup, tiny"]["note"] == "same captions"


@pytest.mark.slow
def test_gpu_section_code_path_on_cpu():
    from benchmarks.common import Context
    from benchmarks.gpu import measure, peak_flops

    assert peak_flops("NVIDIA H100 80GB HBM3") == 989e12 and peak_flops("NVIDIA H100 PCIe") == 756e12
    assert peak_flops("a GPU nobody knows") is None
    rows = {r.name: r for r in measure(Context(quick=True), torch.device("cpu")).rows}
    for label in ("MDC", "ARC", "CLIP"):  # every objective, eager and compiled
        assert rows[f"{label} model FLOPs utilisation"].value is None and rows[f"{label} achieved"].value >= 0
        assert "TFLOP per step" in rows[f"{label} training, batch 2 (depth 1: quick)"].note
        assert rows[f"{label} torch.compile speed-up"].value > 0
        assert rows[f"{label} training, torch.compile (aot_eager: quick)"].value > 0
    for scorer in ("ELBO", "heuristic", "exact (ARC)", "cosine (CLIP)"):  # throughput in both precisions, error
        assert sum(name.startswith(scorer) and name.endswith(("fp32", "bf16")) for name in rows) == 2, scorer
        assert 0 <= rows[f"{scorer}: |bf16 - fp32| score, max (mean)"].value < 1, scorer
    assert any(name.startswith("MDC greedy sampling") for name in rows) and any(
        name.startswith("ARC beam search") for name in rows)


def test_samples_to_match_interpolates_in_log_log():
    from benchmarks.scoring import samples_to_match

    sizes = [32, 128, 1024]
    iid = [1 / math.sqrt(s) for s in sizes]
    assert samples_to_match(sizes, iid, iid[-1]) == pytest.approx(1024)
    assert samples_to_match(sizes, [v / 4 for v in iid], iid[-1]) == pytest.approx(64)  # 16x less variance
    assert samples_to_match(sizes, [v / 16 for v in iid], iid[-1]) == pytest.approx(4)  # below the smallest size
    assert samples_to_match(sizes, [v * 2 for v in iid], iid[-1]) == pytest.approx(4096)  # beyond the largest


def test_plain_sampling_loop_is_the_cached_samplers_result():
    from benchmarks.sampling import plain_mdc_sample
    from conftest import SMALL

    model = mdc.create_model("tiny", "mdc", **SMALL).eval()
    images = torch.randn(3, 3, 32, 32)
    assert torch.equal(plain_mdc_sample(model, images, 6), mdc.generate(model, images, 6, return_tokens=True))


def _small_coca():
    from benchmarks.common import coca_like
    from conftest import SMALL

    torch.manual_seed(0)
    arc = mdc.create_model("tiny", "arc", **SMALL).eval()
    return coca_like(arc).eval(), arc.tokenizer


def test_coca_like_has_no_uninitialised_weights(monkeypatch):
    """open_clip's multimodal decoder allocates its output projection with ``torch.empty`` and never
    initialises it: whatever the memory held (NaN at times) decided the benchmark's beam search. Memory
    that holds NaN makes the fault show every time."""
    real_empty = torch.empty
    monkeypatch.setattr(torch, "empty", lambda *a, **k: real_empty(*a, **k).fill_(math.nan))
    coca, _ = _small_coca()
    monkeypatch.undo()
    assert not [name for name, p in coca.named_parameters() if not p.isfinite().all()]
    width = coca.text_decoder.text_projection.shape[0]
    assert coca.text_decoder.text_projection.std().item() == pytest.approx(width ** -0.5, rel=0.2)


def test_coca_beam_search_returns_a_caption_per_image_when_no_hypothesis_ends():
    """[EOT] barred to the end (min_length beyond the length): every beam runs out of room unfinished,
    and each image gets its best live hypothesis (as open_clip's and Hugging Face's beam search do)."""
    from benchmarks.sampling import coca_beam_search

    coca, tok = _small_coca()
    images = torch.randn(3, 3, 32, 32)
    out = coca_beam_search(coca, images, 4, 3, tok, min_length=10)
    assert len(out) == 3 and all(len(body) == 4 and tok.eot_id not in body for body in out)
    ended = coca_beam_search(coca, images, 4, 3, tok, min_length=4)  # [EOT] forced after 4 tokens
    assert len(ended) == 3 and all(len(body) == 4 for body in ended)


def test_peers_virtualenv_missing_or_unbuildable_says_why(tmp_path, monkeypatch):
    from benchmarks import peers

    monkeypatch.setattr(peers, "VENV", str(tmp_path / "venv"))
    python, why = peers.environment(build=False)
    assert python is None and "does not build" in why
    monkeypatch.setattr(peers.sys, "executable", str(tmp_path / "no-python"))
    python, why = peers.environment(build=True)
    assert python is None and why.startswith("could not build")
    assert any(r.startswith("torch==") for r in peers.requirements()) and peers.TRANSFORMERS in peers.requirements()


def test_peer_worker_protocol_in_this_environment():
    """The worker answers ready with its versions, then one answer per generate call: seconds and decoder
    passes where open_clip's generate runs (transformers 4), its error otherwise (transformers 5)."""
    from benchmarks import peers
    from benchmarks.common import coca_config
    from conftest import SMALL

    arc = mdc.create_model("tiny", "arc", **SMALL)
    cfg, name = coca_config(arc)
    tok = arc.tokenizer
    worker = peers.Worker(sys.executable, dict(cfg=cfg, name=name, batch=2, image_size=32, seed=0, length=4, beams=2,
                                               threads=1, sot=tok.sot_id, eot=tok.eot_id, pad=tok.pad_id))
    try:
        assert worker.info["ready"] and worker.info["threads"] == 1
        assert worker.info["versions"]["open_clip_torch"] == importlib.metadata.version("open_clip_torch")
        try:
            answer = worker()
        except RuntimeError as exn:
            assert "transformers" in str(exn) and int(worker.info["versions"]["transformers"].split(".")[0]) >= 5
        else:
            assert answer["seconds"] > 0 and answer["decoder_passes"] == 5 and answer["shape"][0] == 2
    finally:
        worker.close()
    with pytest.raises(RuntimeError, match="KeyError"):  # a setup the worker cannot use comes back as an error
        peers.Worker(sys.executable, {})


def test_coca_falls_back_to_the_reimplementation_and_names_why():
    from benchmarks import sampling
    from conftest import SMALL

    arc = mdc.create_model("tiny", "arc", **SMALL).eval()
    generate, label, why, close = sampling._coca(arc, 2, None, "no peers' virtualenv")
    assert "fallback" in label and why.startswith("no peers' virtualenv")
    assert generate() == {"decoder_passes": sampling.LENGTH + 1, "seconds": None}
    close()
    if int(importlib.metadata.version("transformers").split(".")[0]) >= 5:  # open_clip's generate fails: its error
        generate, label, why, close = sampling._coca(arc, 2, sys.executable)
        assert "fallback" in label and "failed under" in why and "transformers" in why
