"""Every bad value is refused, never replaced: the Python API raises a ConfigError naming the option
and the value; the command lines print one line, ``error: --flag ...``, and exit 2 (argparse's
convention), with the traceback only under ``--debug`` or ``MDC_DEBUG=1``."""
import subprocess
import sys

import pytest

from mdc.base.errors import ConfigError
from mdc.train import TrainConfig
from mdc.train.cli import main
from conftest import SUBPROCESS_ENV

BASE = dict(train_data="x.tar", output_dir="out", steps=10, warmup_steps=1)


@pytest.fixture(autouse=True)
def _in_tmp(tmp_path, monkeypatch):
    """Relative paths land in tmp_path, should a bad value ever be let through."""
    monkeypatch.chdir(tmp_path)


def _resolve(**kw):
    return TrainConfig(**{**BASE, **kw}).resolved(world_size=1)


# (keyword arguments, the message the API gives); each must be refused before anything runs
BAD = [
    (dict(batch_size=0), "batch_size must be >= 1, got 0"),
    (dict(batch_size=-4), "batch_size must be >= 1, got -4"),
    (dict(accum_steps=0), "accum_steps must be >= 1, got 0"),
    (dict(steps=0), "steps must be >= 1, got 0"),  # not a warm-up problem
    (dict(steps=-3), "steps must be >= 1, got -3"),
    (dict(steps=None, epochs=0, samples_per_epoch=10), "epochs must be >= 1, got 0"),
    (dict(samples_per_epoch=0), "samples_per_epoch must be >= 1, got 0"),
    (dict(global_batch=0), "global_batch must be >= 1, got 0"),
    (dict(lr=0.0), "lr must be > 0, got 0.0"),
    (dict(lr=-1e-3), "lr must be > 0, got -0.001"),
    (dict(lr=float("nan")), "lr must be a finite number, got nan"),
    (dict(weight_decay=-0.1), "weight_decay must be >= 0, got -0.1"),
    (dict(warmup_steps=-1), "warmup_steps must be >= 0, got -1"),
    (dict(grad_clip_norm=0.0), "grad_clip_norm must be > 0, got 0.0"),
    (dict(seed=-1), "seed must be >= 0, got -1"),
    (dict(workers=-1), "workers must be >= 0, got -1"),
    (dict(shuffle_buffer=0), "shuffle_buffer must be >= 1, got 0"),
    (dict(save_every=0), "save_every must be >= 1, got 0"),
    (dict(log_every=-2), "log_every must be >= 1, got -2"),
    (dict(keep_last=0), "keep_last must be >= 1, got 0"),
    (dict(batch_size="8"), "batch_size must be an integer, got '8'"),
    (dict(mask_ratio=0.0), r"mask_ratio must be in \(0, 1\], got 0.0"),
    (dict(mask_ratio=1.5), r"mask_ratio must be in \(0, 1\], got 1.5"),
    (dict(t_interval=(0.9, 0.1)), r"t_interval must satisfy 0 <= W_L <= W_U <= 1 and W_U > 0, got \(0.9, 0.1\)"),
    (dict(objective="bert"), "objective must be one of 'mdc', 'arc', 'clip', got 'bert'"),
    (dict(model="vit-h-14"), "model must be one of .*'tiny'.*, got 'vit-h-14'"),
    (dict(output_dir=""), "output_dir must not be empty"),
    (dict(model_overrides=[1, 2]), r"model_overrides must be a dict \(a JSON object\), got \[1, 2\]"),
    # widths that the head count does not divide: refused here, not a bare AssertionError from timm
    (dict(model_overrides={"vision_width": 90}), "model_overrides: vision_width 90 is not divisible by vision_heads 4"),
    (dict(model_overrides={"text_width": 64, "text_heads": 3}), "model_overrides: text_width 64 is not divisible "
                                                                  "by text_heads 3"),
    (dict(model_overrides={"vision_layers": 0}), "model_overrides: vision_layers must be >= 1, got 0"),
    # contradictory options
    (dict(force_resume=True), "force_resume continues a run that resume finds; it needs resume"),
    (dict(model_overrides={"time_weighting": False}), "model_overrides sets time_weighting, which has its own option"),
    (dict(model_overrides={"objective": "arc"}), "model_overrides sets objective, which has its own option"),
]


@pytest.mark.parametrize("kw, message", BAD, ids=[str(kw) for kw, _ in BAD])
def test_bad_values_are_refused_naming_the_option_and_value(kw, message):
    with pytest.raises(ConfigError, match=message) as info:
        _resolve(**kw)
    assert isinstance(info.value, ValueError)  # callers catching ValueError keep working


def test_no_default_replaces_a_value_the_user_gave():
    c = _resolve(batch_size=3, accum_steps=2)
    assert (c.batch_size, c.accum_steps) == (3, 2)
    c = _resolve()  # and what the user left out is filled in
    assert (c.batch_size, c.accum_steps, c.model) == (32, 1, "tiny")


def _one_line_error(argv, capsys, code=2):
    with pytest.raises(SystemExit) as info:
        main(argv)
    err = capsys.readouterr().err.strip().splitlines()
    assert info.value.code == code, err
    assert len(err) == 1, err
    return err[0]


REQUIRED = ["--train-data", "x.tar", "--output-dir", "out"]


@pytest.mark.parametrize("argv, line", [
    (["--batch-size", "0", "--steps", "5"], "error: --batch-size must be >= 1, got 0"),
    (["--accum-steps", "0", "--steps", "5"], "error: --accum-steps must be >= 1, got 0"),
    (["--steps", "0"], "error: --steps must be >= 1, got 0"),
    (["--steps", "10", "--warmup-steps", "10"], "error: --warmup-steps 10 >= --steps 10: the learning rate"),
    (["--steps", "5", "--model-overrides", '{"vision_width": 90}'],
     "error: --model-overrides: vision_width 90 is not divisible by vision_heads 4"),
    (["--steps", "5", "--force-resume"], "error: --force-resume continues a run that --resume finds; it needs --resume"),
    (["--steps", "5", "--objective", "arc", "--mask-ratio", "0.5"],
     "error: --mask-ratio applies to the mdc objective only, not arc"),
    (["--steps", "5", "--mask-ratio", "0.5", "--t-interval", "0.2", "0.8"],
     "error: --mask-ratio fixes the mask ratio; --t-interval contradicts it"),
    (["--steps", "x"], "error: argument --steps: invalid int value: 'x'"),
    (["--steps", "5", "--epochs", "2"], "error: argument --epochs: not allowed with argument --steps"),
])
def test_command_line_prints_one_line_and_exits_2(argv, line, capsys, monkeypatch):
    monkeypatch.delenv("MDC_DEBUG", raising=False)
    assert _one_line_error(REQUIRED + argv, capsys).startswith(line)


def test_debug_shows_the_traceback(capsys, monkeypatch):
    monkeypatch.delenv("MDC_DEBUG", raising=False)
    with pytest.raises(ConfigError, match="batch_size must be >= 1, got 0"):
        main(REQUIRED + ["--steps", "5", "--batch-size", "0", "--debug"])
    monkeypatch.setenv("MDC_DEBUG", "1")
    with pytest.raises(ConfigError):
        main(REQUIRED + ["--steps", "5", "--batch-size", "0"])


def test_the_real_command_line(tmp_path):
    """python -m mdc.train: one line on stderr, exit 2, nothing written; MDC_DEBUG=1 gives the traceback."""
    cmd = [sys.executable, "-m", "mdc.train", "--train-data", "x.tar", "--output-dir", str(tmp_path / "run"),
           "--steps", "5", "--batch-size", "0"]
    done = subprocess.run(cmd, capture_output=True, text=True, env=SUBPROCESS_ENV, timeout=300)
    assert done.returncode == 2 and done.stderr.strip() == "error: --batch-size must be >= 1, got 0", done.stderr
    assert not (tmp_path / "run").exists()
    done = subprocess.run(cmd, capture_output=True, text=True, env=SUBPROCESS_ENV | {"MDC_DEBUG": "1"}, timeout=300)
    assert done.returncode != 0 and "Traceback" in done.stderr and "ConfigError" in done.stderr


def test_missing_shards_are_refused_before_anything_is_written(tmp_path):
    """Shards that do not exist: one line naming the first missing one and how many are missing, exit 2,
    no run folder (not a traceback after the run started)."""
    out = tmp_path / "run"
    cmd = [sys.executable, "-m", "mdc.train", "--model", "tiny", "--objective", "mdc", "--train-data",
           str(tmp_path / "data" / "{000000..000002}.tar"), "--steps", "2", "--output-dir", str(out)]
    done = subprocess.run(cmd, capture_output=True, text=True, env=SUBPROCESS_ENV, timeout=300)
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 2 and len(lines) == 1, done.stderr
    assert lines[0].startswith("error: --train-data") and "3 of 3" in lines[0], lines
    assert str(tmp_path / "data" / "000000.tar") in lines[0]
    assert not out.exists()


def test_only_local_shards_are_checked(tmp_path):
    from mdc.train.stream import check_shards

    (tmp_path / "000000.tar").write_bytes(b"")
    check_shards(f"{tmp_path}/000000.tar::pipe:cat {tmp_path}/x.tar::https://example.org/{{0..3}}.tar")
    with pytest.raises(ConfigError, match=r"train_data: 1 of 2 shards do not exist, the first: '.*000001.tar'"):
        check_shards(f"{tmp_path}/{{000000..000001}}.tar")


def test_every_mode_that_replays_cuda_graphs_is_handled_as_graphs():
    """inductor's max-autotune also captures CUDA graphs: its step is marked like reduce-overhead's; a graphed
    step under several processes says in one line at start what its figures were measured on."""
    from mdc.train.loop import graphs_note

    base = dict(train_data="x.tar", output_dir="out")
    assert not TrainConfig(**base).captures_graphs()
    assert not TrainConfig(**base, compile=True).captures_graphs()
    for mode in ("reduce-overhead", "max-autotune"):
        cfg = TrainConfig(**base, compile=True, compile_mode=mode)
        assert cfg.captures_graphs() and graphs_note(cfg, 1) is None
        assert "never measured across several" in graphs_note(cfg, 8) and "8 processes" in graphs_note(cfg, 8)
    assert graphs_note(TrainConfig(**base), 8) is None
