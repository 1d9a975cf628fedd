"""Results files: schema, cleaning of numpy/torch values, checkpoint identity."""
import json

import numpy as np
import pytest
import torch

from mdc.eval.results import SCHEMA, checkpoint_id, read_results, write_results
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
