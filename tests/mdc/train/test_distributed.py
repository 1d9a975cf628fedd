"""DDP on CPU (gloo) under torchrun: ranks stay in sync; the CLIP loss and gradient are global-batch exact,
with and without gradient accumulation."""
import json
import os
import subprocess
import sys
import textwrap

import pytest
import torch
from safetensors.torch import load_file

import mdc
from mdc.world.scenes import vocabulary, write_shards
from conftest import SMALL, SUBPROCESS_ENV, clip_batch

TRAIN_SCRIPT = textwrap.dedent('''
    """Train under torchrun; every rank also dumps its in-memory weights at each checkpoint, and counts
    its native threads (not Python's) before and after the training."""
    import json, os, sys, threading, time
    from safetensors.torch import save_file
    import mdc.train

    out, kwargs = sys.argv[1], json.loads(sys.argv[2])
    save = mdc.train.loop._save

    def dump_then_save(cfg, step, model, *rest):
        state = {k: v.detach().contiguous() for k, v in model.state_dict().items()}
        save_file(state, os.path.join(out, f"rank{os.environ['RANK']}_step{step}.safetensors"))
        return save(cfg, step, model, *rest)

    mdc.train.loop._save = dump_then_save
    native = lambda: len(os.listdir("/proc/self/task")) - threading.active_count()

    def settled(before, seconds=10.0):
        """Native threads once those on their way out are gone: a Python thread that has left threading's
        registry stays in /proc/self/task until its OS thread exits, longer on a loaded machine (the
        DataLoader closes its queues without joining their feeder threads); a gloo thread left behind stays."""
        deadline = time.monotonic() + seconds
        while native() > before and time.monotonic() < deadline:
            time.sleep(0.05)
        return native()

    before = native()
    results = mdc.train.train(**kwargs)
    results["threads"] = [before, settled(before)]
    with open(os.path.join(out, f"results{os.environ['RANK']}.json"), "w") as f:
        json.dump(results, f)
''')

EPOCH_SCRIPT = textwrap.dedent('''
    """Several runs in one process group; each rank records (data epoch, sample keys) of every micro-batch."""
    import json, os, sys
    import torch.distributed as dist
    import mdc.train

    out, runs = sys.argv[1], json.loads(sys.argv[2])
    dist.init_process_group("gloo")
    current, log = {}, []
    iterate, take = mdc.train.stream.iterate_batches, mdc.train.DataStream.next

    def tapped(loader, *args, **kw):  # remember the keys of the loader batch handed on last
        def tap():
            for batch in loader:
                current["keys"] = batch[2]["keys"]
                yield batch
        return iterate(tap(), *args, **kw)

    def recording(self):
        batch = take(self)
        log.append([self.epoch, current["keys"]])
        return batch

    mdc.train.stream.iterate_batches, mdc.train.DataStream.next = tapped, recording
    for name, kwargs in runs.items():
        log.clear()
        mdc.train.train(**kwargs)
        with open(os.path.join(out, f"{name}{dist.get_rank()}.json"), "w") as f:
            json.dump(log, f)
    dist.destroy_process_group()
''')

CLIP_SCRIPT = textwrap.dedent('''
    """Each of 2 ranks takes half of a batch of 8; DDP-wrapped CLIP loss, then backward (float64: exactness is
    checked, not float32 rounding, which differs with the order of the sums and the CPU's kernels)."""
    import json, os, sys
    import torch
    import torch.distributed as dist
    import mdc
    from mdc.train import LossModule, accumulate

    out, overrides = sys.argv[1], json.loads(sys.argv[2])
    images, captions = torch.load(os.path.join(out, "batch.pt"))  # the test's global batch (conftest.clip_batch)
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = mdc.create_model("tiny", "clip", **overrides).double()
    tokens = model.tokenizer(captions)
    half = slice(4 * rank, 4 * rank + 4)
    net = torch.nn.parallel.DistributedDataParallel(LossModule(model))
    loss = net(images[half], tokens[half])
    loss.backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters()}
    # the same global batch of 8 as 2 ranks x 2 micro-batches of 2, accumulated
    model.zero_grad(set_to_none=True)
    micro = [(images[half][i : i + 2], tokens[half][i : i + 2]) for i in (0, 2)]
    accum_loss = accumulate(net, model, micro, ddp=net)
    accum_grads = {n: p.grad for n, p in model.named_parameters()}
    torch.save({"loss": loss.detach(), "grads": grads, "accum_loss": accum_loss, "accum_grads": accum_grads},
               os.path.join(out, f"clip{rank}.pt"))
    dist.destroy_process_group()
''')


COUNT_SCRIPT = textwrap.dedent('''
    """count_samples under DDP: rank 0 alone counts; an error reaches every rank."""
    import json, os, sys
    import torch.distributed as dist
    import mdc.train

    out, pattern = sys.argv[1], sys.argv[2]
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    if rank == 1:
        mdc.train.stream.tarfile.open = lambda *a, **k: 1 / 0  # rank 1 must not read the shards
    result = {"count": mdc.train.count_samples(pattern)}
    try:
        mdc.train.count_samples("pipe:cat x.tar")
    except ValueError as exn:
        result["error"] = str(exn)
    with open(os.path.join(out, f"count{rank}.json"), "w") as f:
        json.dump(result, f)
    dist.destroy_process_group()
''')


COMPILED_SCRIPT = textwrap.dedent('''
    """One run eager, then compiled (aot_eager: Dynamo's graphs and AOTAutograd's, no code generation), both with the
    compiled run's caption-length buckets and DDP gradient buckets of 16 kB, in one process group; each rank writes
    what the loop wrapped and the buckets Dynamo's DDP optimizer cut the compiled loss at."""
    import functools, json, os, sys
    import torch
    import torch.distributed as dist
    from torch._dynamo.backends import distributed as ddp_optimizer
    import mdc.train
    from mdc.train import loop, stream

    out, kwargs = sys.argv[1], json.loads(sys.argv[2])
    make, compile_, wrap = stream.make_loader, functools.partial(torch.compile, backend="aot_eager"), loop._wrap
    stream.make_loader = lambda *a, **kw: make(*a, **{**kw, "trim_multiple": 16})
    torch.compile = lambda model, **kw: compile_(model, **kw)
    loop.nn.parallel.DistributedDataParallel = functools.partial(torch.nn.parallel.DistributedDataParallel,
                                                                 bucket_cap_mb=0.016)
    dist._DEFAULT_FIRST_BUCKET_BYTES = 16 * 1024  # the first bucket no larger than the others (DDP's rule)
    wrapped, cut, split = {}, [], ddp_optimizer.DDPOptimizer.compile_fn

    def recording(cfg, *args):
        net, ddp = wrap(cfg, *args)
        inner = getattr(net, "module", net)
        wrapped[f"compile={cfg.compile}"] = [type(net).__name__, type(inner).__name__]
        return net, ddp

    def cutting(self, gm, inputs):
        compiled = split(self, gm, inputs)
        cut.append(len(self.buckets))
        return compiled

    loop._wrap, ddp_optimizer.DDPOptimizer.compile_fn = recording, cutting
    dist.init_process_group("gloo")
    for compiled in (False, True):
        mdc.train.train(**kwargs, compile=compiled, output_dir=os.path.join(out, f"compile{compiled}"))
    with open(os.path.join(out, f"wrapped{dist.get_rank()}.json"), "w") as f:
        json.dump({**wrapped, "buckets": cut}, f)
    dist.destroy_process_group()
''')


def _torchrun(script_path, *args):
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", str(script_path), *args]
    done = subprocess.run(cmd, capture_output=True, text=True, env=SUBPROCESS_ENV, timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]


def test_ddp_training_keeps_ranks_identical(tmp_path):
    write_shards(str(tmp_path / "shards"), 64, "alt", seed=0, image_size=32, shard_size=16)
    kwargs = dict(train_data=str(tmp_path / "shards" / "{000000..000003}.tar"), output_dir=str(tmp_path / "run"),
                  model_overrides=SMALL | {"vocab": list(vocabulary()), "context_length": 32},
                  steps=4, batch_size=4, accum_steps=2, save_every=2, workers=1, shuffle_buffer=8, lr=1e-3)
    script = tmp_path / "train_ddp.py"
    script.write_text(TRAIN_SCRIPT)
    _torchrun(script, str(tmp_path), json.dumps(kwargs))

    results = [json.loads((tmp_path / f"results{r}.json").read_text()) for r in (0, 1)]
    assert results[0]["world_size"] == 2 and results[0]["global_batch"] == 16 and results[0]["steps"] == 4
    assert results[0]["final_loss"] == results[1]["final_loss"]  # the loss is averaged over ranks
    saved = load_file(os.path.join(results[0]["checkpoint"], "model.safetensors"))
    initial = mdc.create_model("tiny", **kwargs["model_overrides"]).state_dict()
    for step in (2, 4):
        w0, w1 = (load_file(tmp_path / f"rank{r}_step{step}.safetensors") for r in (0, 1))
        for name in w0:
            assert torch.equal(w0[name], w1[name]), (step, name)
    assert all(torch.equal(saved[n], w0[n]) for n in w0)
    assert any(not torch.equal(saved[n], initial[n]) for n in w0)  # it did train
    rows = [json.loads(line) for line in open(tmp_path / "run" / "metrics.jsonl")]
    assert [r["step"] for r in rows] == [1, 2, 3, 4]  # rank 0 alone writes the log
    # train() leaves no gloo thread behind: one alive at exit can abort a run that succeeded (SIGABRT)
    # while the interpreter shuts down
    assert [r["threads"][1] for r in results] == [r["threads"][0] for r in results], results


def test_a_compiled_step_under_ddp_all_reduces_bucket_by_bucket_and_equals_the_eager_one(tmp_path):
    """The compiled loss sits inside DDP, whose forward marks itself active: Dynamo's DDP optimizer then cuts the one
    graph at DDP's gradient buckets, so each bucket's all-reduce starts while the rest of the backward runs (the
    overlap PyTorch documents for compile(DDP(model)), which here would break the fullgraph at DDP's bookkeeping).
    Two ranks with accumulation (no_sync on the first micro-step): the compiled run's losses and weights are the
    eager run's, bit for bit."""
    write_shards(str(tmp_path / "shards"), 64, "alt", seed=0, image_size=32, shard_size=16)
    kwargs = dict(train_data=str(tmp_path / "shards" / "{000000..000003}.tar"),
                  model_overrides=SMALL | {"vocab": list(vocabulary()), "context_length": 32}, precision="fp32",
                  steps=3, batch_size=4, accum_steps=2, save_every=3, workers=0, shuffle_buffer=8, lr=1e-3,
                  progress=False)
    script = tmp_path / "compiled_ddp.py"
    script.write_text(COMPILED_SCRIPT)
    _torchrun(script, str(tmp_path), json.dumps(kwargs))
    for rank in (0, 1):
        wrapped = json.loads((tmp_path / f"wrapped{rank}.json").read_text())
        assert wrapped["compile=False"] == ["DistributedDataParallel", "LossModule"]
        assert wrapped["compile=True"] == ["DistributedDataParallel", "OptimizedModule"]
        assert wrapped["buckets"] and min(wrapped["buckets"]) > 1, wrapped  # one graph, cut at each bucket
    eager, compiled = ([json.loads(line)["loss"] for line in open(tmp_path / f"compile{c}" / "metrics.jsonl")]
                       for c in (False, True))
    assert compiled == eager and len(eager) == 3
    a, b = (load_file(os.path.join(tmp_path / f"compile{c}", "checkpoints", "step_000003", "model.safetensors"))
            for c in (False, True))
    assert all(torch.equal(a[n], b[n]) for n in a)


def test_clip_loss_on_two_ranks_equals_single_process_on_the_whole_batch(tmp_path):
    images, captions = clip_batch(torch.float64)
    torch.save((images, captions), tmp_path / "batch.pt")
    script = tmp_path / "clip_ddp.py"
    script.write_text(CLIP_SCRIPT)
    _torchrun(script, str(tmp_path), json.dumps(SMALL))

    torch.manual_seed(0)
    model = mdc.create_model("tiny", "clip", **SMALL).double()
    loss = model.loss(images, model.tokenizer(captions))
    loss.backward()
    for rank in (0, 1):
        got = torch.load(tmp_path / f"clip{rank}.pt", weights_only=True)
        for suffix in ("", "accum_"):  # one micro-batch per rank; two accumulated micro-batches per rank
            # accumulate returns the step's loss in float32 (the logged value); DDP's loss and the gradients: float64
            torch.testing.assert_close(got[suffix + "loss"].double(), loss.detach(), rtol=1e-6, atol=1e-6)
            for name, p in model.named_parameters():  # DDP's average of the ranks' gradients
                torch.testing.assert_close(got[suffix + "grads"][name], p.grad, rtol=1e-9, atol=1e-12,
                                           msg=suffix + name)


def test_ddp_ranks_start_each_data_epoch_together_and_split_it(tmp_path):
    """(a) 3 shards on 2 ranks: one rank's pass ends first, both start the next epoch at the same step.
    (b) 1 shard for 2 ranks x 2 workers: split by sample, every sample exactly once per epoch."""
    write_shards(str(tmp_path / "three"), 24, "alt", seed=0, image_size=32, shard_size=8)
    write_shards(str(tmp_path / "one"), 24, "alt", seed=0, image_size=32, shard_size=24)
    common = dict(model_overrides=SMALL | {"vocab": list(vocabulary()), "context_length": 32}, shuffle_buffer=4,
                  save_every=100, lr=1e-3)
    runs = {
        "three": dict(common, train_data=str(tmp_path / "three" / "{000000..000002}.tar"), workers=1, batch_size=4,
                      steps=6, output_dir=str(tmp_path / "run_three")),
        "one": dict(common, train_data=str(tmp_path / "one" / "000000.tar"), workers=2, batch_size=3, steps=8,
                    output_dir=str(tmp_path / "run_one")),
    }
    script = tmp_path / "epochs_ddp.py"
    script.write_text(EPOCH_SCRIPT)
    _torchrun(script, str(tmp_path), json.dumps(runs))

    every_key = {f"{i:09d}" for i in range(24)}
    for name in runs:
        logs = [json.loads((tmp_path / f"{name}{r}.json").read_text()) for r in (0, 1)]
        assert [e for e, _ in logs[0]] == [e for e, _ in logs[1]], name  # the same epoch at every micro-batch
        epochs = sorted({e for e, _ in logs[0]})
        assert epochs == [0, 1, 2] if name == "three" else [0, 1], name
        for epoch in epochs:
            keys = [[k for e, batch in log if e == epoch for k in batch] for log in logs]  # per rank
            assert not set(keys[0]) & set(keys[1]), (name, epoch)  # disjoint
            assert all(len(set(k)) == len(k) for k in keys), (name, epoch)  # no repeat within the epoch
            assert set(keys[0]) | set(keys[1]) <= every_key
            if name == "one":  # split by sample: the two ranks together cover the epoch
                assert sorted(keys[0] + keys[1]) == sorted(every_key), epoch
    rows = [json.loads(line) for line in open(tmp_path / "run_one" / "metrics.jsonl")]
    assert [r["epoch"] for r in rows] == [0, 0, 0, 0, 1, 1, 1, 1]


def test_samples_are_counted_once_under_ddp(tmp_path):
    write_shards(str(tmp_path), 30, "alt", seed=0, image_size=32, shard_size=16)
    script = tmp_path / "count_ddp.py"
    script.write_text(COUNT_SCRIPT)
    _torchrun(script, str(tmp_path), str(tmp_path / "{000000..000001}.tar"))
    for rank in (0, 1):
        result = json.loads((tmp_path / f"count{rank}.json").read_text())
        assert result["count"] == 30 and "not a local file" in result["error"]


def test_more_processes_than_gpus_is_refused_by_name():
    """A node given more torchrun processes than GPUs: the rank without one is told so, not 'invalid device ordinal'
    mid-start (found on a 1-GPU machine)."""
    from mdc.train.distributed import local_cuda_device

    assert local_cuda_device(0, 1) == torch.device("cuda", 0)
    with pytest.raises(RuntimeError, match=r"LOCAL_RANK 1 has no GPU: this node has 1 CUDA device.*nproc_per_node 1"):
        local_cuda_device(1, 1)
