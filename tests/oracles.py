"""Helpers shared by tests: weights whose outputs depend on the image, and pycocotools' COCOeval."""
import contextlib
import io

import numpy as np
import pytest


def signal_state_dict(det, seed):
    """det's state_dict with BatchNorm away from its init (weights and running variances in [0.5, 1.5),
    biases and running means in [-0.3, 0.3)) and conv weights at twice the init's scale: the init shrinks
    activations layer by layer, leaving the outputs near their biases whatever the image."""
    sd, rng = det.state_dict(), np.random.default_rng(seed)
    for k in sd:
        if k.endswith("bn.weight") or k.endswith("running_var"):
            sd[k] = rng.uniform(0.5, 1.5, sd[k].shape).astype(np.float32)
        elif k.endswith("bn.bias") or k.endswith("running_mean"):
            sd[k] = rng.uniform(-0.3, 0.3, sd[k].shape).astype(np.float32)
        elif k.endswith("conv.weight"):
            sd[k] = sd[k] * 2
    return sd


def pycocotools_stats(gt, results):
    """COCOeval's 12 bbox statistics (stats[0] mAP50-95, stats[1] mAP50) of `results` (COCO result dicts)
    against the ground-truth dataset dict `gt`; skips the test without pycocotools."""
    pytest.importorskip("pycocotools")
    from pycocotools.coco import COCO
    from pycocotools.cocoeval import COCOeval
    with contextlib.redirect_stdout(io.StringIO()):
        g = COCO()
        g.dataset = gt
        g.createIndex()
        ev = COCOeval(g, g.loadRes(results), "bbox")
        ev.evaluate()
        ev.accumulate()
        ev.summarize()
    return ev.stats
