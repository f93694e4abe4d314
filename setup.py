"""Build ptl._C from csrc/**/*.c (gcc) and, for the CUDA backend, csrc/cuda/**/*.cu (nvcc).

Environment:
  PTL_CUDA      unset: build the CUDA backend when nvcc is found. Without nvcc the build stops with a
                message on a machine with an NVIDIA driver, and elsewhere builds CPU-only after a notice
                that says how to get CUDA. 1: CUDA is required (stop when nvcc is not found). 0: CPU only.
  CUDA_HOME     CUDA toolkit root (else the folder above `nvcc` on PATH)
  CUDNN_HOME    root of cuDNN's include/ (else the toolkit, /usr, /usr/local or the nvidia-cudnn wheel)
  NCCL_HOME     root of NCCL's include/ (else the toolkit, /usr, /usr/local or the nvidia-nccl wheel)
  PTL_CUDA_ARCH comma-separated targets: sm_XX = machine code, compute_XX = PTX
                (default "sm_90,compute_80": Hopper code plus PTX for Ampere/Ada and newer)
  PTL_JOBS      parallel compile jobs (default: CPU count)
  PTL_WEBP=0, PTL_TIFF=0  build without libwebp / libtiff even when found (linked when found otherwise;
                without one, its images are skipped with one message at dataset scan)
  PTL_DNNL      unset: build the fast CPU backend (csrc/cpu/, oneDNN convolutions) when oneDNN is found,
                else the CPU trains on the plain-C reference kernels (after a notice). 0: without it.
                1: oneDNN is required (Debian/Ubuntu: apt-get install libdnnl-dev).
  CC            the C compiler (default: the one Python was built with)

The CUDA runtime is linked statically; cuBLAS, cuDNN and NCCL are opened at run time
(csrc/cuda/dynload.c), so the extension needs only their headers here.
"""
import glob
import hashlib
import os
import shlex
import shutil
import subprocess
import sys
import sysconfig
import tempfile
from concurrent.futures import ThreadPoolExecutor
from typing import NamedTuple

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

ROOT = os.path.dirname(os.path.abspath(__file__))


class SystemLibrary(NamedTuple):
    """A C library from the system: found when a program including `header` links with -l`lib`."""
    name: str
    header: str
    lib: str
    apt: str  # the Debian/Ubuntu package with its headers
    dnf: str  # the Fedora/RHEL one
    prelude: str = ""  # what the header needs included before it
    macro: str = ""  # optional libraries: defined to 1 when found, and only then linked
    use: str = ""  # a statement main() runs, for a library that needs a minimum version
    switch: str = ""  # optional libraries: the environment variable that, set to 0, leaves it out (1: required)
    without: str = "its images will be skipped"  # optional libraries: what a build without it lacks


REQUIRED_LIBRARIES = [
    SystemLibrary("libjpeg", "jpeglib.h", "jpeg", "libjpeg-dev", "libjpeg-turbo-devel", prelude="#include <stdio.h>"),
    SystemLibrary("libpng", "png.h", "png", "libpng-dev", "libpng-devel"),
]
# Libraries ptl uses when present: image decoders whose files are otherwise skipped at dataset scan.
OPTIONAL_LIBRARIES = [
    SystemLibrary("libwebp", "webp/decode.h", "webp", "libwebp-dev", "libwebp-devel", macro="PTL_WITH_WEBP",
                  use="return WebPGetDecoderVersion() < 0;", switch="PTL_WEBP"),
    # TIFFOpenOptionsAlloc: libtiff >= 4.5
    SystemLibrary("libtiff", "tiffio.h", "tiff", "libtiff-dev", "libtiff-devel", macro="PTL_WITH_TIFF",
                  use="TIFFOpenOptionsFree(TIFFOpenOptionsAlloc());", switch="PTL_TIFF"),
    # the fast CPU backend's convolutions (csrc/cpu/conv2d.c); dnnl_version: oneDNN >= 1.0's C API
    SystemLibrary("oneDNN", "oneapi/dnnl/dnnl.h", "dnnl", "libdnnl-dev", "onednn-devel", macro="PTL_WITH_DNNL",
                  use="return dnnl_version() == 0;", switch="PTL_DNNL",
                  without="CPU training will run on the plain-C reference kernels, several times slower"),
]


def c_compiler():
    return shlex.split(os.environ.get("CC") or sysconfig.get_config_var("CC") or "cc")


def library_found(lib, cc=None):
    """True when a program including lib.header compiles and links with -l<lib.lib>."""
    cc = cc or c_compiler()
    with tempfile.TemporaryDirectory() as tmp:
        src = os.path.join(tmp, "probe.c")
        with open(src, "w") as fh:
            fh.write("%s\n#include <%s>\nint main(void) { %s return 0; }\n" % (lib.prelude, lib.header, lib.use))
        cmd = cc + [src, "-o", os.path.join(tmp, "probe"), "-l" + lib.lib]
        return subprocess.run(cmd, capture_output=True).returncode == 0


def missing_libraries_message(missing):
    """The one message a build without `missing` (required SystemLibrary list) stops with."""
    return ("ptl needs the development files (headers and libraries) of %s, which this machine lacks "
            "(%s not found). Install them, then run the same command again:\n"
            "    apt-get install %s    # Debian, Ubuntu\n"
            "    dnf install %s    # Fedora, RHEL"
            % (", ".join(m.name for m in missing), ", ".join(m.header for m in missing),
               " ".join(m.apt for m in missing), " ".join(m.dnf for m in missing)))


def _nvidia_driver_present():
    return os.path.exists("/proc/driver/nvidia/version") or os.path.exists("/usr/lib/wsl/lib/libcuda.so.1")


HOW_TO_GET_CUDA = ("install the CUDA toolkit (https://developer.nvidia.com/cuda-downloads) and put its nvcc on "
                   "PATH or set CUDA_HOME, then build again")


def cuda_home():
    """The toolkit root to build the CUDA backend with, or None for a CPU-only build (see PTL_CUDA)."""
    flag = os.environ.get("PTL_CUDA", "").strip()
    if flag not in ("", "0", "1"):
        sys.exit("ptl: PTL_CUDA must be 0 (CPU only), 1 (CUDA required) or unset (CUDA when nvcc is found), "
                 "got %r" % flag)
    if flag == "0":
        return None
    home = os.environ.get("CUDA_HOME") or os.environ.get("CUDA_PATH")
    if not home:
        nvcc = shutil.which("nvcc")
        if nvcc:
            home = os.path.dirname(os.path.dirname(os.path.realpath(nvcc)))
    if home and os.path.exists(os.path.join(home, "bin", "nvcc")):
        return home
    looked = "CUDA_HOME=%s has no bin/nvcc" % home if home else "no nvcc on PATH and CUDA_HOME unset"
    if flag == "1":
        sys.exit("ptl: PTL_CUDA=1 but the CUDA toolkit was not found (%s): %s" % (looked, HOW_TO_GET_CUDA))
    if _nvidia_driver_present():
        sys.exit("ptl: this machine has an NVIDIA driver but the CUDA toolkit was not found (%s), so the build "
                 "would lack the GPU backend. To use the GPU, %s. For a CPU-only build set PTL_CUDA=0."
                 % (looked, HOW_TO_GET_CUDA))
    print("ptl: NOTICE: building the CPU-only extension (%s; no NVIDIA driver either). For the GPU backend, %s "
          "(PTL_CUDA=1 makes a missing toolkit an error; PTL_CUDA=0 silences this)." % (looked, HOW_TO_GET_CUDA),
          file=sys.stderr)
    return None


def _site_nvidia(sub):
    """Folders of pip's nvidia-* wheels (e.g. nvidia/cudnn) on sys.path."""
    return [d for d in (os.path.join(p, "nvidia", sub) for p in sys.path) if os.path.isdir(d)]


def cudnn_include(home):
    """The folder holding cudnn.h."""
    roots = ([os.environ["CUDNN_HOME"]] if os.environ.get("CUDNN_HOME") else []) + \
        [home, "/usr", "/usr/local"] + _site_nvidia("cudnn")
    incs = [d for r in roots for d in (os.path.join(r, "include"), os.path.join(r, "include", "x86_64-linux-gnu"))]
    found = next((d for d in incs if os.path.exists(os.path.join(d, "cudnn.h"))), None)
    if found is None:
        sys.exit("ptl: the CUDA toolkit was found but cuDNN's headers were not (no cudnn.h in %s); install cuDNN "
                 "(e.g. `pip install nvidia-cudnn-cu13`) or set CUDNN_HOME, or build CPU-only with PTL_CUDA=0"
                 % ", ".join(incs))
    return found


def nccl_include(home):
    """The folder holding nccl.h (data parallelism over GPUs; NCCL itself is opened at run time)."""
    roots = ([os.environ["NCCL_HOME"]] if os.environ.get("NCCL_HOME") else []) + \
        [home, "/usr", "/usr/local"] + _site_nvidia("nccl")
    incs = [os.path.join(r, "include") for r in roots]
    found = next((d for d in incs if os.path.exists(os.path.join(d, "nccl.h"))), None)
    if found is None:
        sys.exit("ptl: the CUDA toolkit was found but NCCL's header was not (no nccl.h in %s); install NCCL "
                 "(e.g. `pip install nvidia-nccl-cu13`) or set NCCL_HOME, or build CPU-only with PTL_CUDA=0"
                 % ", ".join(incs))
    return found


def gencode():
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


C_FLAGS = ["-std=gnu11", "-O2", "-fPIC", "-fopenmp", "-ffp-contract=off", "-Wall", "-Wextra",
           "-Wno-missing-field-initializers", "-Wno-cast-function-type", "-fvisibility=hidden"]
NVCC_FLAGS = ["-O3", "-std=c++17", "--expt-relaxed-constexpr", "-Xcompiler", "-fPIC",
              "-Xcompiler", "-fvisibility=hidden", "-Xcompiler", "-Wall"]
ALL_C_SOURCES = sorted(glob.glob("csrc/**/*.c", recursive=True))
CU_SOURCES = sorted(glob.glob("csrc/cuda/**/*.cu", recursive=True))
HEADERS = sorted(glob.glob("csrc/**/*.h", recursive=True) + glob.glob("csrc/**/*.cuh", recursive=True))


class Config(NamedTuple):
    """What one build compiles and links."""
    cuda_home: str
    c_sources: list
    cu_sources: list
    include_dirs: list
    libraries: list
    macros: list


def configure():
    """Checks the system libraries and the CUDA toolkit; stops with one message naming what is missing."""
    import numpy

    missing = [lib for lib in REQUIRED_LIBRARIES if not library_found(lib)]
    if missing:
        sys.exit(missing_libraries_message(missing))
    include_dirs = [os.path.join(ROOT, "csrc"), numpy.get_include()]
    libraries = [lib.lib for lib in REQUIRED_LIBRARIES] + ["m"]
    macros = []
    for lib in OPTIONAL_LIBRARIES:
        switch = os.environ.get(lib.switch, "").strip()
        if switch == "0":
            continue
        if library_found(lib):
            libraries.append(lib.lib)
            macros.append((lib.macro, "1"))
        elif switch == "1":
            sys.exit(missing_libraries_message([lib]).replace("ptl needs", "%s=1: ptl needs" % lib.switch, 1))
        else:
            print("ptl: %s not found (install %s): %s (%s=0 silences this)" % (lib.name, lib.apt, lib.without,
                                                                            lib.switch), file=sys.stderr)
    home = cuda_home()
    c_sources, cu_sources = ALL_C_SOURCES, CU_SOURCES
    if home:
        include_dirs += [os.path.join(home, "include"), cudnn_include(home), nccl_include(home)]
        include_dirs = list(dict.fromkeys(include_dirs))
        libraries += ["cudart_static", "stdc++", "dl", "rt", "pthread"]
        macros.append(("PTL_WITH_CUDA", "1"))
    else:
        c_sources = [s for s in c_sources if not s.startswith(os.path.join("csrc", "cuda") + os.sep)]
        cu_sources = []
    macros.append(("NPY_NO_DEPRECATED_API", "NPY_1_21_API_VERSION"))
    return Config(home, c_sources, cu_sources, include_dirs, libraries, macros)


def _stale(src, obj):
    if not os.path.exists(obj):
        return True
    t = os.path.getmtime(obj)
    return any(os.path.getmtime(p) > t for p in [src] + HEADERS + [__file__])


class BuildExt(build_ext):
    """Compiles .c and .cu files in parallel, each only when it or a header changed."""

    def build_extension(self, ext):
        cfg = configure()
        # objects of different configurations (CPU-only vs CUDA, flags, targets) never mix
        key = repr((cfg.macros, C_FLAGS, NVCC_FLAGS, gencode() if cfg.cuda_home else None, cfg.include_dirs))
        tmp = os.path.join(os.path.abspath(self.build_temp), hashlib.sha1(key.encode()).hexdigest()[:10])
        jobs = int(os.environ.get("PTL_JOBS", os.cpu_count() or 2))
        defs = ["-D%s=%s" % m for m in cfg.macros]
        incs = ["-I" + d for d in cfg.include_dirs]
        cc = c_compiler()
        py_inc = "-I" + sysconfig.get_paths()["include"]
        library_dirs = [os.path.join(cfg.cuda_home, "lib64")] if cfg.cuda_home else []

        def compile_one(src):
            obj = os.path.join(tmp, src + ".o")
            if _stale(src, obj):
                os.makedirs(os.path.dirname(obj), exist_ok=True)
                if src.endswith(".cu"):
                    cmd = [os.path.join(cfg.cuda_home, "bin", "nvcc"), "-c", src, "-o", obj] + \
                        NVCC_FLAGS + gencode() + defs + incs + [py_inc]
                else:
                    cmd = cc + ["-c", src, "-o", obj] + C_FLAGS + defs + incs + [py_inc]
                print(" ".join(cmd), flush=True)
                r = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
                if r.stdout or r.stderr:
                    print(r.stdout + r.stderr, file=sys.stderr, flush=True)
                if r.returncode != 0:
                    raise RuntimeError("compiling %s failed" % src)
            return obj

        with ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
            objects = list(pool.map(compile_one, cfg.c_sources + cfg.cu_sources))
        out = self.get_ext_fullpath(ext.name)
        os.makedirs(os.path.dirname(out), exist_ok=True)
        self.compiler.link_shared_object(
            objects, out, libraries=cfg.libraries, library_dirs=library_dirs,
            extra_postargs=["-fopenmp"], target_lang="c")
        if cfg.cuda_home:
            _check_dynload(out)


def _check_dynload(path):
    """A cuBLAS/cuDNN function called but missing from csrc/cuda/dynload.c's lists stays undefined (a
    Python extension may leave symbols undefined), and `import ptl` would fail; say so at build time."""
    if not shutil.which("nm"):
        return
    out = subprocess.run(["nm", "-D", "--undefined-only", path], capture_output=True, text=True).stdout
    missing = sorted({line.split()[-1].split("@")[0] for line in out.splitlines()
                      if line.split() and line.split()[-1].startswith(("cublas", "cudnn", "nccl"))})
    if missing:
        sys.exit("ptl: %s called but not in csrc/cuda/dynload.c's function lists; add %s there"
                 % (", ".join(missing), "it" if len(missing) == 1 else "them"))


if __name__ == "__main__":
    setup(
        ext_modules=[Extension("ptl._C", sources=ALL_C_SOURCES)],
        cmdclass={"build_ext": BuildExt},
    )
