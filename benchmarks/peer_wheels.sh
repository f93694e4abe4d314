#!/bin/bash
# Wheels the GPU machine lacks for the Ultralytics peer of benchmarks/fit_protocol.py (its image has
# torch, torchvision, opencv, matplotlib, pillow, scipy, psutil, requests; see the device README):
#   here:  bash benchmarks/peer_wheels.sh            (fills .whl/, git-ignored)
#   there: python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site:$PWD/benchmarks/peer_shims
set -euo pipefail
cd "$(dirname "$0")/.."
mkdir -p .whl
plat="--platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64"
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp $plat -d .whl \
  ultralytics==8.4.190 ultralytics-thop ultralytics-platform
# polars (54 MB) does not fit beside coco256 in one call: benchmarks/peer_shims/polars stands in for the one
# call the trainer makes (reading its results.csv); download "polars polars-runtime-32" too where it fits.
ls -la .whl
