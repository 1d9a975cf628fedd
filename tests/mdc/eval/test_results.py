"""Results files: schema, cleaning of numpy/torch values, checkpoint identity."""
import json

import numpy as np
import pytest
import torch

from mdc.eval.results import SCHEMA, checkpoint_id, parameter_names, read_results, write_results
from conftest import small_model


def test_write_read_round_trip(tmp_path):
    model = small_model()
    model.save(tmp_path / "ckpt")
    rec = write_results(tmp_path / "out" / "results.json", "linear_probe",
                        {"top1": np.float32(0.5), "per": {"a": torch.tensor(0.25)}, "bad": float("nan"),
                         "pair": (1, 2)}, parameters={"x": 1}, checkpoint=str(tmp_path / "ckpt"), model=model)
    back = read_results(tmp_path / "out" / "results.json", kind="linear_probe")
    assert back == rec and back["schema"] == SCHEMA
    assert back["results"] == {"top1": 0.5, "per": {"a": 0.25}, "bad": None, "pair": [1, 2]}
    assert back["model"]["objective"] == "mdc" and len(back["checkpoint_id"]) == 16
    assert back["checkpoint_id"] == checkpoint_id(tmp_path / "ckpt")
    with pytest.raises(ValueError, match="expected 'captioning'"):
        read_results(tmp_path / "out" / "results.json", kind="captioning")
    (tmp_path / "x.json").write_text(json.dumps({"a": 1}))
    with pytest.raises(ValueError, match="schema"):
        read_results(tmp_path / "x.json")


def test_parameter_names_are_the_notebook_globals_holding_data():
    # a kernel's globals right after the parameters cell (and papermill's injected cell)
    namespace = {"__name__": "__main__", "_ih": ["", "a = 1"], "In": ["", "a = 1"], "Out": {}, "_i2": "",
                 "get_ipython": lambda: None, "exit": object(), "checkpoint": "runs/x", "steps": 3, "lr": None,
                 "scales": [1.0, 2.0], "overrides": {"k": 1}, "json": json, "parameter_names": parameter_names}
    assert parameter_names(namespace) == ["checkpoint", "steps", "lr", "scales", "overrides"]
    assert parameter_names(namespace, exclude=("lr", "overrides")) == ["checkpoint", "steps", "scales"]
