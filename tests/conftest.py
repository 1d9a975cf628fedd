import io
import json
import os
import sys
import tarfile
import threading
from http.server import BaseHTTPRequestHandler, HTTPServer

import nbformat
import pytest
import torch
from nbformat.v4 import new_code_cell, new_notebook
from PIL import Image
from safetensors.torch import load_file

import mdc
from mdc.base import checkpoint
from mdc.tokenizer import compact_vocab
from mdc.world.evalsets import write_evalsets
from mdc.world.scenes import vocabulary, write_shards

CAPTIONS = [
    "a red circle left of a blue square",
    "a green star above a small yellow triangle",
    "two blue squares below a striped cross",
    "a large purple circle right of a star",
]
# Subprocesses (notebook kernels, torchrun workers) import the checkout under test, not whatever
# `mdc` the environment has installed (a worktree beside the editable install, say).
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [ROOT, os.environ.get("PYTHONPATH")]))

VOCAB = compact_vocab(CAPTIONS + ["a green square", "the red star above a circle"])
SMALL = dict(vocab=VOCAB, image_size=32, patch_size=8, vision_width=64, vision_layers=2, vision_heads=2,
             text_width=64, text_layers=2, text_heads=2, embed_dim=64, context_length=24)
# SMALL on the synthetic world's own vocabulary (what the notebooks' data is captioned with)
WORLD_SMALL = {k: v for k, v in SMALL.items() if k != "vocab"} | {"context_length": 32}
# SMALL with the synthetic world's vocabulary given explicitly: the model_overrides of the training tests
TRAIN_MODEL = SMALL | {"vocab": list(vocabulary()), "context_length": 32}
# A subprocess under test: one thread (fast on shared cores, runs comparable bitwise), one-line errors
SUBPROCESS_ENV = {k: v for k, v in os.environ.items() if k != "MDC_DEBUG"} | {"OMP_NUM_THREADS": "1"}


def committed_notebook(name: str):
    """notebooks/<name>.ipynb as committed, checked clean: one ``parameters`` cell, the python3
    kernel, no outputs. Returns (notebook, its parameters cell)."""
    import nbformat

    nb = nbformat.read(os.path.join(ROOT, "notebooks", f"{name}.ipynb"), as_version=4)
    tagged = [c for c in nb.cells if "parameters" in c.metadata.get("tags", [])]
    assert len(tagged) == 1 and nb.metadata.kernelspec.name == "python3"
    assert all(not c.get("outputs") and not c.get("execution_count") for c in nb.cells if c.cell_type == "code")
    return nb, tagged[0]


@pytest.fixture
def run_notebook(tmp_path, monkeypatch):
    """``run(name, **parameters)`` executes notebooks/<name>.ipynb under papermill in tmp_path, its
    kernel on one thread; returns the executed notebook."""
    import papermill

    monkeypatch.setenv("OMP_NUM_THREADS", "1")  # the kernel inherits the environment

    def run(name: str, **parameters):
        return papermill.execute_notebook(os.path.join(ROOT, "notebooks", f"{name}.ipynb"), str(tmp_path / "out.ipynb"),
                                          kernel_name="python3", cwd=str(tmp_path), progress_bar=False,
                                          parameters=parameters)

    return run


@pytest.fixture
def one_thread():
    """One torch thread for the test: fast when the 2 cores are shared, and identical for runs compared bitwise."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


def small_model(objective="mdc", **kw):
    """A very small model (32 px, width 64, 2+2 layers, compact vocabulary) for fast tests."""
    return mdc.create_model("tiny", objective=objective, **{**SMALL, **kw})


def clip_batch(dtype=torch.float32) -> tuple[torch.Tensor, list[str]]:
    """The CLIP accumulation tests' global batch: 8 random 32 px images [8, 3, 32, 32] and 8 captions, two of them
    repeated (the contrast counts a repeated caption as a negative, as a big batch would)."""
    images = torch.randn(8, 3, 32, 32, generator=torch.Generator().manual_seed(1), dtype=dtype)
    return images, CAPTIONS + ["a green square", "the red star above a circle"] + CAPTIONS[:2]


@pytest.fixture
def images():
    return torch.randn(len(CAPTIONS), 3, 32, 32)


@pytest.fixture(scope="session")
def evalsets(tmp_path_factory) -> str:
    """The synthetic evaluation sets at 32 px, 6 items per compositionality file (probe and captioning sets tiny)."""
    out = tmp_path_factory.mktemp("evalsets")
    write_evalsets(str(out), seed=0, image_size=32, n_probe_train=1, n_probe_test=1, n_items=6, n_caption_train=1)
    return str(out)


@pytest.fixture(scope="session")
def scene_shards(tmp_path_factory) -> str:
    """Two shards of 16 synthetic 32 px scenes (alt captions, seed 0), written once; returns the brace pattern."""
    out = str(tmp_path_factory.mktemp("scene_shards"))
    write_shards(out, 32, "alt", seed=0, image_size=32, shard_size=16)
    return os.path.join(out, "{000000..000001}.tar")


def train_cli(args: dict) -> list[str]:
    """``python -m mdc.train`` with ``args`` (keyword arguments of ``mdc.train.train``) as its flags."""
    cmd = [sys.executable, "-m", "mdc.train"]
    for key, value in args.items():
        flag = "--" + key.replace("_", "-")
        if value is True:
            cmd.append(flag)
        elif value is False:
            cmd.append("--no-" + key.replace("_", "-"))
        else:
            cmd += [flag, json.dumps(value) if isinstance(value, dict) else str(value)]
    return cmd


def latest_weights(run) -> dict:
    """The weights of a run folder's latest checkpoint."""
    return load_file(os.path.join(checkpoint.latest(str(run)), "model.safetensors"))


def same_weights(a: dict, b: dict) -> bool:
    """Two state dicts hold the same tensors, bit for bit."""
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def tar_members(path) -> dict[str, bytes]:
    """{member name: its bytes} of a tar file."""
    with tarfile.open(path) as tar:
        return {m.name: tar.extractfile(m).read() for m in tar}


def alive(pid: int) -> bool:
    """Is the process running (not gone, not a zombie)?"""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def caption_items(folder, n: int, colour, size: tuple[int, int] = (32, 32), offset: int = 0) -> list[dict]:
    """``n`` captioning items (image_id, image_path, references) of one-colour images ``colour(i)`` written into
    ``folder``, each with two of :data:`CAPTIONS` as references; ``offset``: their ids (and file names) from it."""
    items = []
    for i in range(n):
        path = folder / f"{i + offset}.png"
        Image.new("RGB", size, colour(i)).save(path)
        items.append({"image_id": i + offset, "image_path": str(path),
                      "references": [CAPTIONS[i % 4], CAPTIONS[(i + 1) % 4]]})
    return items


def png(colour: tuple[int, int, int], size: tuple[int, int] = (32, 32)) -> bytes:
    """A one-colour PNG image, for shards written by hand."""
    buf = io.BytesIO()
    Image.new("RGB", size, colour).save(buf, "PNG")
    return buf.getvalue()


def write_records(folder, runs: dict) -> str:
    """Ledger records in ``folder`` for ``runs`` ({name: {notebook, labels, artifacts, results}}, ``results``
    a results dict or the path of a results file), as the runner writes them; returns ``folder``."""
    import json

    from reproduce.running import ledger

    for name, run in runs.items():
        results = run["results"]
        if not isinstance(results, dict):
            with open(results) as f:
                results = json.load(f)
        record = {"schema": ledger.SCHEMA, "run": name, "key": "test", "notebook": run["notebook"],
                  "params": run.get("params", {}), "labels": run.get("labels", {}), "artifacts": run["artifacts"],
                  "seed": run.get("labels", {}).get("seed"), "code": {"notebook": "test", "package": "test"},
                  "device": "test", "seconds": 0.0, "cpu_seconds": 0.0, "peak_mb": 0, "results": results}
        path = ledger.path(str(folder), name)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "w") as f:
            json.dump(record, f)
    return str(folder)


def study_record(folder, name, notebook, params, seconds, results=None, seed=0, labels=None, package="p0") -> None:
    """One ledger record of a study's run in ``folder``: its parameters, seconds and results, by package digest."""
    import json

    from reproduce.running import ledger

    record = {"schema": ledger.SCHEMA, "run": name, "key": "k", "notebook": notebook, "params": params,
              "labels": labels or {}, "artifacts": [], "seed": seed, "code": {"notebook": "n", "package": package},
              "seconds": seconds, "results": {"schema": "mdc.results/1", "results": results or {}}}
    path = ledger.path(str(folder), name)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        json.dump(record, f)


def toy_notebook(folder, name: str, parameters: str, code: str) -> str:
    """``name``.ipynb in ``folder`` (made if missing): a ``parameters``-tagged cell, as papermill expects, then
    ``code``; a fast stand-in for a package notebook in the runner's tests. Returns ``folder``."""
    nb = new_notebook(cells=[new_code_cell(parameters, metadata={"tags": ["parameters"]}), new_code_cell(code)])
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    os.makedirs(folder, exist_ok=True)
    nbformat.write(nb, os.path.join(folder, f"{name}.ipynb"))
    return str(folder)


def toy_calls(out, name: str) -> int:
    """How many times a toy notebook's run ``name`` executed in ``out`` (one character of calls.txt a call)."""
    path = os.path.join(out, name, "calls.txt")
    return len(open(path).read()) if os.path.exists(path) else 0


# What an instant run's command does in place of its notebook: write the results file the runner waits for.
INSTANT = ("import json, sys; "
           "json.dump({'schema': 'mdc.results/1', 'kind': 'instant', 'results': {}}, open(sys.argv[1], 'w'))")


@pytest.fixture
def instant_runs(monkeypatch):
    """Each run's command writes its results file and ends (a bare interpreter, tens of milliseconds, where a
    notebook kernel takes seconds): for tests of which run starts when. The attempt around the command is the
    runner's own (its subprocess, folder, log, done.json, record); only the notebook is left out."""
    from reproduce.running import attempt
    from reproduce.graph import run_dir

    def command(out, run, params_file, torchrun=None, science=None):
        return [sys.executable, "-c", INSTANT, os.path.join(run_dir(out, run), "results.json")]

    monkeypatch.setattr(attempt, "command", command)


@pytest.fixture
def fake_judge():
    """An OpenAI-style chat server on 127.0.0.1 answering from a list, in turn."""
    answers = ["A", "Answer: b", "hmm, hard to say", "(B)"]
    seen = []

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self):
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            seen.append((self.path, body))
            text = answers[(len(seen) - 1) % len(answers)]
            reply = json.dumps({"choices": [{"message": {"role": "assistant", "content": text}}]}).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(reply)))
            self.end_headers()
            self.wfile.write(reply)

        def log_message(self, *args):
            pass

    server = HTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_port}/v1", seen
    server.shutdown()
    server.server_close()
