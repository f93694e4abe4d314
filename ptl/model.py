"""Detector: the YOLO26 detection network (spec §1-2) over the C network of csrc/nn/network.c.

Parameters live in one flat buffer, gradients in one of the same layout and BatchNorm running
statistics in a third; every named tensor is a view (offset, shape) into its buffer, named exactly
as Ultralytics' state_dict keys (``model.0.conv.weight``, ``model.0.bn.running_var``, ...).

``num_batches_tracked`` is not part of ``state_dict()``: BatchNorm here uses a fixed momentum (§1.1),
so the counter has no effect. ``load_state_dict`` accepts and ignores such keys, so an Ultralytics or
torch state_dict loads unchanged.
"""
from __future__ import annotations

import re
from collections import OrderedDict

import numpy as np

from . import _C

__all__ = ["Detector"]

_BRANCHES = ("one2many", "one2one")


def _parse_scale(model, scale):
    if scale is not None:
        s = str(scale)
    elif model is None:
        s = "n"
    else:
        m = re.fullmatch(r"(?:yolo26)?([nsmlx])", str(model))
        if not m:
            raise ValueError(f"model: expected 'yolo26n', 'yolo26s', 'yolo26m', 'yolo26l' or 'yolo26x', got {model!r}")
        s = m.group(1)
    if s not in ("n", "s", "m", "l", "x"):
        raise ValueError(f"scale: expected one of 'n', 's', 'm', 'l', 'x', got {s!r}")
    return s


class Detector:
    """YOLO26 detector. ``Detector("yolo26n", num_classes=80)`` or ``Detector(scale="s")``.

    ``dtype="float64"`` builds a float64 CPU network (for gradient checks); training uses float32.
    The network starts in training mode (BatchNorm normalises with batch statistics).
    ``hparams`` overrides training hyperparameters (see :attr:`hparams`), the loss gains included.
    """

    def __init__(self, model: str | None = "yolo26n", num_classes: int = 80, *, scale: str | None = None,
                 seed: int = 0, dtype: str = "float32", hparams: dict | None = None):
        self.scale = _parse_scale(None if scale is not None else model, scale)
        if not isinstance(num_classes, (int, np.integer)) or isinstance(num_classes, bool) or num_classes < 1:
            raise ValueError(f"num_classes: expected a positive int, got {num_classes!r}")
        self.num_classes = int(num_classes)
        self._net = _C.network_create(self.scale, self.num_classes, str(dtype), int(seed))
        info = _C.network_info(self._net)
        self.dtype = info["dtype"]
        self.strides = tuple(info["strides"])
        self._layer_params = list(info["layer_parameters"])
        self._entries = _C.network_entries(self._net)
        self._params = _C.network_array(self._net, "params")
        self._grads = _C.network_array(self._net, "grads")
        self._buffers = _C.network_array(self._net, "buffers")
        self._exec = _C.executor_create(self._net)  # the executor on the CPU, over the arrays above
        self._index = {name: (is_buf, off, tuple(shape)) for name, is_buf, off, shape, _ in self._entries}
        self.hparams = hparams
        self.training = True
        self.device = "cpu"
        self._cuda = None  # the CUDA executor while the model lives on a GPU
        self._layout = "nchw"  # layout of the last forward's images, for input gradients

    # ------------------------------------------------------------------------- hyperparameters
    HPARAMS = ("optimizer", "lr0", "lrf", "momentum", "weight_decay", "warmup_epochs", "warmup_momentum",
               "warmup_bias_lr", "nbs", "cos_lr", "ema_decay", "ema_tau", "box", "cls", "dfl")

    @property
    def hparams(self) -> dict:
        """Training hyperparameters the Trainer reads (spec §10 defaults for those not given):
        optimizer ("auto", "MuSGD", "SGD", "AdamW"), lr0, lrf, momentum, weight_decay, warmup_epochs,
        warmup_momentum, warmup_bias_lr, nbs, cos_lr, ema_decay, ema_tau, and the loss gains box (7.5),
        cls (0.5) and dfl (1.5; with reg_max = 1 it weighs the L1 box term)."""
        return dict(self._hparams)

    @hparams.setter
    def hparams(self, value) -> None:
        value = dict(value or {})
        unknown = sorted(set(value) - set(self.HPARAMS))
        if unknown:
            raise KeyError(f"hparams: unknown keys {unknown}; expected some of {list(self.HPARAMS)}")
        for k in ("box", "cls", "dfl"):
            if k in value and not (isinstance(value[k], (int, float)) and 0 <= value[k] < float("inf")):
                raise ValueError(f"hparams: {k} gain must be a finite number >= 0, got {value[k]!r}")
        self._hparams = value

    # ------------------------------------------------------------------------------ structure
    @property
    def model_name(self) -> str:
        return "yolo26" + self.scale

    @property
    def loss_gains(self) -> tuple:
        """(box, cls, l1) gains of the objective, from hparams box / cls / dfl (spec §10 defaults)."""
        from .objective import GAINS
        h = self._hparams
        return (float(h.get("box", GAINS[0])), float(h.get("cls", GAINS[1])), float(h.get("dfl", GAINS[2])))

    def num_parameters(self) -> int:
        """Trainable parameters, both heads included (spec §1.6)."""
        return int(self._params.size)

    def layer_parameters(self) -> list:
        """Parameters per spec layer 0..23."""
        return list(self._layer_params)

    def parameter_table(self) -> list:
        """[(name, offset, shape)] of every parameter in the flat buffer, in state_dict order."""
        return [(n, off, tuple(s)) for n, is_buf, off, s, _ in self._entries if not is_buf]

    def buffer_table(self) -> list:
        """[(name, offset, shape)] of the BatchNorm running statistics in the flat buffer."""
        return [(n, off, tuple(s)) for n, is_buf, off, s, _ in self._entries if is_buf]

    @property
    def flat_parameters(self):
        """The flat float32 parameter buffer the network reads on every forward: a writable NumPy view on
        the CPU, a float32 ptl.Tensor on the device after ``to("cuda")``."""
        return self._params if self._cuda is None else self._cuda.params

    @property
    def flat_gradients(self):
        """The flat gradient buffer (same layout and device as the parameters); backward adds to it."""
        return self._grads if self._cuda is None else self._cuda.grads

    @property
    def flat_buffers(self):
        """The flat BatchNorm running-statistics buffer (same device as the parameters)."""
        return self._buffers if self._cuda is None else self._cuda.buffers

    def zero_grad(self) -> None:
        if self._cuda is not None:
            self._cuda.zero_grad()
        else:
            self._grads[...] = 0

    def reset_parameters(self, seed: int = 0) -> None:
        """Re-initialise every parameter and BN statistic (spec §1.7)."""
        _C.network_init(self._net, int(seed))
        if self._cuda is not None:
            self._cuda.from_cpu()

    # ---------------------------------------------------------------------------------- modes
    def train(self, mode: bool = True) -> "Detector":
        self.training = bool(mode)
        _C.network_set_training(self._net, self.training)
        _C.executor_set_training(self._exec, self.training)
        if self._cuda is not None:
            self._cuda.train(self.training)
        return self

    def eval(self) -> "Detector":
        return self.train(False)

    def to(self, device, dtype: str | None = None) -> "Detector":
        """Moves the network to ``"cpu"`` or ``"cuda[:N]"``. On CUDA, ``dtype`` is the compute precision
        ("float32", "bfloat16" or "float16"; master weights, gradients and BN statistics stay float32).
        Parameters, BN statistics and gradients move along."""
        dev = str(device)
        if dev == "cpu":
            if self._cuda is not None:
                self._cuda.to_cpu(grads=True)
                self._cuda = None
            self.device = "cpu"
            return self
        if not dev.startswith("cuda"):
            raise ValueError(f"device: expected 'cpu' or 'cuda[:N]', got {device!r}")
        if self.dtype != "float32":
            raise ValueError(f"to: a {self.dtype} network stays on the CPU (float64 is for gradient checks)")
        from . import cuda
        if not cuda.is_available():
            raise ValueError(f"device: {dev!r} requested but no CUDA device is available")
        from ._network_cuda import CudaNetwork
        dt = dtype or (self._cuda.dtype if self._cuda is not None else "float32")
        if self._cuda is not None:
            self._cuda.to_cpu(grads=True)
        self._cuda = CudaNetwork(self, dev, dt)
        self._cuda.from_cpu(grads=True)
        self.device = self._cuda.device
        return self

    @property
    def compute_dtype(self) -> str:
        """The dtype activations are computed in: the network dtype on the CPU, ``to``'s dtype on CUDA."""
        return self.dtype if self._cuda is None else self._cuda.dtype

    # ----------------------------------------------------------------------------- state dict
    def state_dict(self) -> "OrderedDict[str, np.ndarray]":
        """name -> NumPy copy, parameters and BN running statistics, in Ultralytics key order."""
        if self._cuda is not None:
            self._cuda.to_cpu(grads=False)
        out = OrderedDict()
        for name, is_buf, off, shape, _ in self._entries:
            src = self._buffers if is_buf else self._params
            n = int(np.prod(shape))
            out[name] = src[off:off + n].reshape(shape).copy()
        return out

    def load_state_dict(self, state, strict: bool = True) -> None:
        """Copies tensors by name. Every check runs before anything is written.

        strict: missing or unexpected keys raise KeyError listing them (``*.num_batches_tracked`` is
        always accepted and ignored). A value of the wrong shape raises ValueError (strict or not).
        """
        items = {}
        unexpected = []
        for k, v in dict(state).items():
            if k.endswith(".num_batches_tracked"):
                continue
            if k not in self._index:
                unexpected.append(k)
                continue
            items[k] = v
        missing = [k for k in self._index if k not in items]
        if strict and (missing or unexpected):
            raise KeyError(f"load_state_dict: missing keys {missing} ; unexpected keys {unexpected}")
        bad = []
        arrays = {}
        for k, v in items.items():
            if isinstance(v, tuple) and len(v) == 2 and v[1] == "BF16":  # ptl.io's bfloat16 form
                from .io import bf16_to_float32
                v = bf16_to_float32(v[0])
            a = np.asarray(v.numpy() if hasattr(v, "numpy") and not isinstance(v, np.ndarray) else v)
            shape = self._index[k][2]
            if tuple(a.shape) != shape:
                bad.append(f"{k}: got {tuple(a.shape)}, expected {shape}")
                continue
            if not np.issubdtype(a.dtype, np.floating) and not np.issubdtype(a.dtype, np.integer):
                bad.append(f"{k}: dtype {a.dtype} is not numeric")
                continue
            arrays[k] = a
        if bad:
            raise ValueError("load_state_dict: mis-shaped values: " + "; ".join(bad))
        if self._cuda is not None:  # keys a non-strict load leaves out keep the device's values
            self._cuda.to_cpu(grads=False)
        for k, a in arrays.items():
            is_buf, off, shape = self._index[k]
            dst = self._buffers if is_buf else self._params
            dst[off:off + a.size] = a.reshape(-1)
        if self._cuda is not None:
            self._cuda.from_cpu()

    # ---------------------------------------------------------------------------- save / load
    def save(self, path) -> None:
        """Writes the state_dict as .safetensors (through ptl.io), with scale and classes as metadata."""
        io = _io()
        io.save_safetensors(path, self.state_dict(),
                            metadata={"model": self.model_name, "num_classes": str(self.num_classes)})

    @classmethod
    def load(cls, path, **kw) -> "Detector":
        io = _io()
        tensors, meta = _load_with_metadata(io, path)
        model = kw.pop("model", None) or (meta or {}).get("model", "yolo26n")
        nc = kw.pop("num_classes", None) or int((meta or {}).get("num_classes", 80))
        det = cls(model, num_classes=nc, **kw)
        det.load_state_dict(tensors, strict=True)
        return det

    # -------------------------------------------------------------------------------- forward
    def _images(self, images):
        x = np.asarray(images.numpy() if hasattr(images, "numpy") and not isinstance(images, np.ndarray) else images)
        if x.ndim != 4:
            raise ValueError(f"images: expected (N, 3, H, W) float or (N, H, W, 3) uint8, got shape {x.shape}")
        if x.dtype == np.uint8:
            if x.shape[3] != 3:
                raise ValueError(f"images: uint8 images must be (N, H, W, 3), got shape {x.shape}")
            self._layout = "nhwc"
            nhwc = x.astype(self.dtype) / np.asarray(255, dtype=self.dtype)
        elif np.issubdtype(x.dtype, np.floating):
            if x.shape[1] != 3:
                raise ValueError(f"images: float images must be (N, 3, H, W) in [0, 1], got shape {x.shape}")
            self._layout = "nchw"
            nhwc = x.transpose(0, 2, 3, 1).astype(self.dtype)
        else:
            raise TypeError(f"images: expected a float or uint8 array, got {x.dtype}")
        return np.ascontiguousarray(nhwc)

    def forward(self, images) -> dict:
        """Raw head outputs: {"one2many": (boxes, scores), "one2one": (boxes, scores)}, boxes (N, A, 4)
        l, t, r, b in grid units, scores (N, A, nc) logits; A = sum over P3, P4, P5 of H_i * W_i."""
        if self._cuda is not None:
            return self._cuda.forward(images)
        b0, s0, b1, s1 = _C.executor_forward(self._exec, _C.from_numpy(self._images(images)))
        return {"one2many": (b0.numpy(), s0.numpy()), "one2one": (b1.numpy(), s1.numpy())}

    __call__ = forward

    def backward(self, grads: dict, input_grad: bool = False):
        """Backward of the last forward. grads: {"one2many": (d_boxes, d_scores), "one2one": (...)} with
        arrays shaped like the outputs (a missing branch or None entry is zero). Parameter gradients
        accumulate into ``flat_gradients``. With input_grad, returns d loss / d images in the layout of
        the forward's float input (N, 3, H, W). On CUDA the gradients are float32 device tensors (or
        arrays, uploaded) and the input gradient comes back as an NHWC device tensor."""
        if self._cuda is not None:
            return self._cuda.backward(grads, input_grad=input_grad)
        d = []
        for br in _BRANCHES:
            pair = grads.get(br) or (None, None)
            for a in pair:
                d.append(None if a is None else _C.from_numpy(np.ascontiguousarray(a, dtype=self.dtype)))
        g = _C.executor_backward(self._exec, *d, input_grad=bool(input_grad))
        if g is None:
            return None
        g = g.numpy()
        return np.ascontiguousarray(g.transpose(0, 3, 1, 2)) if self._layout == "nchw" else g

    def predict(self, images, conf: float = 0.25, max_det: int = 300) -> list:
        """Detections from the one-to-one head (spec §8.2: top-k, no NMS), eval mode. Returns per image
        {"boxes": (k, 4) xyxy pixels, "scores": (k,), "classes": (k,) int64}, score descending."""
        x = self._images(images)
        was = self.training
        self.eval()
        try:
            if self._cuda is not None:
                b1, s1 = self._cuda.forward(images)["one2one"]
            else:
                _, _, b1, s1 = _C.executor_forward(self._exec, _C.from_numpy(x))
        finally:
            self.train(was)
        H, W = x.shape[1], x.shape[2]
        if not isinstance(b1, _C.Tensor):
            b1 = _C.tensor(np.ascontiguousarray(b1, dtype=np.float32))
            s1 = _C.tensor(np.ascontiguousarray(s1, dtype=np.float32))
        out, count = _C.postprocess(b1, s1, H, W, int(max_det), float(conf))
        out, count = out.numpy(), count.numpy()
        res = []
        for i in range(out.shape[0]):
            rows = out[i, :int(count[i])]
            res.append({"boxes": rows[:, :4].copy(), "scores": rows[:, 4].copy(),
                        "classes": rows[:, 5].astype(np.int64)})
        return res

    def anchors(self, height: int, width: int):
        """Anchor centres (A, 2) in grid units and per-anchor strides (A,), P3 then P4 then P5 (§2)."""
        pts, strd = [], []
        for s in self.strides:
            ys, xs = np.meshgrid(np.arange(height // s) + 0.5, np.arange(width // s) + 0.5, indexing="ij")
            pts.append(np.stack([xs.ravel(), ys.ravel()], 1))
            strd.append(np.full(ys.size, float(s)))
        return np.concatenate(pts).astype(np.float32), np.concatenate(strd).astype(np.float32)

    def __repr__(self):
        return (f"Detector({self.model_name!r}, num_classes={self.num_classes}, parameters={self.num_parameters():,}, "
                f"dtype={self.dtype}, training={self.training})")


def _io():
    try:
        from . import io
    except ImportError as e:
        raise NotImplementedError("Detector.save/load need ptl.io (the safetensors reader/writer)") from e
    return io


def _load_with_metadata(io, path):
    res = io.load_safetensors(path)
    if isinstance(res, tuple):
        return res[0], res[1]
    return res, getattr(io, "read_metadata", lambda p: {})(path)
