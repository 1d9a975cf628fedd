"""The fine-tuning stopping rule: validation loss every K steps, patience, tolerance, best weights kept."""
import pytest
import torch

from conftest import caption_items, small_model
from mdc.absorbing import Masking
from mdc.eval import captioning as cap
from mdc.eval.caption_finetune import StopRule, validation_loss


def _items(tmp_path, n=4, offset=0):
    return caption_items(tmp_path, n, lambda i: (60 * i % 255, 90, 200), offset=offset)


def test_the_rule_stops_after_patience_evaluations_without_a_relative_improvement():
    losses = iter([3.0, 2.5, 2.48, 2.49, 2.485, 1.0])
    rule = StopRule(lambda: next(losses), every=10, patience=3, tolerance=0.01)
    model = torch.nn.Linear(2, 2)
    stop = next(s for s in range(0, 60) if rule.check(model, s))
    # 2.5 beats 3.0 by more than 1%; 2.48, 2.49, 2.485 do not beat 2.5 by 1% (2.475): the third of them stops it
    assert stop == 40 and rule.history == [(0, 3.0), (10, 2.5), (20, 2.48), (30, 2.49), (40, 2.485)]
    assert rule.best_step == 20 and rule.lowest == 2.48  # the lowest loss's weights are kept
    assert StopRule(lambda: 1.0, every=10, patience=3, tolerance=0.0).check(model, 7, last=True) is False


def test_validation_loss_is_the_same_draw_at_every_call(tmp_path):
    model = small_model("mdc").eval()
    val = _items(tmp_path)
    a, b = validation_loss(model, val, batch_size=3), validation_loss(model, val, batch_size=3)
    assert a == b and a > 0 and not model.training


def test_finetune_stops_at_a_plateau_and_keeps_the_best_weights(tmp_path):
    torch.manual_seed(0)
    train, val = _items(tmp_path), _items(tmp_path, 2, offset=10)
    model = small_model("arc")
    model, log = cap.finetune(model, train, val_items=val, steps=200, batch_size=4, lr=3e-3, eval_every=5,
                              patience=2, tolerance=0.01)
    steps = [s for s, _ in log["val"]]
    assert steps[0] == 0 and all(b - a == 5 for a, b in zip(steps, steps[1:]))
    assert log["stopped"] == "plateau" and len(log["loss"]) == steps[-1] < 200
    best = min(loss for _, loss in log["val"])
    assert dict(map(tuple, log["val"]))[log["best_step"]] == best
    assert validation_loss(model, val, batch_size=4) == pytest.approx(best, rel=1e-5)  # its weights are back
    capped = cap.finetune(small_model("arc"), train, val_items=val, steps=6, batch_size=4, lr=1e-3, eval_every=4)[1]
    assert capped["stopped"] == "cap" and [s for s, _ in capped["val"]] == [0, 4, 6]


def test_the_rule_needs_validation_items(tmp_path):
    with pytest.raises(ValueError, match="val_items"):
        cap.finetune(small_model("arc"), _items(tmp_path), steps=3, eval_every=2)
    with pytest.raises(ValueError, match="patience"):
        cap.finetune(small_model("arc"), _items(tmp_path), val_items=_items(tmp_path), steps=3, eval_every=2,
                     patience=0)


def test_mdc_fine_tunes_at_the_t_interval_asked_and_arc_refuses_one(tmp_path, monkeypatch):
    drawn, sample = [], Masking.sample
    monkeypatch.setattr(Masking, "sample", lambda self, *a, **k: drawn.append(sample(self, *a, **k)) or drawn[-1])
    items = _items(tmp_path)
    pretrained = small_model("mdc")
    model, _ = cap.finetune(pretrained, items, steps=8, batch_size=4, lr=1e-3, t_interval=[0.0, 1.0])
    t = torch.cat(drawn)  # [8 steps x 4]
    assert model.config.t_interval == (0.0, 1.0) and t.min() < 0.5 and len(t) == 32  # pretrained: U[0.5, 1]
    with pytest.raises(ValueError, match="t_interval must satisfy"):
        cap.finetune(small_model("mdc"), items, steps=1, t_interval=(0.8, 0.2))
    with pytest.raises(ValueError, match="t_interval sets MDC's masking.*'arc'"):
        cap.finetune(small_model("arc"), items, steps=1, t_interval=(0.0, 1.0))
