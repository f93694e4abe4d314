import importlib.util
import os
import pathlib
import sys

import pytest

REPO = pathlib.Path(__file__).resolve().parent.parent


def shared_dir():
    """../shared beside the checkout (CI, developers) or .device/ inside it (the GPU machine)."""
    for cand in (os.environ.get("PTL_SHARED"), REPO.parent / "shared", REPO / ".device"):
        if cand and (pathlib.Path(cand) / "data" / "coco256").is_dir():
            return pathlib.Path(cand)
    return None


@pytest.fixture(scope="session")
def shared():
    d = shared_dir()
    if d is None:
        pytest.skip("../shared (data/coco256) not found; set PTL_SHARED")
    return d


@pytest.fixture(scope="session")
def coco256(shared):
    return shared / "data" / "coco256"


@pytest.fixture(scope="session")
def torchref(shared):
    """The torchref package directory importable as `torchref` (needs torch)."""
    pytest.importorskip("torch")
    ref = shared / "torchref"
    if not ref.is_dir():
        pytest.skip("torchref not found")
    if str(shared) not in sys.path:
        sys.path.insert(0, str(shared))
    import torchref  # noqa: F401
    return ref


def pytest_collection_modifyitems(config, items):
    import ptl

    has_cuda = ptl.cuda.is_available()
    # found, not imported: importing torch or ultralytics here would cost every run seconds
    has_torch = importlib.util.find_spec("torch") is not None
    has_ultralytics = importlib.util.find_spec("ultralytics") is not None
    skip_cuda = pytest.mark.skip(reason="no CUDA device")
    skip_ultralytics = pytest.mark.skip(reason="ultralytics not installed")
    skip_torch = pytest.mark.skip(reason="torch not installed")
    for item in items:
        if "cuda" in item.keywords and not has_cuda:
            item.add_marker(skip_cuda)
        if "torchref" in item.keywords and not has_torch:
            item.add_marker(skip_torch)
        if "ultralytics" in item.keywords and not has_ultralytics:
            item.add_marker(skip_ultralytics)
