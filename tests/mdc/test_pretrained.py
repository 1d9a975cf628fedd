"""The trained weights shipped in mdc/pretrained/: loaded by name, refused clearly when missing or corrupt,
the float16 of the reference run's kept checkpoints, and as good as their records say.

The probe check writes the `mini` profile's probe sets (evaluation seed 1, 64 px, 3,000 training images per
task and the test images of mdc.world.evalsets.PROBE_TEST_ITEMS, 2,560 for shape: what data/evalsets holds) and
probes the `shape` task, the one the three objectives learn most differently (MDC 34.3%, ARC 39.5%, CLIP 28.9%;
random init 13.2%), with the pooled protocol of the records (10 epochs, seed 0). Float16 moved one test item
of 2,560 for MDC and none for ARC or CLIP. The tolerance is 1 point (about 26 items).
"""
import json
import os
import shutil

import pytest
import torch

import mdc
from mdc import factory
from mdc.base.errors import ConfigError, WeightsError
from mdc.eval.probe import ProbeConfig, dataset_fns, probe_datasets, synthetic_roots
from mdc.world.evalsets import write_evalsets
from reproduce import pretrained
from reproduce.running import ledger

RECORDS = os.path.join(ledger.ROOT, "reproduce", "records", "mini")
OBJECTIVES = ("mdc", "arc", "clip")
TOLERANCE = 0.01  # probe top-1, as a fraction


def test_every_objective_of_mini_is_shipped_and_loads_in_eval_mode():
    assert sorted(mdc.list_pretrained()) == sorted(("mini", o, "synthetic") for o in OBJECTIVES)
    images = torch.zeros(2, 3, 64, 64)
    for name, objective, tag in mdc.list_pretrained():
        model = mdc.create_model(name, objective, pretrained=tag)
        assert (model.config.name, model.config.objective, model.training) == (name, objective, False)
        assert next(model.parameters()).dtype == torch.float32  # stored in float16, computed in float32
        assert model.encode_image(images).shape == (2, 128)
    model, preprocess = mdc.create_model_and_transforms("mini", "arc", pretrained="synthetic")
    assert model.config.objective == "arc" and preprocess is not None


def test_an_unknown_tag_or_an_override_is_refused_naming_it():
    with pytest.raises(ConfigError, match="no pretrained weights 'laion' for model 'mini'.*shipped"):
        mdc.create_model("mini", "mdc", pretrained="laion")
    with pytest.raises(ConfigError, match="no pretrained weights 'synthetic' for model 'tiny'"):
        mdc.create_model("tiny", "mdc", pretrained="synthetic")
    with pytest.raises(ConfigError, match=r"overrides \['t_interval'\]"):
        mdc.create_model("mini", "mdc", pretrained="synthetic", t_interval=(0.3, 0.8))


@pytest.fixture
def shipped_copy(tmp_path, monkeypatch):
    """A copy of mdc/pretrained that the test may damage."""
    shutil.copytree(factory.PRETRAINED_DIR, tmp_path / "pretrained")
    monkeypatch.setattr(factory, "PRETRAINED_DIR", str(tmp_path / "pretrained"))
    return tmp_path / "pretrained" / "mini-mdc-synthetic"


def test_a_missing_weights_file_is_one_error_naming_it(shipped_copy):
    (shipped_copy / "model.safetensors").unlink()
    with pytest.raises(WeightsError, match=f"missing: {shipped_copy / 'model.safetensors'}"):
        mdc.create_model("mini", "mdc", pretrained="synthetic")


@pytest.mark.parametrize("damage", ["flipped byte", "truncated"])
def test_a_corrupt_weights_file_is_one_error_naming_it(shipped_copy, damage):
    weights = shipped_copy / "model.safetensors"
    data = bytearray(weights.read_bytes())
    if damage == "flipped byte":
        data[-100] ^= 0x01  # a weight's low bit: the file still parses, its digest does not match
    else:
        data = data[: len(data) // 2]
    weights.write_bytes(bytes(data))
    with pytest.raises(WeightsError, match=f"corrupt: {weights}"):
        mdc.create_model("mini", "mdc", pretrained="synthetic")


def test_a_kept_checkpoint_that_is_not_its_record_s_is_not_shipped(tmp_path):
    kept = tmp_path / "kept"
    mdc_run, arc_run = (os.path.join(pretrained.KEPT, "pretrain", f"{o}-descriptive-s0") for o in ("mdc", "arc"))
    shutil.copytree(mdc_run, kept / "pretrain" / "mdc-descriptive-s0")
    shutil.copyfile(os.path.join(arc_run, "model.safetensors"),  # ARC's weights under MDC's name
                    kept / "pretrain" / "mdc-descriptive-s0" / "model.safetensors")
    with pytest.raises(ValueError, match="is not the checkpoint .* that the record of pretrain/mdc-descriptive-s0"):
        pretrained.ship("pretrain/mdc-descriptive-s0", str(tmp_path / "out"), kept=str(kept))


def test_a_checkpoint_that_does_not_parse_is_a_weights_error_naming_it(tmp_path):
    model = mdc.create_model("tiny", "mdc")
    model.save(tmp_path / "ckpt")
    (tmp_path / "ckpt" / "model.safetensors").write_bytes(b"\x08\x00\x00\x00\x00\x00\x00\x00{broken}")
    with pytest.raises(WeightsError, match=f"corrupt: {tmp_path / 'ckpt' / 'model.safetensors'}"):
        mdc.load(tmp_path / "ckpt")


def test_the_shipped_files_are_the_float16_of_the_reference_run_s_kept_checkpoints(tmp_path):
    """python -m reproduce.pretrained writes them byte for byte from reproduce/weights/mini (it refuses a kept
    file that is not the checkpoint its record names), and each folder carries that record."""
    for objective, run in pretrained.SHIPPED.items():
        shipped = os.path.join(factory.PRETRAINED_DIR, f"mini-{objective}-synthetic")
        assert pretrained.ship(run, str(tmp_path / objective)) == factory._PRETRAINED["mini", objective, "synthetic"]
        for name in ("config.json", "model.safetensors", "record.json"):
            with open(os.path.join(shipped, name), "rb") as a, open(tmp_path / objective / name, "rb") as b:
                assert a.read() == b.read(), (objective, name)
        with open(os.path.join(shipped, "record.json")) as f:
            assert json.load(f) == ledger.read(RECORDS, run)


@pytest.fixture(scope="module")
def probe_sets(tmp_path_factory):
    folder = str(tmp_path_factory.mktemp("evalsets"))
    write_evalsets(folder, seed=1, image_size=64, n_probe_train=3000, n_probe_test=None, n_items=1, n_caption_train=0)
    return folder


@pytest.mark.parametrize("objective", OBJECTIVES)
def test_the_shipped_weights_reproduce_their_record_s_probe_accuracy(objective, probe_sets):
    record = ledger.read(RECORDS, f"probe/{objective}-descriptive-s0")
    model = mdc.create_model("mini", objective, pretrained="synthetic")
    assert record["results"]["checkpoint_id"] == model_record(objective)["results"]["checkpoint_id"]
    protocol = {k: record["results"]["parameters"][k] for k in ("batch_size", "epochs", "lr", "weight_decay", "seed")}
    got = probe_datasets(model, dataset_fns(synthetic_roots(probe_sets, ["shape"]), mdc.image_transform(model)),
                         ProbeConfig(**protocol))
    expected = record["results"]["results"]["datasets"]["wds/shape"]["top1"]
    assert abs(got["datasets"]["wds/shape"]["top1"] - expected) <= TOLERANCE, (objective, expected)


def model_record(objective: str) -> dict:
    with open(os.path.join(factory.PRETRAINED_DIR, f"mini-{objective}-synthetic", "record.json")) as f:
        return json.load(f)
