"""Build ptl._C from csrc/**/*.c (gcc) and, when CUDA is found, csrc/cuda/**/*.cu (nvcc).

Environment:
  PTL_CUDA=0          build a CPU-only extension (PTL_CUDA=1 fails if CUDA is not found)
  CUDA_HOME           CUDA toolkit root (else the folder above `nvcc` on PATH)
  CUDNN_HOME          cuDNN root holding include/ and lib/ (else searched, see _find_cudnn)
  PTL_CUDA_ARCH       comma-separated targets: sm_XX = machine code, compute_XX = PTX
                      (default "sm_90,compute_80": Hopper code plus PTX for Ampere/Ada and newer)
  PTL_JOBS            parallel compile jobs (default: CPU count)
  PTL_DNNL=0          build without oneDNN (the fast CPU convolutions, csrc/cpu/); PTL_DNNL=1 fails if
                      it is not found (Debian/Ubuntu: apt-get install libdnnl-dev)
"""
import glob
import hashlib
import os
import shutil
import subprocess
import sys
import sysconfig
import tempfile
from concurrent.futures import ThreadPoolExecutor

import numpy
from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

ROOT = os.path.dirname(os.path.abspath(__file__))


def _cuda_home():
    flag = os.environ.get("PTL_CUDA", "").strip()
    if flag == "0":
        return None
    home = os.environ.get("CUDA_HOME") or os.environ.get("CUDA_PATH")
    if not home:
        nvcc = shutil.which("nvcc")
        if nvcc:
            home = os.path.dirname(os.path.dirname(os.path.realpath(nvcc)))
    if home and os.path.exists(os.path.join(home, "bin", "nvcc")):
        return home
    if flag == "1":
        sys.exit("PTL_CUDA=1 but no CUDA toolkit was found (set CUDA_HOME or put nvcc on PATH)")
    print("ptl: no CUDA toolkit found; building the CPU-only extension", file=sys.stderr)
    return None


def _site_nvidia(sub):
    """Folders of pip's nvidia-* wheels (e.g. nvidia/cudnn) on sys.path."""
    out = []
    for p in sys.path:
        d = os.path.join(p, "nvidia", sub)
        if os.path.isdir(d):
            out.append(d)
    return out


def _find_cudnn(cuda_home):
    """Return (include_dir, lib_dir) holding cudnn.h and libcudnn.so."""
    roots = []
    if os.environ.get("CUDNN_HOME"):
        roots.append(os.environ["CUDNN_HOME"])
    roots += [cuda_home, "/usr", "/usr/local"] + _site_nvidia("cudnn")
    incs, libs = [], []
    for r in roots:
        incs += [os.path.join(r, "include"), os.path.join(r, "include", "x86_64-linux-gnu")]
        libs += [os.path.join(r, "lib64"), os.path.join(r, "lib"),
                 os.path.join(r, "lib", "x86_64-linux-gnu")]
    inc = next((d for d in incs if os.path.exists(os.path.join(d, "cudnn.h"))), None)
    lib = next((d for d in libs if glob.glob(os.path.join(d, "libcudnn.so*"))), None)
    if inc is None or lib is None:
        sys.exit("ptl: CUDA found but cuDNN not (looked for cudnn.h in %s and libcudnn.so in %s); "
                 "set CUDNN_HOME or PTL_CUDA=0" % (incs, libs))
    return inc, lib


def _gencode():
    spec = os.environ.get("PTL_CUDA_ARCH", "sm_90,compute_80")
    flags = []
    for item in spec.replace(";", ",").split(","):
        item = item.strip()
        if not item:
            continue
        kind, _, num = item.partition("_")
        if kind not in ("sm", "compute") or not num.rstrip("a").isdigit():
            sys.exit("PTL_CUDA_ARCH: expected entries like sm_90 or compute_80, got %r" % item)
        flags.append("-gencode=arch=compute_%s,code=%s_%s" % (num, kind, num))
    return flags


def _system_library(name, header, lib):
    """True when `header` compiles and -l`lib` links with the system compiler's default paths. PTL_<name>=0
    skips the library, PTL_<name>=1 makes its absence an error."""
    flag = os.environ.get("PTL_" + name, "").strip()
    if flag == "0":
        return False
    cc = (sysconfig.get_config_var("CC") or "gcc").split()[0]
    with tempfile.TemporaryDirectory() as tmp:
        src = os.path.join(tmp, "probe.c")
        with open(src, "w") as f:
            f.write("#include <%s>\nint main(void) { return 0; }\n" % header)
        found = subprocess.run([cc, src, "-o", os.path.join(tmp, "probe"), "-l" + lib],
                               capture_output=True).returncode == 0
    if not found and flag == "1":
        sys.exit("PTL_%s=1 but <%s> with -l%s was not found" % (name, header, lib))
    if not found:
        print("ptl: <%s> not found; building without it (PTL_%s=0 silences this)" % (header, name), file=sys.stderr)
    return found


CUDA_HOME = _cuda_home()
C_SOURCES = sorted(glob.glob("csrc/**/*.c", recursive=True))
CU_SOURCES = sorted(glob.glob("csrc/cuda/**/*.cu", recursive=True))
if CUDA_HOME is None:
    C_SOURCES = [s for s in C_SOURCES if not s.startswith(os.path.join("csrc", "cuda") + os.sep)]
    CU_SOURCES = []
HEADERS = sorted(glob.glob("csrc/**/*.h", recursive=True) + glob.glob("csrc/**/*.cuh", recursive=True))

include_dirs = [os.path.join(ROOT, "csrc"), numpy.get_include()]
library_dirs, libraries, rpath, macros = [], ["jpeg", "png", "z", "m"], [], []
if CUDA_HOME:
    cudnn_inc, cudnn_lib = _find_cudnn(CUDA_HOME)
    cuda_lib = os.path.join(CUDA_HOME, "lib64")
    include_dirs += [os.path.join(CUDA_HOME, "include"), cudnn_inc]
    library_dirs += [cuda_lib, cudnn_lib]
    rpath += [cuda_lib, cudnn_lib]
    libraries += ["cudart_static", "cublasLt", "cublas", "cudnn", "stdc++", "dl", "rt", "pthread"]
    macros.append(("PTL_WITH_CUDA", "1"))
if _system_library("DNNL", "oneapi/dnnl/dnnl.h", "dnnl"):
    libraries.append("dnnl")
    macros.append(("PTL_WITH_DNNL", "1"))
macros.append(("NPY_NO_DEPRECATED_API", "NPY_1_21_API_VERSION"))

C_FLAGS = ["-std=gnu11", "-O2", "-fPIC", "-fopenmp", "-ffp-contract=off", "-Wall", "-Wextra",
           "-Wno-missing-field-initializers", "-Wno-cast-function-type", "-fvisibility=hidden"]
NVCC_FLAGS = ["-O3", "-std=c++17", "--expt-relaxed-constexpr", "-Xcompiler", "-fPIC",
              "-Xcompiler", "-fvisibility=hidden", "-Xcompiler", "-Wall"]


def _stale(src, obj):
    if not os.path.exists(obj):
        return True
    t = os.path.getmtime(obj)
    return any(os.path.getmtime(p) > t for p in [src] + HEADERS + [__file__])


class BuildExt(build_ext):
    """Compiles .c and .cu files in parallel, each only when it or a header changed."""

    def build_extension(self, ext):
        # objects of different configurations (CPU-only vs CUDA, flags, targets) never mix
        config = repr((macros, C_FLAGS, NVCC_FLAGS, _gencode() if CUDA_HOME else None, include_dirs))
        tmp = os.path.join(os.path.abspath(self.build_temp), hashlib.sha1(config.encode()).hexdigest()[:10])
        jobs = int(os.environ.get("PTL_JOBS", os.cpu_count() or 2))
        defs = ["-D%s=%s" % m for m in macros]
        incs = ["-I" + d for d in include_dirs]
        cc = sysconfig.get_config_var("CC").split()[0] or "gcc"
        py_inc = "-I" + sysconfig.get_paths()["include"]

        def compile_one(src):
            obj = os.path.join(tmp, src + ".o")
            if _stale(src, obj):
                os.makedirs(os.path.dirname(obj), exist_ok=True)
                if src.endswith(".cu"):
                    cmd = [os.path.join(CUDA_HOME, "bin", "nvcc"), "-c", src, "-o", obj] + \
                        NVCC_FLAGS + _gencode() + defs + incs + [py_inc]
                else:
                    cmd = [cc, "-c", src, "-o", obj] + C_FLAGS + defs + incs + [py_inc]
                print(" ".join(cmd), flush=True)
                r = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
                if r.stdout or r.stderr:
                    print(r.stdout + r.stderr, file=sys.stderr, flush=True)
                if r.returncode != 0:
                    raise RuntimeError("compiling %s failed" % src)
            return obj

        with ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
            objects = list(pool.map(compile_one, C_SOURCES + CU_SOURCES))
        out = self.get_ext_fullpath(ext.name)
        os.makedirs(os.path.dirname(out), exist_ok=True)
        self.compiler.link_shared_object(
            objects, out, libraries=libraries, library_dirs=library_dirs,
            runtime_library_dirs=rpath, extra_postargs=["-fopenmp"],
            target_lang="c")


setup(
    ext_modules=[Extension("ptl._C", sources=C_SOURCES)],
    cmdclass={"build_ext": BuildExt},
)
