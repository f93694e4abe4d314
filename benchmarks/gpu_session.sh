#!/bin/bash
# Everything a GPU session should run, in one device call (the lease is short: see CONTRIBUTING.md).
#   here:  mkdir -p .device && cp -r ../shared/torchref ../shared/data .device/
#   then:  run(command="bash benchmarks/gpu_session.sh", carry=[".device"])
# Builds with sm_90 only, runs every cuda/torchref test (the trainer's and the recorder's first, then the
# rest; TESTS overrides the list, TESTS=none skips them), then the benchmarks (BENCHES); logs go to $OUT
# (or ./gpu-logs). One device call may run 600 s: the tests take about 6 minutes and the benchmarks about
# as long again, so split them, e.g. BENCHES="fit step" in the first call and TESTS=none
# BENCHES="network objective optimizer loader" in the second.
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
if [ "${TESTS:-}" != none ]; then
  timeout "${TEST_S:-400}" python3 -m pytest -rf -v -m "cuda or torchref" -p no:cacheprovider \
    ${TESTS:-tests/test_trainer.py tests/test_network_cuda.py tests} > "$OUT/pytest_gpu.log" 2>&1
  grep -cE " PASSED" "$OUT/pytest_gpu.log" | sed 's/^/passed so far: /'
  grep -E "^(FAILED|ERROR)" "$OUT/pytest_gpu.log" | head -30
  tail -1 "$OUT/pytest_gpu.log"
fi
for b in ${BENCHES-fit step network objective optimizer loader}; do
  echo "== $b"
  case $b in
    fit) cmd="benchmarks/fit.py --json $OUT/fit.json --logs $OUT/fit ${FIT_ARGS:-}" ;;
    fitp) cmd="benchmarks/fit_protocol.py --json $OUT/fitp.json --logs $OUT/fitp ${FITP_ARGS:-}" ;;
    step) cmd="benchmarks/profile_step.py --what step --no-profile --iters 64" ;;
    *) cmd="benchmarks/$b.py" ;;
  esac
  timeout "${BENCH_S:-240}" python3 $cmd > "$OUT/bench_$b.log" 2>&1
  if [ "$b" = step ]; then
    timeout "${BENCH_S:-240}" python3 $cmd --capture >> "$OUT/bench_$b.log" 2>&1
  fi
  tail -15 "$OUT/bench_$b.log"
done
