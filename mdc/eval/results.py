"""Results files: what every experiment notebook writes and what the figures read.

One JSON object per run (``<output_dir>/results.json``)::

    {
      "schema": "mdc.results/1",
      "kind": "pretrain" | "linear_probe" | "compositionality" | "captioning" | ...,
      "parameters": {...},        # the notebook's parameters, as run
      "model": {...} | null,      # ModelConfig of the evaluated checkpoint (name, objective, ...)
      "checkpoint": str | null,   # its folder
      "checkpoint_id": str | null,  # sha256 (16 hex) of its weights: which weights, not where
      "runtime_s": float | null,
      "results": {...}            # kind-specific, documented by the module that writes it
    }

Numbers are plain JSON floats (accuracies as fractions in [0, 1]); NaN is written as null.
"""
from __future__ import annotations

import json
import math
import os
from dataclasses import asdict
from typing import Any, Iterable, Mapping

from mdc.factory import checkpoint_folder, file_digest

SCHEMA = "mdc.results/1"
_ID_CACHE: dict[tuple[str, float, int], str] = {}


def checkpoint_id(path: str | os.PathLike) -> str:
    """Content hash (sha256, first 16 hex digits) of a checkpoint's ``model.safetensors`` (a
    checkpoint folder, or a run folder's newest checkpoint)."""
    weights = os.path.join(checkpoint_folder(path), "model.safetensors")
    st = os.stat(weights)
    key = (os.path.abspath(weights), st.st_mtime, st.st_size)
    if key not in _ID_CACHE:
        _ID_CACHE[key] = file_digest(weights)
    return _ID_CACHE[key]


def _clean(obj: Any) -> Any:
    """JSON-ready copy: tuples -> lists, numpy/torch scalars -> Python numbers, NaN/inf -> None."""
    if isinstance(obj, dict):
        return {str(k): _clean(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_clean(v) for v in obj]
    if hasattr(obj, "item") and callable(obj.item) and getattr(obj, "ndim", 0) == 0:
        obj = obj.item()
    if hasattr(obj, "tolist"):
        return _clean(obj.tolist())
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    return obj


def parameter_names(namespace: Mapping[str, Any], exclude: Iterable[str] = ()) -> list[str]:
    """The names of a notebook's parameters, in the order they were defined, to record their values
    in :func:`write_results` (``{name: globals()[name] for name in names}``, when it is written).

    Call it with ``globals()`` in the cell right after the papermill-tagged ``parameters`` cell,
    before anything else is defined: the globals holding plain data (papermill parameters are
    literals) are then exactly what that cell and papermill's ``injected-parameters`` cell defined,
    overrides included. Names starting with ``_``, IPython's history (``In``, ``Out``) and ``exclude``
    are left out.
    """
    skip = {"In", "Out", *exclude}
    return [name for name, value in namespace.items() if not name.startswith("_") and name not in skip
            and isinstance(value, (str, int, float, bool, type(None), list, tuple, dict))]


def write_results(path: str | os.PathLike, kind: str, results: dict, *, parameters: dict | None = None,
                  checkpoint: str | None = None, model=None, runtime_s: float | None = None) -> dict:
    """Write a results file (atomically) and return what was written. ``model``: a model or a ModelConfig."""
    config = getattr(model, "config", model)
    record = {
        "schema": SCHEMA, "kind": kind, "parameters": parameters or {},
        "model": asdict(config) if config is not None else None,
        "checkpoint": checkpoint_folder(checkpoint) if checkpoint else None,
        "checkpoint_id": checkpoint_id(checkpoint) if checkpoint else None,
        "runtime_s": runtime_s, "results": results,
    }
    record = _clean(record)
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    tmp = f"{path}.tmp-{os.getpid()}"
    with open(tmp, "w") as f:
        json.dump(record, f, indent=1)
    os.replace(tmp, path)
    return record


def read_results(path: str | os.PathLike, kind: str | None = None) -> dict:
    """Read a results file; ValueError naming the file if it is not one (or not of ``kind``)."""
    try:
        with open(path) as f:
            record = json.load(f)
    except (OSError, json.JSONDecodeError) as exn:
        raise ValueError(f"{path}: cannot read a results file ({exn})") from exn
    if not isinstance(record, dict) or record.get("schema") != SCHEMA:
        raise ValueError(f"{path}: not a results file of schema {SCHEMA!r}")
    if kind is not None and record.get("kind") != kind:
        raise ValueError(f"{path}: holds {record.get('kind')!r} results, expected {kind!r}")
    return record
