"""open_clip's own ``CoCa.generate``, raced from a virtualenv of its own.

open_clip 3.3's ``CoCa.generate`` needs transformers' ``BeamSearchScorer``, which transformers 5
(this project's) removed. :func:`environment` builds, once, ``runs/bench-peers/venv``: a plain
virtualenv (no system site-packages) with this environment's exact torch, torchvision and
open_clip_torch and ``transformers==4.56.*``. :class:`Worker` starts this file there: it reads one
JSON line (the CoCa config dict, batch, image size, seed, threads, length, beams, token ids), builds
the CoCa and the images, answers ``{"ready": ...}``, then answers every further line with one
``CoCa.generate`` call: ``{"seconds": ..., "decoder_passes": ..., "shape": ...}``; an error comes
back as ``{"error": ...}``. The caller times each round trip beside its own contestants, in the same
interleaved rounds. This file imports only the standard library at its top, so that it runs there.
"""
from __future__ import annotations

import importlib.metadata
import json
import os
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
VENV = os.path.join(ROOT, "runs", "bench-peers", "venv")
TRANSFORMERS = "transformers==4.56.*"  # the last series that exports BeamSearchScorer (4.57 keeps it unexported)


def requirements() -> list[str]:
    """The peers' virtualenv's pins: this environment's torch, torchvision, open_clip; transformers 4.56."""
    return [f"{name}=={importlib.metadata.version(name)}" for name in ("torch", "torchvision", "open_clip_torch")] + [
        TRANSFORMERS]


def _tail(text: str) -> str:
    lines = [line for line in (text or "").strip().splitlines() if line.strip()]
    return lines[-1][:160] if lines else "no message"


def environment(build: bool = True) -> tuple[str | None, str]:
    """(its python, "") when the peers' virtualenv is ready, building it first if missing (or pinned
    differently) and ``build``; else (None, why not)."""
    python, stamp = os.path.join(VENV, "bin", "python"), os.path.join(VENV, "requirements.json")
    reqs = requirements()
    try:
        with open(stamp) as f:
            if json.load(f) == reqs and os.path.exists(python):
                return python, ""
    except (OSError, ValueError):
        pass
    where = os.path.relpath(VENV, ROOT)
    if not build:
        return None, f"no peers' virtualenv in {where} (a quick run does not build one; a full run does)"
    try:
        subprocess.run([sys.executable, "-m", "venv", "--clear", VENV], check=True, capture_output=True, text=True)
        subprocess.run([python, "-m", "pip", "install", "--quiet", *reqs], check=True, capture_output=True,
                       text=True, timeout=1800)
    except subprocess.CalledProcessError as exn:
        return None, f"could not build {where} ({' '.join(reqs)}): {_tail(exn.stderr)}"
    except (OSError, subprocess.TimeoutExpired) as exn:
        return None, f"could not build {where}: {exn}"
    with open(stamp, "w") as f:
        json.dump(reqs, f)
    return python, ""


class Worker:
    """This file serving ``CoCa.generate`` under ``python`` (see the module's docstring); ``worker()``
    runs one call and returns its answer. RuntimeError with the worker's message on any failure."""

    def __init__(self, python: str, setup: dict):
        self._err = tempfile.TemporaryFile("w+")
        self._proc = subprocess.Popen([python, os.path.abspath(__file__)], stdin=subprocess.PIPE,
                                      stdout=subprocess.PIPE, stderr=self._err, text=True)
        try:
            self.info = self._ask(setup)
        except RuntimeError:
            self.close()
            raise

    def _ask(self, message: dict) -> dict:
        try:
            self._proc.stdin.write(json.dumps(message) + "\n")
            self._proc.stdin.flush()
            line = self._proc.stdout.readline()
        except OSError:
            line = ""
        if not line:
            self._err.seek(0)
            raise RuntimeError(f"the worker exited: {_tail(self._err.read())}")
        answer = json.loads(line)
        if "error" in answer:
            raise RuntimeError(answer["error"])
        return answer

    def __call__(self) -> dict:
        return self._ask({"generate": True})

    def close(self) -> None:
        """End of input: the worker exits."""
        try:
            self._proc.stdin.close()
        except OSError:
            pass
        self._proc.stdout.close()
        self._proc.wait(timeout=60)
        self._err.close()


def build_coca(open_clip, cfg: dict, name: str):
    """open_clip's ``create_model`` on config dict ``cfg`` registered as ``name``, random weights.

    Its multimodal decoder's output projection is allocated with ``torch.empty`` and never
    initialised (``MultimodalTransformer.init_parameters`` is not called, open_clip PR #551): it is
    drawn here as that method would, so decoding never runs on whatever the memory held (NaN at times).
    """
    import logging

    import torch

    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, name + ".json")
        with open(path, "w") as f:
            json.dump(cfg, f)
        open_clip.add_model_config(path)
    root, level = logging.getLogger(), logging.getLogger().level
    root.setLevel(logging.ERROR)  # open_clip warns "no pretrained weights loaded": intended
    try:
        coca = open_clip.create_model(name, pretrained=None)
    finally:
        root.setLevel(level)
    proj = coca.text_decoder.text_projection  # [width, output_dim]
    with torch.no_grad():
        proj.normal_(std=proj.shape[0] ** -0.5)
    return coca


def _serve() -> None:
    """The worker's side (run in the peers' virtualenv): answers on the original stdout; whatever
    the libraries print goes to stderr."""
    out = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)
    setup = json.loads(sys.stdin.readline())
    try:
        import importlib.util

        shim = os.path.join(ROOT, "mdc", "base", "torchvision_shim.py")
        spec = importlib.util.spec_from_file_location("torchvision_shim", shim)
        compat = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(compat)
        compat.patch_torchvision()  # the CUDA torchvision wheel on CPU torch, as mdc does
        import time

        import open_clip
        import torch

        torch.set_num_threads(setup["threads"])
        torch.manual_seed(0)
        coca = build_coca(open_clip, setup["cfg"], setup["name"]).eval()
        size = setup["image_size"]
        images = torch.randn(setup["batch"], 3, size, size, generator=torch.Generator().manual_seed(setup["seed"]))
        passes = [0]
        coca.text_decoder.register_forward_hook(lambda *_: passes.__setitem__(0, passes[0] + 1))
        versions = {name: importlib.metadata.version(name) for name in ("torch", "open_clip_torch", "transformers")}
        out.write(json.dumps({"ready": True, "versions": versions, "threads": torch.get_num_threads()}) + "\n")
    except Exception as exn:  # noqa: BLE001 - the caller falls back and names it
        out.write(json.dumps({"error": f"{type(exn).__name__}: {_tail(str(exn))}"}) + "\n")
        return
    for _ in sys.stdin:
        try:
            passes[0] = 0
            start = time.perf_counter()
            tokens = coca.generate(images, seq_len=setup["length"] + 2, generation_type="beam_search",
                                   num_beams=setup["beams"], num_beam_groups=1, min_seq_len=setup["length"] + 1,
                                   sot_token_id=setup["sot"], eos_token_id=setup["eot"], pad_token_id=setup["pad"])
            answer = {"seconds": time.perf_counter() - start, "decoder_passes": passes[0], "shape": list(tokens.shape)}
        except Exception as exn:  # noqa: BLE001
            answer = {"error": f"{type(exn).__name__}: {_tail(str(exn))}"}
        out.write(json.dumps(answer) + "\n")


if __name__ == "__main__":
    _serve()
