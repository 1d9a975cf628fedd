#!/usr/bin/env bash
# Wheels of the pure-Python packages mdc imports that a GPU machine's own PyTorch image may lack
# (webdataset, braceexpand, open_clip_torch, ftfy, wcwidth), for Python 3.12 on x86-64, at the
# versions pinned in requirements.lock, into .whl/ (ignored by git): run it where pip reaches an
# index, take .whl/ to the GPU machine beside the checkout and install them there, offline, with
#
#   python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
#   export PYTHONPATH=/tmp/site:.
#
# (docs/benchmarks.md, "GPU first contact: how to run it"). Usage: bash benchmarks/gpu_wheels.sh [DIR]
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
DEST=${1:-$ROOT/.whl}
PACKAGES=(webdataset braceexpand open_clip_torch ftfy wcwidth)

pins=()
for name in "${PACKAGES[@]}"; do
    pin=$(grep -i "^${name}==" "$ROOT/requirements.lock") \
        || { echo "no pin for $name in requirements.lock" >&2; exit 1; }
    pins+=("$pin")
done
mkdir -p "$DEST"
python3 -m pip download --quiet --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 \
    --platform manylinux2014_x86_64 --platform manylinux1_x86_64 -d "$DEST" "${pins[@]}"
ls -1 "$DEST"
