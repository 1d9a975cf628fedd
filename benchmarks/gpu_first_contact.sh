#!/usr/bin/env bash
# The first contact with a CUDA machine in one command, at most 8 minutes, every file in one folder:
#
#   bash benchmarks/gpu_first_contact.sh [OUT]        (OUT: runs/gpu-first-contact)
#
# Steps, each under its own time limit and with its own log; a failing step does not stop the next:
#   env        the GPU, Python, torch and the packages mdc imports                       -> env.log
#   tests      the CUDA-relevant tests (precision, compile, scoring, probe)              -> tests.log
#   bench      python -m benchmarks gpu: ViT-B/32 MDC, ARC and CLIP training in bf16,
#              eager and compiled (images/s, MFU, peak memory), sampling, scoring        -> bench.log, bench.json
#   torchrun   python -m mdc.train under torchrun (NCCL), a checkpoint, a kill, a resume -> torchrun.log
#   mini-train the mini profile's descriptive shards and MDC pretraining run             -> mini.log
#   mini-eval  its evaluation sets and linear probe (the mdc.eval.probe API)             -> mini.log
# Two steps run only when MDC_GPU_STEPS names them (the static-step check, at most 8 minutes:
#   MDC_GPU_STEPS="env:10 static:330 loader:120" bash benchmarks/gpu_first_contact.sh runs/gpu-static-step):
#   static     python -m benchmarks gpu, training only, MDC: eager, compiled whole and CUDA graphs, with
#              host ms, kernels and GPU-busy ms a step, MFU, and a profile of the eager step (MDC_GPU_PROFILE=0:
#              none; MDC_GPU_OBJECTIVES and MDC_GPU_BATCH as for the bench)                    -> static.log, static.json
#   loader     python -m benchmarks data: the loader's images/s per worker on this machine's cores -> loader.log
# and two only when MDC_GPU_STEPS names them (graphs after torchrun, whose shards and eager run it reuses and is
# put beside):
#   graphs     the torchrun step with CUDA graphs (--compile --compile-mode reduce-overhead): bucketed caption
#              lengths, a kill and a resume, images/s beside eager's, e.g. MDC_GPU_STEPS="env:10 torchrun:75 graphs:180"
#                                                                                                -> torchrun.log
#   twins      the torchrun and graphs steps again, each beside an uninterrupted run of its command: per-step loss
#              differences before the kill and after the resume, e.g. MDC_GPU_STEPS="env:10 twins:300"   -> torchrun.log
# The runs' figures, beside the CPU records of reproduce/records/mini/, go to runs.json, and
# summary.txt lists each step's status and seconds. Scratch data (shards, checkpoints) goes to
# $MDC_GPU_WORK (default: a new temporary folder). The exit status is 0 when every step is ok, else 1;
# without a CUDA device it refuses in one line and exits with status 2. PYTHON (default python3) is the interpreter; the package runs from this
# checkout (PYTHONPATH), with no install step; docs/benchmarks.md says how its few pure-Python
# dependencies travel as wheels to a machine that lacks them (benchmarks/gpu_wheels.sh).
set -u

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
PYTHON=${PYTHON:-python3}
OUT=${1:-runs/gpu-first-contact}

cd "$ROOT" || exit 2
export PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1

# Refuse at once, in one line, where there is no CUDA device (or no torch).
reason=$("$PYTHON" -c 'import torch
print("" if torch.cuda.is_available() else "no CUDA device (torch %s, built %s)" % (
    torch.__version__, "with CUDA " + torch.version.cuda if torch.version.cuda else "without CUDA"))' 2>/dev/null) \
    || reason="no CUDA device: $PYTHON cannot import torch"
if [ -n "$reason" ]; then
    echo "$reason; benchmarks/gpu_first_contact.sh needs a CUDA machine" >&2
    exit 2
fi

mkdir -p "$OUT" || exit 2
OUT=$(cd "$OUT" && pwd)
WORK=${MDC_GPU_WORK:-$(mktemp -d)}
mkdir -p "$WORK" || exit 2
SUMMARY="$OUT/summary.txt"
printf '%-11s %-10s %8s %6s  %s\n' step status seconds limit log > "$SUMMARY"
failed=0

# step NAME LIMIT LOG COMMAND...: run COMMAND for at most LIMIT seconds, its output appended to OUT/LOG,
# and add its line to the summary (ok, failed (exit status), or timed out).
step() {
    local name=$1 limit=$2 log=$3 start rc status
    shift 3
    echo "== $name (limit ${limit} s): $*" | tee -a "$OUT/$log"
    start=$(date +%s%N)
    timeout -k 10 "$limit" "$@" >> "$OUT/$log" 2>&1
    rc=$?
    case $rc in
        0) status=ok ;;
        124|137) status="timed-out" ;;
        *) status="failed($rc)" ;;
    esac
    [ $rc = 0 ] || failed=$((failed + 1))
    local ms=$((($(date +%s%N) - start) / 1000000))
    printf '%-11s %-10s %6d.%d %6s  %s\n' "$name" "$status" $((ms / 1000)) $((ms % 1000 / 100)) "$limit" "$log" \
        | tee -a "$SUMMARY"
}

env_report() {
    nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv || true
    "$PYTHON" - <<'EOF'
import importlib.metadata, importlib.util, platform, sys
import torch
print(f"python {platform.python_version()} ({sys.executable}); torch {torch.__version__}, CUDA {torch.version.cuda}, "
      f"{torch.cuda.get_device_name()}, {torch.cuda.get_device_properties(0).multi_processor_count} SMs")
missing = []  # (module, distribution) of what mdc and the steps import; found on the path, not imported
for module, dist in (("numpy", "numpy"), ("timm", "timm"), ("safetensors", "safetensors"), ("regex", "regex"),
                     ("PIL", "pillow"), ("matplotlib", "matplotlib"), ("webdataset", "webdataset"),
                     ("braceexpand", "braceexpand"), ("open_clip", "open_clip_torch"), ("ftfy", "ftfy"),
                     ("wcwidth", "wcwidth"), ("pytest", "pytest"), ("hypothesis", "hypothesis")):
    spec = importlib.util.find_spec(module)
    missing += [module] if spec is None else []
    try:
        version = importlib.metadata.version(dist) if spec else "MISSING"
    except importlib.metadata.PackageNotFoundError:
        version = "(no metadata)"
    print(dist, version, spec.origin if spec else "")
import mdc, mdc.train, mdc.eval.probe  # what the steps need
print("mdc imports from", mdc.__file__)
sys.exit(1 if missing else 0)
EOF
}

runs() {  # runs STEP LIMIT: benchmarks.gpu_runs within LIMIT - 10 s (the step's own timeout is the backstop)
    "$PYTHON" -m benchmarks.gpu_runs "$1" --work "$WORK" --json "$OUT/runs.json" --budget $(($2 - 10))
}

bench() {
    "$PYTHON" -m benchmarks gpu --out "$WORK/bench"
    local rc=$?
    cp "$WORK/bench/benchmarks.json" "$OUT/bench.json" 2>/dev/null
    return $rc
}

static_step() {  # the static-step check: MDC eager, compiled whole and as CUDA graphs, with a profile of eager's step
    MDC_GPU_PARTS=training MDC_GPU_OBJECTIVES=${MDC_GPU_OBJECTIVES:-mdc} MDC_GPU_PROFILE=${MDC_GPU_PROFILE:-1} \
        "$PYTHON" -m benchmarks gpu --out "$WORK/static"
    local rc=$?
    cp "$WORK/static/benchmarks.json" "$OUT/static.json" 2>/dev/null
    return $rc
}

loader() {  # the loader's images/s per worker on this machine's cores, beside the steps' appetite
    "$PYTHON" -m benchmarks data --out "$WORK/loader"
}

TESTS=${MDC_GPU_TESTS:-tests/mdc/test_precision.py tests/mdc/test_compile.py tests/mdc/test_scoring.py tests/mdc/eval/test_probe.py}
export -f env_report runs bench static_step loader
export PYTHON OUT WORK

# MDC_GPU_STEPS: the steps to run and their limits in seconds, in order (a second try within a lease runs
# what the first left undone, e.g. "env:15 bench:150 torchrun:80"); MDC_GPU_TESTS: the tests step's files.
for spec in ${MDC_GPU_STEPS:-env:10 tests:80 bench:135 torchrun:75 mini-train:90 mini-eval:90}; do
    name=${spec%%:*} limit=${spec#*:}
    case $name in
        env) step env "$limit" env.log bash -c env_report ;;
        # shellcheck disable=SC2086
        tests) step tests "$limit" tests.log "$PYTHON" -m pytest -v -p no:cacheprovider --durations=15 $TESTS ;;
        bench) step bench "$limit" bench.log bash -c bench ;;
        torchrun) step torchrun "$limit" torchrun.log bash -c "runs torchrun $limit" ;;
        graphs) step graphs "$limit" torchrun.log bash -c "runs graphs $limit" ;;
        twins) step twins "$limit" torchrun.log bash -c "runs twins $limit" ;;
        mini-train|mini-eval) step "$name" "$limit" mini.log bash -c "runs $name $limit" ;;
        static) step static "$limit" static.log bash -c static_step ;;
        loader) step loader "$limit" loader.log bash -c loader ;;
        *) echo "unknown step $name in MDC_GPU_STEPS (env, tests, bench, torchrun, graphs, twins, mini-train," \
                "mini-eval, static, loader)" >&2
           exit 2 ;;
    esac
done

echo "$failed step(s) not ok; scratch: $WORK; the results: $OUT" | tee -a "$SUMMARY"
[ "$failed" = 0 ]
