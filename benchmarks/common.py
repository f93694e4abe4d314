"""What the benchmark scripts share: where ../shared is, and the network case they time."""
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, ".."))


def shared_dir(needs):
    """The shared folder (PTL_SHARED, ../shared beside the checkout, or the repo's .device copy) that holds
    `needs` (a path inside it), or None."""
    for root in (os.environ.get("PTL_SHARED"), os.path.join(HERE, "..", "..", "shared"),
                 os.path.join(HERE, "..", ".device")):
        if root and os.path.exists(os.path.join(root, needs)):
            return os.path.abspath(root)
    return None


def coco256_yaml():
    root = shared_dir(os.path.join("data", "coco256", "data.yaml"))
    return os.path.join(root, "data", "coco256", "data.yaml") if root else None


def network_case(batch, imgsz, dtype, seed=7):
    """yolo26n on the GPU with a fixed random image batch and fixed output gradients (1e-3):
    (the Detector on the GPU, images tensor, gradient dict), forward run once."""
    import numpy as np

    import ptl
    from ptl.model import Detector
    net = Detector("yolo26n", num_classes=80, seed=0).to("cuda", dtype=dtype)
    x = np.random.default_rng(seed).random((batch, imgsz, imgsz, 3)).astype(np.float32)
    img = ptl.tensor(x, device="cuda").to(dtype=dtype)
    out = net.forward(img)
    grads = {br: tuple(ptl.tensor(np.full(tuple(t.shape), 1e-3, np.float32), device="cuda") for t in out[br])
             for br in out}
    return net, img, grads
