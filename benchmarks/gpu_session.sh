#!/bin/bash
# Everything a GPU session should run, in one device call (the lease is short: see CONTRIBUTING.md).
#   here:  mkdir -p .device && cp -r ../shared/torchref ../shared/data .device/
#   then:  run(command="bash benchmarks/gpu_session.sh", carry=[".device"])
# Builds with sm_90 only, runs every cuda/torchref test, then the benchmarks; logs go to $OUT (or ./gpu-logs).
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/gpu-logs}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PTL_SHARED=${PTL_SHARED:-$PWD/.device} PTL_JOBS=${PTL_JOBS:-16}
export PTL_CUDA_ARCH=${PTL_CUDA_ARCH:-sm_90}
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader | tee "$OUT/gpu.txt"
if ! ( time python3 -m pip install --no-build-isolation -e . ) > "$OUT/build.log" 2>&1; then
  tail -40 "$OUT/build.log"
  exit 1
fi
grep real "$OUT/build.log"
timeout "${TEST_S:-400}" python3 -m pytest -q -m "cuda or torchref" tests -p no:cacheprovider \
  > "$OUT/pytest_gpu.log" 2>&1
grep -E "^(FAILED|ERROR)" "$OUT/pytest_gpu.log" | head -30
tail -1 "$OUT/pytest_gpu.log"
for b in ${BENCHES:-network objective optimizer loader layers_cuda}; do
  echo "== $b"
  timeout "${BENCH_S:-240}" python3 "benchmarks/$b.py" > "$OUT/bench_$b.log" 2>&1
  tail -15 "$OUT/bench_$b.log"
done
