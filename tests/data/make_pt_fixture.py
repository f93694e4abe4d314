"""Writes the committed .pt fixtures of tests/test_weights.py (needs torch and ultralytics==8.4.190).

    YOLO_OFFLINE=1 python tests/data/make_pt_fixture.py

- ``yolo26n_3cls_fp16.pt``: a yolo26n with 3 named classes, saved as Ultralytics' ``YOLO.save`` saves
  (fp16 weights, the ``model`` entry, as released checkpoints are: the same dict, written by
  ``torch.save``). A real yolo26n is ~5 MB in fp16, so every floating-point tensor is first made a
  contiguous window into one shared fp16 storage (positive values for BatchNorm scales and
  variances, small signed ones elsewhere): torch.save writes each storage once and the file stays small. ``YOLO.save``
  itself would deep-copy the model, which gives every tensor its own storage again; that copy is the
  only step left out.
- ``yolo26n_3cls_fp16.json``: what torch reads back from it: per tensor of ``state_dict()`` the shape,
  dtype and SHA256 of its (float32 or int64) bytes; scale, class count and names.
- ``yolo26n_3cls_fp16_out.npz``: an image (uint8 NHWC) and Ultralytics' raw head outputs for it (eval
  mode; boxes (1, A, 4) and score logits (1, A, 3) per branch, ptl's layout).
- ``tensors.pt`` / ``tensors.npz``: torch.save of tensors of every storage dtype the reader handles,
  including non-contiguous views and a storage offset, and their values (bfloat16 widened to float32).
"""
import hashlib
import json
import os
import pathlib

import numpy as np
import torch

os.environ.setdefault("YOLO_OFFLINE", "1")
HERE = pathlib.Path(__file__).resolve().parent
NAMES = {0: "cat", 1: "dog", 2: "traffic light"}
POSITIVE, SPREAD = 4096, 4096


def shared_windows(model, seed=0):
    """Every floating tensor of `model` becomes a window into one shared fp16 storage: its first
    POSITIVE elements are in [0.5, 1.5) (for BatchNorm scales and variances), the rest in [-0.1, 0.1)."""
    tensors = [(n, t) for n, t in model.state_dict(keep_vars=True).items() if t.is_floating_point()]
    positive = [n.endswith("running_var") or n.endswith("bn.weight") for n, _ in tensors]
    longest = max(t.numel() for (_, t), pos in zip(tensors, positive) if not pos)
    widest = max(t.numel() for (_, t), pos in zip(tensors, positive) if pos)
    g = torch.Generator().manual_seed(seed)
    pool = torch.rand(POSITIVE + SPREAD + longest, generator=g)
    pool[:POSITIVE] += 0.5
    pool[POSITIVE:] = pool[POSITIVE:] * 0.2 - 0.1
    pool = pool.half()
    for i, ((name, t), pos) in enumerate(zip(tensors, positive)):
        off = (i * 97) % (POSITIVE - widest) if pos else POSITIVE + (i * 97) % SPREAD
        t.data = pool[off:off + t.numel()].view(t.shape)


def digest(t):
    a = t.detach().cpu().numpy()
    return hashlib.sha256(np.ascontiguousarray(a).tobytes()).hexdigest()


def main():
    from ultralytics import YOLO
    from ultralytics.nn.tasks import DetectionModel

    yolo = YOLO("yolo26n.yaml")
    yolo.model = DetectionModel("yolo26n.yaml", nc=3, verbose=False)
    yolo.model.names = dict(NAMES)
    yolo.model.half()
    shared_windows(yolo.model)
    pt = HERE / "yolo26n_3cls_fp16.pt"
    # ultralytics/engine/model.py Model.save, without its deepcopy (which would unshare the storages)
    from datetime import datetime

    from ultralytics import __version__
    torch.save({**yolo.ckpt, "ema": None, "model": yolo.model, "modelopt": None,
                "date": datetime.now().astimezone().isoformat(), "version": __version__,
                "license": "AGPL-3.0 License (https://ultralytics.com/license)", "docs": "https://docs.ultralytics.com"},
               str(pt))

    model = torch.load(str(pt), map_location="cpu", weights_only=False)["model"].float().eval()
    sd = model.state_dict()
    meta = {"scale": model.yaml["scale"], "num_classes": model.yaml["nc"], "names": [NAMES[i] for i in range(3)],
            "entry": "model",
            "tensors": [[k, list(v.shape), str(v.dtype).replace("torch.", ""), digest(v)] for k, v in sd.items()]}
    (HERE / "yolo26n_3cls_fp16.json").write_text(json.dumps(meta, indent=0) + "\n")

    image = np.random.default_rng(1).integers(0, 256, (1, 64, 96, 3), dtype=np.uint8)  # NHWC, as ptl takes it
    with torch.no_grad():
        preds = model(torch.from_numpy(image).permute(0, 3, 1, 2).float() / 255)[1]
    out = {"image": image}
    for br in ("one2many", "one2one"):
        out[br + "_boxes"] = preds[br]["boxes"].permute(0, 2, 1).contiguous().numpy()
        out[br + "_scores"] = preds[br]["scores"].permute(0, 2, 1).contiguous().numpy()
    np.savez(HERE / "yolo26n_3cls_fp16_out.npz", **out)

    g = torch.Generator().manual_seed(2)
    base = torch.randn(4, 6, generator=g)
    tensors = {
        "f16": torch.randn(3, 5, generator=g).half(),
        "f32_transposed": base.t(),
        "f32_offset_view": base[1:3, 2:5],
        "f64": torch.randn(2, 2, generator=g).double(),
        "bf16": torch.randn(7, generator=g).bfloat16(),
        "i64": torch.arange(-3, 9).reshape(3, 4),
        "i8": torch.tensor([-128, 0, 127], dtype=torch.int8),
        "u8": torch.tensor([0, 255], dtype=torch.uint8),
        "bool": torch.tensor([True, False, True]),
        "scalar": torch.tensor(2.5),
        "empty": torch.zeros(0, 3),
        "param": torch.nn.Parameter(torch.randn(2, 3, generator=g)),
    }
    torch.save(tensors, str(HERE / "tensors.pt"))
    np.savez(HERE / "tensors.npz", **{k: (v.float() if v.dtype == torch.bfloat16 else v).detach().numpy()
                                      for k, v in tensors.items()})
    for f in sorted(HERE.iterdir()):
        if f.suffix in (".pt", ".json", ".npz"):
            print("%-28s %9d bytes" % (f.name, f.stat().st_size))


if __name__ == "__main__":
    main()
