"""Packaging: metadata and version, setup.py's checks, the run-time library loader, the manylinux
repair tool, and (slow) the repaired wheel installed into a fresh venv."""
import ctypes
import importlib.util
import json
import math
import os
import re
import shutil
import subprocess
import sys
import tomllib

import pytest

import ptl
from ptl import _C

from conftest import REPO, shared_dir

CC = shutil.which("cc") or shutil.which("gcc")
needs_cc = pytest.mark.skipif(CC is None, reason="no C compiler")
needs_cuda_build = pytest.mark.skipif(not _C.WITH_CUDA, reason="ptl was built without CUDA")


def pyproject():
    with open(REPO / "pyproject.toml", "rb") as fh:
        return tomllib.load(fh)


def load_module(name, path):
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def shared_library(tmp_path, name, soname, body):
    """Compiles C `body` into tmp_path/name with `soname`; returns the path."""
    out = tmp_path / name
    out.parent.mkdir(parents=True, exist_ok=True)
    src = tmp_path / (name + ".c")
    src.write_text(body)
    subprocess.run([CC, "-shared", "-fPIC", "-O2", str(src), "-o", str(out), "-Wl,-soname," + soname, "-lm",
                    "-lpthread"], check=True)
    return out


def requirement_name(req):
    return re.split(r"[<>=!~;\[ ]", req, maxsplit=1)[0].lower().replace("_", "-")


# ---- metadata ----------------------------------------------------------------------------------------

def test_version_has_one_source():
    meta = pyproject()
    assert "version" not in meta["project"] and "version" in meta["project"]["dynamic"]
    assert meta["tool"]["setuptools"]["dynamic"]["version"] == {"attr": "ptl._version.__version__"}
    text = (REPO / "ptl" / "_version.py").read_text()
    assert re.search(r'^__version__ = "%s"$' % re.escape(ptl.__version__), text, re.M)
    assert not re.search(r"^__version__\s*=", (REPO / "ptl" / "__init__.py").read_text(), re.M)


def test_license_and_extras():
    meta = pyproject()["project"]
    assert meta["license"] == "MIT" and "MIT License" in (REPO / "LICENSE").read_text()
    extras = {k: {requirement_name(r) for r in v} for k, v in meta["optional-dependencies"].items()}
    assert {"matplotlib"} <= extras["plot"]
    assert {"onnx", "onnxruntime"} <= extras["export"]
    assert {"nvidia-cublas", "nvidia-cudnn-cu13"} <= extras["cuda"]


def test_test_extra_covers_what_ci_installs():
    """.ci/run installs the project with its `test` extra, and every package it installs by name besides is a
    dependency or in that extra (so `pip install -e .[test]` reproduces CI's test environment)."""
    meta = pyproject()["project"]
    known = {requirement_name(r) for r in meta["dependencies"] + meta["optional-dependencies"]["test"]}
    named, extras = set(), set()
    for line in (REPO / ".ci" / "run").read_text().splitlines():
        m = re.search(r"pip install (.*)", line)
        if m:
            args = [a.strip("\"'") for a in m.group(1).split()]
            extras |= {e for a in args if a.startswith(".[") for e in a[2:].rstrip("]").split(",")}
            named |= {requirement_name(a) for a in args if not a.startswith(("-", ".")) and "/" not in a}
    assert "test" in extras, ".ci/run does not install the test extra"
    assert named <= known, "CI installs %s, which the test extra lacks" % sorted(named - known)


@needs_cuda_build
def test_cuda_extra_names_the_wheels_the_loader_asks_for():
    packages = {pkg for _, _, pkg, _ in _C.cuda_libraries(False)}
    extra = {requirement_name(r) for r in pyproject()["project"]["optional-dependencies"]["cuda"]}
    assert packages <= extra, "the loader names %s; ptl[cuda] installs %s" % (packages, extra)


# ---- setup.py ----------------------------------------------------------------------------------------

@pytest.fixture
def setup_py():
    return load_module("ptl_setup", REPO / "setup.py")


@needs_cc
def test_system_library_probe(setup_py):
    for lib in setup_py.REQUIRED_LIBRARIES:  # the build of this checkout needed them
        assert setup_py.library_found(lib), lib
    absent = setup_py.SystemLibrary("libabsent", "ptl_absent_header.h", "ptl_absent", "libabsent-dev", "absent-devel")
    assert not setup_py.library_found(absent)


def test_missing_libraries_message_names_the_packages(setup_py):
    msg = setup_py.missing_libraries_message(setup_py.REQUIRED_LIBRARIES)
    assert "apt-get install libjpeg-dev libpng-dev" in msg
    assert "dnf install libjpeg-turbo-devel libpng-devel" in msg and "jpeglib.h, png.h" in msg


@needs_cc
def test_build_without_headers_stops_with_one_message(tmp_path):
    """A compiler that cannot find jpeglib.h/png.h stands in for a machine without the -dev packages."""
    fake = tmp_path / "cc"
    fake.write_text('#!/bin/sh\nfor a in "$@"; do case "$a" in *.c) grep -qE "jpeglib.h|png.h" "$a" && '
                    '{ echo "$a: header not found" >&2; exit 1; };; esac; done\nexec %s "$@"\n' % CC)
    fake.chmod(0o755)
    r = subprocess.run([sys.executable, "setup.py", "build_ext", "--inplace"], cwd=REPO, capture_output=True,
                       text=True, env=dict(os.environ, CC=str(fake), PTL_CUDA="0"))
    assert r.returncode == 1
    assert "apt-get install libjpeg-dev libpng-dev" in r.stderr
    assert "gcc -c" not in r.stdout + r.stderr and str(fake) + " -c" not in r.stdout  # stopped before compiling


@pytest.fixture
def no_toolkit(monkeypatch, tmp_path, setup_py):
    for var in ("CUDA_HOME", "CUDA_PATH", "PTL_CUDA"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("PATH", str(tmp_path))  # no nvcc
    return setup_py


def test_cuda_policy(no_toolkit, monkeypatch, capsys):
    setup_py = no_toolkit
    monkeypatch.setattr(setup_py, "_nvidia_driver_present", lambda: False)
    assert setup_py.cuda_home() is None  # CPU-only, with a notice that says how to get CUDA
    assert "NOTICE: building the CPU-only extension" in capsys.readouterr().err
    monkeypatch.setattr(setup_py, "_nvidia_driver_present", lambda: True)
    with pytest.raises(SystemExit, match="NVIDIA driver but the CUDA toolkit was not found.*PTL_CUDA=0"):
        setup_py.cuda_home()  # a GPU machine without nvcc never gets a silent CPU build
    monkeypatch.setenv("PTL_CUDA", "0")
    assert setup_py.cuda_home() is None
    monkeypatch.setenv("PTL_CUDA", "1")
    monkeypatch.setattr(setup_py, "_nvidia_driver_present", lambda: False)
    with pytest.raises(SystemExit, match="PTL_CUDA=1 but the CUDA toolkit was not found"):
        setup_py.cuda_home()
    monkeypatch.setenv("PTL_CUDA", "yes")
    with pytest.raises(SystemExit, match="PTL_CUDA must be 0"):
        setup_py.cuda_home()


# ---- the run-time loader (csrc/dynlib.c) -------------------------------------------------------------

@pytest.fixture
def roots():
    """Sets the loader's search roots; restores ptl.cuda's afterwards."""
    yield lambda dirs: _C._set_library_roots([str(d) for d in dirs])
    _C._set_library_roots(ptl.cuda._library_roots())


def fake_wheel(tmp_path, root, soname, value):
    return shared_library(tmp_path, "%s/vendor/lib/%s" % (root, soname), soname,
                          "int ptlfake_value(void) { return %d; }\n" % value)


def probe(soname, symbols=("ptlfake_value",)):
    return _C._dynlib_probe("Fake", soname, "vendor/lib", "fake-pkg", "ptl[fake]", list(symbols))


def probe_in_subprocess(soname, root_dirs, ld_library_path):
    """probe() in a fresh process whose system loader also searches ld_library_path; (rc, output)."""
    code = ("import ptl, sys\nptl._C._set_library_roots(%r)\ntry:\n"
            "    print(ptl._C._dynlib_probe('Fake', %r, 'vendor/lib', 'fake-pkg', 'ptl[fake]', ['ptlfake_value']))\n"
            "except ptl.CudaError as e:\n    print(e)\n    sys.exit(3)\n" % ([str(d) for d in root_dirs], soname))
    env = dict(os.environ, LD_LIBRARY_PATH=str(ld_library_path), PYTHONPATH=str(REPO))
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=REPO)
    return r.returncode, (r.stdout + r.stderr).strip()


@needs_cc
def test_loader_search_order(tmp_path, roots):
    for name, value in (("a", 1), ("b", 2)):
        fake_wheel(tmp_path, name, "libptlfake_order.so.1", value)
        fake_wheel(tmp_path, name, "libptlfake_order2.so.1", value)
    roots([tmp_path / "none", tmp_path / "b", tmp_path / "a"])
    got = probe("libptlfake_order.so.1")
    assert got == str(tmp_path / "b/vendor/lib/libptlfake_order.so.1")  # the first root holding it wins
    assert ctypes.CDLL(got).ptlfake_value() == 2
    roots([tmp_path / "a", tmp_path / "b"])
    assert probe("libptlfake_order2.so.1") == str(tmp_path / "a/vendor/lib/libptlfake_order2.so.1")


@needs_cc
def test_loader_falls_back_to_the_system_library_path(tmp_path):
    lib = fake_wheel(tmp_path, "sys", "libptlfake_sys.so.1", 7)
    rc, out = probe_in_subprocess("libptlfake_sys.so.1", [tmp_path / "empty"], lib.parent)
    assert rc == 0 and out == str(lib)


@needs_cc
def test_loader_reports_a_broken_wheel_file_instead_of_skipping_it(tmp_path):
    good = fake_wheel(tmp_path, "sys", "libptlfake_broken.so.1", 7)
    broken = tmp_path / "site/vendor/lib/libptlfake_broken.so.1"
    broken.parent.mkdir(parents=True)
    broken.write_bytes(b"not an ELF file")
    rc, out = probe_in_subprocess("libptlfake_broken.so.1", [tmp_path / "site"], good.parent)
    assert rc == 3, out
    assert out.startswith("Fake at %s could not be loaded" % broken) and "pip install --force-reinstall fake-pkg" in out


def test_loader_names_a_missing_library_and_how_to_install_it(tmp_path, roots):
    roots([tmp_path / "x", tmp_path / "y"])
    with pytest.raises(ptl.CudaError) as e:
        probe("libptlfake_absent.so.1")
    msg = str(e.value)
    assert msg.startswith("Fake (libptlfake_absent.so.1) could not be loaded")
    assert "Install it with `pip install ptl[fake]` (the fake-pkg wheel)" in msg
    assert "Looked in: %s/vendor/lib/libptlfake_absent.so.1, %s/vendor/lib/libptlfake_absent.so.1, the system " \
        "library path" % (tmp_path / "x", tmp_path / "y") in msg


@needs_cc
def test_loader_names_a_missing_symbol(tmp_path, roots):
    lib = fake_wheel(tmp_path, "a", "libptlfake_old.so.1", 1)
    roots([tmp_path / "a"])
    with pytest.raises(ptl.CudaError, match="Fake at %s lacks ptlfake_newer: it is older than the "
                       r"libptlfake_old.so.1 ptl was built against; install a newer one with `pip install -U "
                       "fake-pkg`" % re.escape(str(lib))):
        probe("libptlfake_old.so.1", ["ptlfake_value", "ptlfake_newer"])


def test_library_roots_are_sys_path_folders_with_nvidia_wheels(tmp_path, monkeypatch):
    (tmp_path / "with" / "nvidia").mkdir(parents=True)
    (tmp_path / "without").mkdir()
    monkeypatch.setattr(sys, "path", ["", str(tmp_path / "without"), str(tmp_path / "with"), str(tmp_path / "with")])
    assert ptl.cuda._library_roots() == [str(tmp_path / "with")]


# ---- the CUDA build ----------------------------------------------------------------------------------

@needs_cuda_build
@pytest.mark.skipif(shutil.which("readelf") is None, reason="no readelf")
def test_extension_links_no_cuda_library():
    dyn = subprocess.run(["readelf", "-d", "--dyn-syms", "-W", _C.__file__], capture_output=True, text=True,
                         check=True).stdout
    needed = re.findall(r"\(NEEDED\).*\[(.*)\]", dyn)
    assert needed and not [n for n in needed if re.match(r"lib(cuda|cudart|cublas|cudnn|nccl|nvrtc)", n)], needed
    undefined = [line.split()[-1] for line in dyn.splitlines() if " UND " in line]
    assert not [s for s in undefined if s.startswith(("cublas", "cudnn"))]  # all defined by cuda/dynload.c


@needs_cuda_build
def test_cuda_libraries_resolve_from_the_nvidia_wheels():
    """Every cuBLAS/cuDNN function ptl calls exists in the wheels of ptl[cuda] (no GPU needed to check)."""
    want = {"cuBLASLt": "cu13/lib/libcublasLt.so.13", "cuBLAS": "cu13/lib/libcublas.so.13",
            "cuDNN": "cudnn/lib/libcudnn.so.9"}
    roots = ptl.cuda._library_roots()
    if not all(any(os.path.exists(os.path.join(r, "nvidia", f)) for r in roots) for f in want.values()):
        pytest.skip("the nvidia-cublas / nvidia-cudnn-cu13 wheels are not installed")
    got = ptl.cuda.libraries()
    for name, tail in want.items():
        assert any(got[name] == os.path.join(r, "nvidia", tail) for r in roots), (name, got[name])
    # the forwarding definitions call into them
    assert _C._cuda_status_names() == ("CUBLAS_STATUS_SUCCESS", "CUDNN_STATUS_SUCCESS")


@needs_cuda_build
def test_is_available_is_false_without_a_visible_gpu():
    code = "import ptl; assert ptl.cuda.is_available() is False; assert ptl.cuda.device_count() == 0"
    subprocess.run([sys.executable, "-c", code], check=True, cwd=REPO,
                   env=dict(os.environ, CUDA_VISIBLE_DEVICES="", PYTHONPATH=str(REPO)))


# ---- tools/manylinux.py ------------------------------------------------------------------------------

@pytest.fixture
def manylinux():
    pytest.importorskip("elftools")
    if shutil.which("patchelf") is None:
        pytest.skip("no patchelf")
    return load_module("ptl_manylinux", REPO / "tools" / "manylinux.py")


USES_NEW_GLIBC = """#include <math.h>
#include <pthread.h>
static void *run(void *p) { *(double *)p = exp(*(double *)p); return 0; }
double new_glibc(double x) { pthread_t t; pthread_create(&t, 0, run, &x); pthread_join(t, 0); return x + log(2.0) + pow(x, 0.5); }
void *exp_address(void) { return (void *)&exp; }
"""


@needs_cc
def test_lower_rebinds_to_glibc_2_28_versions(tmp_path, manylinux):
    lib = shared_library(tmp_path, "libnew.so", "libnew.so", USES_NEW_GLIBC)
    before = {(s, v) for s, _, v in manylinux.too_new_symbols(str(lib))}
    if not before:
        pytest.skip("this glibc is old enough already")
    assert manylinux.lower(str(lib)) and manylinux.too_new_symbols(str(lib)) == []
    versions = subprocess.run(["readelf", "-V", str(lib)], capture_output=True, text=True, check=True).stdout
    assert not re.search(r"GLIBC_2\.(29|[3-9]\d)", versions)
    dl = ctypes.CDLL(str(lib))
    dl.new_glibc.restype, dl.new_glibc.argtypes = ctypes.c_double, [ctypes.c_double]
    e = math.exp(1.5)
    assert dl.new_glibc(1.5) == e + math.log(2.0) + e ** 0.5
    libc = ctypes.CDLL(None)
    libc.dlvsym.restype, libc.dlvsym.argtypes = ctypes.c_void_p, [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_char_p]
    dl.exp_address.restype = ctypes.c_void_p
    assert dl.exp_address() == libc.dlvsym(None, b"exp", b"GLIBC_2.2.5")  # what a glibc 2.28 link binds


@needs_cc
def test_lower_refuses_a_function_glibc_2_28_lacks(tmp_path, manylinux):
    lib = shared_library(tmp_path, "libfstat.so", "libfstat.so",
                         "#include <sys/stat.h>\nlong size(int fd) { struct stat s; return fstat(fd, &s) ? -1 : s.st_size; }\n")
    if not manylinux.too_new_symbols(str(lib)):
        pytest.skip("this glibc has no fstat symbol newer than 2.28")
    with pytest.raises(RuntimeError, match=r"fstat \(GLIBC_2\.33, libc\.so\.6\) has no version <= GLIBC_2\.28"):
        manylinux.lower(str(lib))


def test_rebind_rule(manylinux):
    base = "GLIBC_2.2.5"
    defs = {"moved": [(base, True), ("GLIBC_2.34", False)],
            "abi_changed": [(base, True), ("GLIBC_2.3.2", False), ("GLIBC_2.34", False)],
            "no_base": [("GLIBC_2.3.3", True), ("GLIBC_2.3.4", True), ("GLIBC_2.32", False)],
            "new": [("GLIBC_2.33", False)]}
    assert manylinux._rebindable("moved", defs, base) is None
    assert manylinux._rebindable("no_base", defs, base) is None
    assert "several old versions" in manylinux._rebindable("abi_changed", defs, base)
    assert "has no version <=" in manylinux._rebindable("new", defs, base)


# ---- the wheel ---------------------------------------------------------------------------------------

@pytest.mark.slow
@pytest.mark.skipif(not _C.WITH_CUDA or shutil.which("nvcc") is None and not os.environ.get("CUDA_HOME"),
                    reason="the wheel test builds the CUDA wheel")
def test_repaired_wheel_installs_and_fits_like_the_source_tree(tmp_path, manylinux):
    shared = shared_dir()
    if shared is None:
        pytest.skip("../shared (data/coco256) not found")
    env = dict(os.environ, PTL_SHARED=str(shared))
    r = subprocess.run(["bash", str(REPO / ".ci" / "wheel_test.sh"), str(tmp_path / "work")], capture_output=True,
                       text=True, env=env)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    wheel = json.loads(r.stdout.strip().splitlines()[-1])
    assert wheel["ptl"].startswith(str(tmp_path / "work" / "venv"))
    # the portable wheel is built without oneDNN (.ci/wheel_test.sh): the source tree's fit on the same kernels
    src = subprocess.run([sys.executable, str(REPO / ".ci" / "wheel_fit.py"), str(shared / "data/coco256/data.yaml"),
                          str(tmp_path / "src_run")], capture_output=True, text=True, cwd=REPO,
                         env=dict(os.environ, PYTHONPATH=str(REPO), PTL_CPU_KERNELS="reference"), check=True)
    assert json.loads(src.stdout.strip().splitlines()[-1])["digest"] == wheel["digest"]
