"""Rules of the CUDA sources that no CPU test can run: every kernel is launched through ptl_launch, which may
start it before the kernel ahead of it in the stream has finished (programmatic dependent launch,
csrc/cuda/launch.cuh), so every kernel must begin by waiting for that kernel."""
import pathlib
import re

CUDA = pathlib.Path(__file__).resolve().parent.parent / "csrc" / "cuda"


def _code(path):
    """The file without its comments (a launch or a kernel named in a comment is not one)."""
    text = path.read_text()
    text = re.sub(r"/\*.*?\*/", lambda m: "\n" * m.group(0).count("\n"), text, flags=re.S)
    return re.sub(r"//[^\n]*", "", text)


def _sources():
    files = sorted(CUDA.glob("*.cu")) + sorted(CUDA.glob("*.cuh"))
    assert len(files) > 20
    return files


def _kernels(code):
    """(name, first statement) of every __global__ function defined in code."""
    out = []
    for m in re.finditer(r"__global__\b", code):
        body = code.index("{", m.end())
        if ";" in code[m.end():body]:
            continue  # a declaration
        head = re.sub(r"__launch_bounds__\s*\([^()]*\)", "", code[m.end():body])
        name = re.search(r"(\w+)\s*\(", head).group(1)
        first = code[body + 1:].lstrip().split(";", 1)[0].strip()
        out.append((name, first))
    return out


def test_every_kernel_waits_for_the_one_before_it():
    kernels = []
    for f in _sources():
        for name, first in _kernels(_code(f)):
            kernels.append(name)
            assert first == "ptl_wait_prior()", "%s: kernel %s begins with %r, not ptl_wait_prior()" % (
                f.name, name, first)
    assert len(kernels) >= 50, kernels


def test_kernels_are_launched_through_ptl_launch():
    for f in _sources():
        code = _code(f)
        assert "<<<" not in code, "%s launches with <<<...>>> (use ptl_launch, csrc/cuda/launch.cuh)" % f.name
        if "ptl_launch(" in code and f.name != "launch.cuh":
            assert '#include "launch.cuh"' in code or '#include "layers_common.cuh"' in code, f.name


def test_the_rule_catches_a_kernel_without_the_wait():
    code = "template <typename T>\n__global__ void k(int n, T *y)\n{\n    y[0] = 1;\n}\n"
    assert _kernels(code) == [("k", "y[0] = 1")]
    code = "__global__ void __launch_bounds__(128)\nk2(int n)\n{\n    ptl_wait_prior();\n}\n"
    assert _kernels(code) == [("k2", "ptl_wait_prior()")]
