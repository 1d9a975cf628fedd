"""Unknown words in training captions are counted, logged and warned about; --vocab-from-data removes them."""
import json
import logging

import pytest

import mdc
from mdc.data.writer import write_tar
from mdc.train import TrainConfig, train
from conftest import TRAIN_MODEL, png

WORDS = "a zebra grazes beside the red circle under an acacia tree near the blue square".split()


def captions(n=32):
    """Captions mixing scene-world words with words the scene vocabulary lacks; two are over-long."""
    out = [" ".join(WORDS[i % 5 :] + WORDS[: i % 5]) for i in range(n)]
    out[3] = out[7] = " ".join(WORDS * 3)  # about 45 tokens > context 32: truncated
    return out


@pytest.fixture(scope="module")
def shard(tmp_path_factory):
    members = []
    for i, text in enumerate(captions()):
        members += [(f"{i:04d}.png", png((7 * i % 256, 40, 200))), (f"{i:04d}.txt", text.encode())]
    return write_tar(str(tmp_path_factory.mktemp("text") / "000000.tar"), members)


pytestmark = pytest.mark.usefixtures("one_thread")  # fast on a busy 2-core machine, bitwise comparable


def args(shard, out, **kw):
    return dict(train_data=shard, output_dir=str(out), model_overrides=TRAIN_MODEL, batch_size=8, steps=4, workers=1,
                shuffle_buffer=8, lr=1e-3) | kw


def rows(results):
    return [json.loads(line) for line in open(results["metrics"])]


def test_unknown_words_are_logged_and_warned_about(shard, tmp_path, caplog):
    tokens, expected = mdc.get_tokenizer(context_length=32, vocab=TRAIN_MODEL["vocab"]).tokenize(captions())
    assert 0.1 < expected.unknown_rate < 0.9 and expected.tokens > 300
    with caplog.at_level(logging.WARNING, logger="mdc.train"):
        results = train(**args(shard, tmp_path / "run"))  # 4 steps of 8: one pass over the 32 captions
    last = rows(results)[-1]
    assert last["unk_rate"] == pytest.approx(expected.unknown_rate)
    assert last["truncated"] == expected.truncated == 2
    assert results["unk_rate"] == pytest.approx(expected.unknown_rate)
    warned = [r.getMessage() for r in caplog.records if "--vocab-from-data" in r.getMessage()]
    assert len(warned) == 1 and "unknown" in warned[0] and "%" in warned[0]


def test_resume_keeps_counting(shard, tmp_path):
    full = train(**args(shard, tmp_path / "full"))
    run = tmp_path / "run"
    train(**args(shard, run, save_every=2))
    (run / "checkpoints" / "latest.json").write_text(json.dumps({"step": 2, "path": "step_000002"}))
    resumed = train(**args(shard, run, save_every=2, resume=True))
    assert rows(resumed)[-1]["unk_rate"] == rows(full)[-1]["unk_rate"]
    assert rows(resumed)[-1]["truncated"] == rows(full)[-1]["truncated"]


def test_vocab_from_data_covers_the_training_captions(shard, tmp_path, caplog):
    overrides = {k: v for k, v in TRAIN_MODEL.items() if k != "vocab"}
    with caplog.at_level(logging.WARNING, logger="mdc.train"):
        results = train(**args(shard, tmp_path / "run", model_overrides=overrides, vocab_from_data=True))
    assert all(r["unk_rate"] == 0 for r in rows(results))
    assert not [r for r in caplog.records if "--vocab-from-data" in r.getMessage()]
    model = mdc.load(results["checkpoint"])
    assert model.config.vocab is not None and model.tokenizer.tokenize(captions())[1].unknown == 0
    assert model.tokenizer.vocab_size < 200  # compact: the captions' ids, not CLIP's 49,409


def test_vocab_from_data_refuses_a_vocab_override_and_remote_shards(shard):
    with pytest.raises(ValueError, match="vocab_from_data.*'vocab'"):
        TrainConfig(shard, "y", steps=2, model_overrides=TRAIN_MODEL, vocab_from_data=True).resolved(1)
    with pytest.raises(ValueError, match="vocab_from_data.*'pipe:cat x.tar'.*not a local file"):
        TrainConfig("pipe:cat x.tar", "y", steps=2, vocab_from_data=True).resolved(1)
