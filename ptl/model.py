"""Detector: the YOLO26 detection network (spec §1-2): its description (csrc/nn/network.h) run by the
network executor (csrc/nn/executor.h) on the model's device, the CPU or a CUDA GPU.

Parameters live in one flat buffer, gradients in one of the same layout and BatchNorm running
statistics in a third, on the model's device (ptl.Tensors: ``flat_parameters``, ``flat_gradients``,
``flat_buffers``); every named tensor is a view (offset, shape) into its buffer, named exactly as
Ultralytics' state_dict keys (``model.0.conv.weight``, ``model.0.bn.running_var``, ...).

``num_batches_tracked`` is not part of ``state_dict()``: BatchNorm here uses a fixed momentum (§1.1),
so the counter has no effect. ``load_state_dict`` accepts and ignores such keys, so an Ultralytics or
torch state_dict loads unchanged.
"""
from __future__ import annotations

import os
import re
from collections import OrderedDict
from contextlib import contextmanager

import numpy as np

from . import _C
from . import metrics as _metrics

__all__ = ["Detector"]

_BRANCHES = ("one2many", "one2one")
_CUDA_DTYPES = ("float32", "bfloat16", "float16")


def _parse_device(device) -> str:
    """'cpu', 'cuda', 'cuda:N' or N -> 'cpu' / 'cuda:N'."""
    if isinstance(device, (int, np.integer)) and not isinstance(device, bool):
        s = "cuda:%d" % int(device)
    else:
        s = str(device)
    if s == "cpu":
        return s
    if s == "cuda":
        return "cuda:0"
    if s.startswith("cuda:") and s[5:].isdigit():
        return s
    raise ValueError(f"device: expected 'cpu' or 'cuda[:N]', got {device!r}")


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
    The network starts in training mode (BatchNorm normalises with batch statistics) on the CPU;
    ``to("cuda", dtype=...)`` moves it to a GPU with a compute precision.
    ``hparams`` overrides training hyperparameters (see :attr:`hparams`), the loss gains included.
    ``weights`` (a path: Ultralytics ``.pt``, ptl ``.safetensors`` or training checkpoint) starts from
    those weights as Ultralytics 8.4.190's ``load`` does (:mod:`ptl.weights`): built with the file's
    class-branch width when the head's input widths match the file's (the same scale), the class rows
    remapped by class name, then every tensor whose name and shape match copied; ``names`` are the
    class names (a list of ``num_classes`` strings; default "0", "1", ...). ``cls_width`` is the Detect
    head's class-branch width (None: spec §1.5's ``max(ch0, min(num_classes, 100))``, or the file's as
    just said).
    """

    def __init__(self, model: str | None = "yolo26n", num_classes: int = 80, *, scale: str | None = None,
                 seed: int = 0, dtype: str = "float32", hparams: dict | None = None, weights=None,
                 names=None, cls_width: int | None = None):
        from .weights import WeightsFile, read_weights, transfer_width
        self.scale = _parse_scale(None if scale is not None else model, scale)
        if not isinstance(num_classes, (int, np.integer)) or isinstance(num_classes, bool) or num_classes < 1:
            raise ValueError(f"num_classes: expected a positive int, got {num_classes!r}")
        if cls_width is not None and (not isinstance(cls_width, (int, np.integer)) or isinstance(cls_width, bool)
                                      or cls_width < 1):
            raise ValueError(f"cls_width: expected a positive int (None: the default width), got {cls_width!r}")
        self.num_classes = int(num_classes)
        wf = weights if weights is None or isinstance(weights, WeightsFile) else read_weights(weights)
        self._build(str(dtype), int(seed), int(cls_width or 0))
        notes = []
        if wf is not None and cls_width is None:
            width = transfer_width(wf.tensors, self._head_inputs, self.cls_width)
            if width is not None:  # 8.4.190 rebuilds the class branch at the source's width
                notes.append(f"class branch built {width} wide, the source's (the default for {self.num_classes} "
                             f"classes is {self.cls_width}), so all its hidden layers transfer")
                self._build(str(dtype), int(seed), width)
        self.hparams = hparams
        self.training = True
        self._grad = True  # False inside no_grad()
        self._layout = "nchw"  # layout of the last forward's images, for input gradients
        self._frozen = frozenset()  # set_frozen's names
        self._attach("cpu", self.dtype)
        self.names = names
        if wf is not None:  # weights: start from a file, transferring what matches (ptl.weights)
            self._load_file(wf, strict=False, verbose=True, notes=notes)

    def _build(self, dtype, seed, cls_width):
        """Creates the network description and its host views (cls_width 0: the default width)."""
        self._net = _C.network_create(self.scale, self.num_classes, dtype, seed, cls_width=cls_width)
        info = _C.network_info(self._net)
        self.dtype = info["dtype"]
        self.strides = tuple(info["strides"])
        self.cls_width = int(info["cls_width"])
        self._head_inputs = tuple(info["channels"])  # P3, P4, P5 widths the Detect head reads
        self._layer_params = list(info["layer_parameters"])
        self._entries = _C.network_entries(self._net)
        # the description's host storage (NumPy views): the CPU executor runs on it, state_dict reads it
        self._host = tuple(_C.network_array(self._net, w) for w in ("params", "grads", "buffers"))
        self._index = {name: (is_buf, off, tuple(shape)) for name, is_buf, off, shape, _ in self._entries}

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
        """Every value is range-checked here (:func:`ptl.hparams_check.check_hparams`: a ConfigError naming
        the key, before anything changes); the optimizer name is kept in its canonical spelling."""
        from .hparams_check import check_hparams
        self._hparams = check_hparams(dict(value or {}))

    # ------------------------------------------------------------------------------ structure
    @property
    def model_name(self) -> str:
        return "yolo26" + self.scale

    @property
    def names(self) -> list:
        """Class names, one per class (what predictions are labelled with; set from the data by ``fit``)."""
        return list(self._names)

    @names.setter
    def names(self, value) -> None:
        if value is None:
            value = [str(i) for i in range(self.num_classes)]
        elif isinstance(value, dict):
            if sorted(value) != list(range(self.num_classes)):
                raise ValueError("names: expected ids 0..%d, got %s" % (self.num_classes - 1, sorted(value)))
            value = [value[i] for i in range(self.num_classes)]
        value = [str(v) for v in value]
        if len(value) != self.num_classes:
            raise ValueError("names: expected %d class names, got %d" % (self.num_classes, len(value)))
        self._names = value

    @property
    def loss_gains(self) -> tuple:
        """(box, cls, l1) gains of the objective, from hparams box / cls / dfl (spec §10 defaults)."""
        from .objective import GAINS
        h = self._hparams
        return (float(h.get("box", GAINS[0])), float(h.get("cls", GAINS[1])), float(h.get("dfl", GAINS[2])))

    def num_parameters(self) -> int:
        """Trainable parameters, both heads included (spec §1.6)."""
        return int(self._host[0].size)

    def layer_parameters(self) -> list:
        """Parameters per spec layer 0..23."""
        return list(self._layer_params)

    def parameter_table(self) -> list:
        """[(name, offset, shape)] of every parameter in the flat buffer, in state_dict order."""
        return [(n, off, tuple(s)) for n, is_buf, off, s, _ in self._entries if not is_buf]

    def buffer_table(self) -> list:
        """[(name, offset, shape)] of the BatchNorm running statistics in the flat buffer."""
        return [(n, off, tuple(s)) for n, is_buf, off, s, _ in self._entries if is_buf]

    def _attach(self, device, dtype):
        """Makes the executor of `device` computing in `dtype` (its storage uploaded from the host's)."""
        self._exec = _C.executor_create(self._net, device, dtype)
        self._flat = _C.executor_tensors(self._exec)  # params, grads, buffers on the device
        _C.executor_configure(self._exec, training=self.training, grad=self._grad)
        if self._frozen:
            _C.executor_set_frozen(self._exec, self._frozen_flags(self._frozen))
        self.device, self._compute = device, dtype

    def _download(self, grads=False):
        """Brings the device's parameters and BN statistics (and gradients) to the host storage."""
        for which in ("params", "buffers") + (("grads",) if grads else ()):
            _C.executor_sync(self._exec, which, False)

    def _upload(self):
        for which in ("params", "buffers"):
            _C.executor_sync(self._exec, which, True)

    @property
    def flat_parameters(self):
        """The flat parameter buffer the network reads on every forward: a 1-D ptl.Tensor on the model's
        device (float32, or float64 for a float64 CPU network), updated in place by an optimizer.
        Assigning an array or tensor of the same size copies it in."""
        return self._flat[0]

    @flat_parameters.setter
    def flat_parameters(self, value):
        self._assign(0, value)

    @property
    def flat_gradients(self):
        """The flat gradient buffer (same layout and device as the parameters); backward adds to it."""
        return self._flat[1]

    @flat_gradients.setter
    def flat_gradients(self, value):
        self._assign(1, value)

    @property
    def flat_buffers(self):
        """The flat BatchNorm running-statistics buffer (same device as the parameters)."""
        return self._flat[2]

    @flat_buffers.setter
    def flat_buffers(self, value):
        self._assign(2, value)

    def _assign(self, k, value):
        dst = self._flat[k]
        src = value if isinstance(value, _C.Tensor) else _C.tensor(np.ascontiguousarray(value, dtype=dst.dtype))
        if src.numel() != dst.numel():
            raise ValueError(f"expected {dst.numel()} elements, got {src.numel()}")
        _C._optim_copy(dst, src.to(dtype=dst.dtype))

    def zero_grad(self) -> None:
        _C.executor_zero_grad(self._exec)

    def reset_parameters(self, seed: int = 0) -> None:
        """Re-initialise every parameter and BN statistic (spec §1.7)."""
        _C.network_init(self._net, int(seed))
        self._upload()

    # ---------------------------------------------------------------------------------- freezing
    def set_frozen(self, names=()) -> None:
        """Freezes the named tensors (Ultralytics' ``freeze``, which ``Trainer(freeze=...)`` resolves to
        names; docs/training.md): a frozen parameter's gradient is never computed, so backward leaves it
        as it is in :attr:`flat_gradients` (the optimizer must leave it out too: ``FlatOptimizer(frozen=)``);
        naming a BatchNorm's ``running_mean`` and ``running_var`` (both or neither) runs that BatchNorm in
        eval mode in training too. Gradients nothing trainable needs are skipped; the trainable tensors'
        gradients are the bits of an unfrozen backward. ``set_frozen()`` unfreezes everything. It holds
        across :meth:`to` and drops graph recordings."""
        if isinstance(names, str):
            raise TypeError("names: expected a collection of tensor names, got the string %r" % (names,))
        chosen = frozenset(names or ())
        unknown = sorted(n for n in chosen if n not in self._index)
        if unknown:
            raise ValueError("names: not tensors of %s: %s" % (self.model_name, ", ".join(map(repr, unknown[:3]))))
        _C.executor_set_frozen(self._exec, self._frozen_flags(chosen) if chosen else None)
        self._frozen = chosen

    def _frozen_flags(self, chosen):
        return [int(name in chosen) for name, *_ in self._entries]

    @property
    def frozen(self) -> list:
        """The names :meth:`set_frozen` froze, in state_dict order."""
        return [name for name, *_ in self._entries if name in self._frozen]

    # ---------------------------------------------------------------------------------- modes
    def train(self, mode: bool = True) -> "Detector":
        self.training = bool(mode)
        _C.executor_configure(self._exec, training=self.training)
        return self

    def eval(self) -> "Detector":
        return self.train(False)

    @contextmanager
    def no_grad(self):
        """Forwards inside keep nothing for a backward, as under ``torch.no_grad()`` (validation and
        prediction run so): each shape gets a forward-only layout whose activations die with their last
        reader, a fraction of the memory. A backward of such a forward raises."""
        was = self._grad
        self._grad = False
        _C.executor_configure(self._exec, grad=False)
        try:
            yield self
        finally:
            self._grad = was
            _C.executor_configure(self._exec, grad=was)

    def to(self, device, dtype: str | None = None) -> "Detector":
        """Moves the network to ``"cpu"`` or ``"cuda[:N]"``. On CUDA, ``dtype`` is the compute precision
        ("float32", "bfloat16" or "float16"; master weights, gradients and BN statistics stay float32).
        Parameters, BN statistics and gradients move along."""
        dev = _parse_device(device)
        if dev == "cpu":
            if self.device != "cpu":
                self._download(grads=True)
                self._attach("cpu", self.dtype)
            return self
        if self.dtype != "float32":
            raise ValueError(f"to: a {self.dtype} network stays on the CPU (float64 is for gradient checks)")
        dt = str(dtype or (self._compute if self.device != "cpu" else "float32"))
        if dt not in _CUDA_DTYPES:
            raise ValueError(f"dtype: expected one of {_CUDA_DTYPES}, got {dt!r}")
        from . import cuda
        if not cuda.is_available():
            raise ValueError(f"device: {dev!r} requested but no CUDA device is available")
        if self.device != "cpu":
            self._download(grads=True)
        self._attach(dev, dt)
        _C.executor_sync(self._exec, "grads", True)
        return self

    @property
    def compute_dtype(self) -> str:
        """The dtype activations are computed in: the network dtype on the CPU, ``to``'s dtype on CUDA."""
        return self._compute

    # ----------------------------------------------------------------------------- state dict
    def state_dict(self) -> "OrderedDict[str, np.ndarray]":
        """name -> NumPy copy, parameters and BN running statistics, in Ultralytics key order."""
        self._download()
        out = OrderedDict()
        for name, is_buf, off, shape, _ in self._entries:
            src = self._host[2] if is_buf else self._host[0]
            n = int(np.prod(shape))
            out[name] = src[off:off + n].reshape(shape).copy()
        return out

    def load_state_dict(self, state, strict: bool = True, *, source: str = "state_dict", verbose: bool = True,
                        names=None):
        """Copies tensors by name (``*.num_batches_tracked`` is accepted and ignored). Every check runs before
        anything is written, so the model is unchanged on error. Returns a :class:`ptl.weights.Transfer`.

        strict: missing or unexpected keys raise KeyError listing them; a value of the wrong shape raises
        ValueError. Not strict (a transfer, e.g. to another class count): every tensor whose name and shape
        match is copied, the others keep the model's values, and ``Transferred a/b items from <source>``
        goes to the ``ptl.weights`` logger at INFO, the list of what was left out at DEBUG (``verbose``,
        :meth:`ptl.weights.Transfer.report`); ValueError when nothing matches.
        ``names``: the class names of ``state``'s class rows; when given, the rows of the final class convs
        are remapped to this model's :attr:`names` as Ultralytics 8.4.190 does (:func:`ptl.weights.remap_rows`);
        not strict, a first conv of another shape takes the source's leading filters (:mod:`ptl.weights`).
        """
        from .weights import plan_transfer
        plan = plan_transfer(self._index, state, source, names=names, target_names=self.names)
        if strict and (plan.missing or plan.unexpected):
            raise KeyError(f"load_state_dict: missing keys {plan.missing} ; unexpected keys {plan.unexpected}")
        if strict and plan.mismatched:
            raise ValueError("load_state_dict: mis-shaped values: " + "; ".join(
                f"{k}: got {a}, expected {b}" for k, a, b in plan.mismatched))
        if not plan.arrays and not plan.parts and self._index:
            raise ValueError(f"load_state_dict: no tensor of {source} matches this {self.model_name} model "
                             f"(name and shape): {_layout_gaps(plan)}")
        self._download()  # keys a non-strict load leaves out keep the device's values
        for k, a in plan.arrays.items():
            self._host_view(k)[...] = a.reshape(self._index[k][2])
        for k, (part, values) in plan.parts.items():  # the rest of the tensor keeps its values
            self._host_view(k)[part] = values
        self._upload()
        if not strict and verbose:
            plan.report()
        return plan

    def _host_view(self, name):
        """The host storage of tensor ``name`` as an array of its shape (writes go to the network)."""
        is_buf, off, shape = self._index[name]
        dst = self._host[2] if is_buf else self._host[0]
        return dst[off:off + int(np.prod(shape))].reshape(shape)

    def load_weights(self, path, strict: bool = False, verbose: bool = True):
        """Loads a weight file into this model (:func:`ptl.weights.read_weights`: Ultralytics ``.pt``, ptl
        ``.safetensors``, training checkpoint): the class rows remapped by name, then by name and shape
        unless ``strict``. The model keeps its layout (build with ``weights=`` or :meth:`load` to follow the
        file's class-branch width). Takes the file's class names when every tensor transferred and this
        model's names are placeholders. Returns the :class:`ptl.weights.Transfer`."""
        from .weights import read_weights
        return self._load_file(read_weights(path), strict=strict, verbose=verbose)

    def _load_file(self, wf, strict, verbose, notes=()):
        from .weights import placeholder_names
        try:
            plan = self.load_state_dict(wf.tensors, strict=strict, source=os.path.basename(wf.path), verbose=False,
                                        names=wf.names)
        except (KeyError, ValueError) as e:
            raise ValueError(f"{wf.path}: does not fit {self.model_name} with {self.num_classes} classes: "
                             f"{e.args[0] if e.args else e}") from None
        plan.notes += list(notes)
        if not strict and verbose:
            plan.report()
        if (wf.names is not None and len(wf.names) == self.num_classes and plan.transferred == plan.total
                and placeholder_names(self.names)):  # as Ultralytics: a complete load names placeholder classes
            self.names = wf.names
        return plan

    # ---------------------------------------------------------------------------- save / load
    def save(self, path) -> None:
        """Writes the state_dict as .safetensors (through ptl.io), with scale, classes, class-branch width and
        names as metadata."""
        from .weights import write_weights
        write_weights(path, self.state_dict(), self.model_name, self.num_classes, self.names, self.cls_width)

    @classmethod
    def load(cls, path, **kw) -> "Detector":
        """A detector from a weight file: ``Detector.save``'s ``.safetensors``, ``<run>/weights/*.safetensors``,
        a training checkpoint (its EMA weights) or an Ultralytics ``.pt`` (no torch needed). Scale, class count,
        class-branch width and names come from the file; ``model=`` / ``num_classes=`` / ``cls_width=``
        override them, and then the file is transferred as the constructor's ``weights=`` does (8.4.190's
        ``load``). ``names=`` are the model's class names (the class rows are remapped to them by name). Other
        keywords go to the constructor."""
        from .weights import plan_transfer, read_weights
        wf = read_weights(path)
        where = os.fspath(path)
        model = kw.pop("model", None) or wf.model_name
        if model is None:
            raise ValueError(f"{where}: the file does not say which model it holds; pass model='yolo26n' etc.")
        nc = kw.pop("num_classes", None) or wf.num_classes
        if nc is None:
            raise ValueError(f"{where}: the file does not say how many classes it has; pass num_classes=")
        names = kw.pop("names", None)
        width = kw.pop("cls_width", None)
        same = (_parse_scale(model, kw.get("scale")) == wf.scale and nc == wf.num_classes
                and width in (None, wf.cls_width))
        if not same:
            return cls(model, num_classes=nc, names=names, weights=wf, cls_width=width, **kw)
        det = cls(model, num_classes=nc, names=names, cls_width=wf.cls_width, **kw)
        plan = plan_transfer(det._index, wf.tensors)
        if not plan.complete:  # the file says it is this model, but its tensors are not
            kind = "an Ultralytics YOLO26 detection model" if wf.kind == "ultralytics" else f"a ptl {wf.kind}"
            raise ValueError(f"{where}: not {kind} of the {det.model_name} layout: " + _layout_gaps(plan))
        det._load_file(wf, strict=True, verbose=False)
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

    def images(self, images):
        """The network input: a tensor (B, H, W, 3) in the compute dtype on the model's device, from a
        device tensor of that shape or any form ``forward`` accepts."""
        if isinstance(images, _C.Tensor) and images.device != "cpu":
            return images.to(device=self.device, dtype=self._compute)
        x = self._images(images)
        if self.device == "cpu":
            return _C.from_numpy(x)
        return _C.tensor(x, device=self.device).to(dtype=self._compute)

    def forward(self, images) -> dict:
        """Raw head outputs: {"one2many": (boxes, scores), "one2one": (boxes, scores)}, boxes (N, A, 4)
        l, t, r, b in grid units, scores (N, A, nc) logits; A = sum over P3, P4, P5 of H_i * W_i.
        images: (N, 3, H, W) floats in [0, 1], (N, H, W, 3) uint8, or (on CUDA) a device tensor (N, H, W, 3)
        in the compute dtype. On the CPU the outputs are NumPy arrays; on CUDA float32 device tensors
        over the network's output buffers, overwritten by the next forward of the shape."""
        out = _C.executor_forward(self._exec, self.images(images))
        if self.device == "cpu":
            out = [t.numpy() for t in out]
        return {"one2many": (out[0], out[1]), "one2one": (out[2], out[3])}

    __call__ = forward

    def backward(self, grads: dict, input_grad: bool = False):
        """Backward of the last forward, which it consumes (as PyTorch frees the graph): the gradients take
        the memory of the activations they outlive, so a second backward needs the forward again.
        grads: {"one2many": (d_boxes, d_scores), "one2one": (...)} with arrays or tensors shaped like the
        outputs (a missing branch or None entry is zero). Parameter gradients accumulate into
        ``flat_gradients``. With input_grad, returns d loss / d images: on the
        CPU a NumPy array in the layout of the forward's input ((N, 3, H, W) for a float input), on CUDA
        an NHWC device tensor."""
        d = []
        master = self.dtype if self.device == "cpu" else "float32"
        for br in _BRANCHES:
            for a in grads.get(br) or (None, None):
                if a is not None and not isinstance(a, _C.Tensor):
                    a = _C.tensor(np.ascontiguousarray(a, dtype=master), device=self.device)
                d.append(a)
        g = _C.executor_backward(self._exec, *d, input_grad=bool(input_grad))
        if g is None or self.device != "cpu":
            return g
        g = g.numpy()
        return np.ascontiguousarray(g.transpose(0, 3, 1, 2)) if self._layout == "nchw" else g

    def _detect(self, images, conf: float = 0.25, max_det: int = 300, iou: float = _metrics.NMS_IOU,
                end2end: bool = False) -> list:
        """Per image of a network-ready batch, eval mode, (k, 6) float32 rows x1, y1, x2, y2 (input pixels),
        score, class, score descending: the one-to-many head with class-aware NMS of each anchor's best
        class (8.4.190's predictor), or with ``end2end`` the one-to-one head's top-k (spec §8.2, no NMS)."""
        x = self.images(images)
        was = self.training
        self.eval()
        try:
            with self.no_grad():
                b0, s0, b1, s1 = _C.executor_forward(self._exec, x)
        finally:
            self.train(was)
        boxes, scores = (b1, s1) if end2end else (b0, s0)
        return _metrics.postprocess(boxes, scores, (x.shape[1], x.shape[2]), max_det=max_det, conf=conf,
                                    end2end=end2end, iou=iou, multi_label=False)

    def predict(self, source, conf: float = 0.25, iou: float = _metrics.NMS_IOU, max_det: int = 300,
                end2end: bool = False, **kw) -> list:
        """Detections as 8.4.190's predictor gives them by default (its ``nms=None``): the one-to-many head,
        each anchor's best class scoring above ``conf``, class-aware NMS at ``iou``, at most ``max_det``
        per image; ``end2end=True`` (its ``nms=False``, what :meth:`export` writes): the one-to-one head's
        top-``max_det`` without NMS. Eval mode. One :class:`ptl.predict.Results` per image: ``boxes``
        (k, 4) xyxy clipped to the image, ``scores`` (k,), ``classes`` (k,) (``res["boxes"]`` also works),
        score descending, plus ``path`` and ``orig_shape``.

        ``source``: a network-ready batch ((N, H, W, 3) uint8 or (N, 3, H, W) float in [0, 1], boxes in its
        pixels), or image files, folders, globs, ``.txt`` lists and (H, W, 3) arrays, letterboxed to
        ``imgsz`` (boxes in each image's pixels). Keywords of :func:`ptl.predict.predict`: ``imgsz``,
        ``batch_size``, ``save`` (annotated images), ``save_txt`` (YOLO labels), ``save_conf``, ``project``,
        ``name`` (files go to ``<project>/runs/<name>/version_N``)."""
        from .predict import predict
        return predict(self, source, conf=conf, iou=iou, max_det=max_det, end2end=end2end, **kw)

    def export(self, path, imgsz=640, batch: int = 1, dynamic: bool = False, half: bool = False,
               max_det: int = 300):
        """Writes this model as an end-to-end ONNX graph, output (N, max_det, 6) = x1, y1, x2, y2, score,
        class: the one-to-one head's top-k, as ``predict(..., end2end=True)`` (:mod:`ptl.export`; needs the
        ``onnx`` package). Returns the path."""
        from .export import export_onnx
        return export_onnx(self, path, imgsz=imgsz, batch=batch, dynamic=dynamic, half=half, max_det=max_det)

    # ------------------------------------------------------------------- executor controls
    @contextmanager
    def using_weights(self, params, buffers):
        """Forwards inside the block read these flat parameters and BN statistics (tensors of the
        model's layout on its device, e.g. an EMA's) instead of the model's own; the same executor, so
        its buffers, plans and any recording stay (a recording is used only on the weights it was made
        with)."""
        _C.executor_use_weights(self._exec, params, buffers)
        try:
            yield self
        finally:
            _C.executor_use_weights(self._exec, None, None)

    def plan(self, shapes, forward_only: bool = False) -> None:
        """Makes the conv plans of these ``(batch, height, width)`` shapes now, so that their first forwards
        find them (CUDA: the missing plans are made concurrently into the device's plan cache and run once
        there, which loads their kernels; the GIL is released meanwhile; the CPU has nothing to plan). A fit
        plans the shapes of its loaders while their caches fill. ``forward_only``: for forwards inside
        :meth:`no_grad` (validation, prediction), whose plans on CUDA hold the forward's direction alone (no
        backward query, warm-up or workspace)."""
        _C.executor_plan(self._exec, [tuple(int(v) for v in s) for s in shapes], bool(forward_only))

    def prepare(self, batch: int, height: int, width: int) -> None:
        """Allocates every buffer and makes every conv plan for this shape (forward does it too)."""
        _C.executor_prepare(self._exec, int(batch), int(height), int(width))

    def set_conv_options(self, deterministic: bool = True, allow_tf32: bool = False, find: bool = False) -> None:
        """CUDA: cuDNN algorithm choice for the conv plans (applies at the next prepare)."""
        _C.executor_configure(self._exec, deterministic=bool(deterministic), allow_tf32=bool(allow_tf32),
                              find=bool(find))

    def info(self) -> dict:
        """The executor's device, dtypes, current shape, memory and recording state."""
        return _C.executor_info(self._exec)

    def record(self, images, grads: dict) -> None:
        """CUDA: captures (without running) one forward of ``images`` and one backward of ``grads`` for
        :meth:`replay`, after an eager forward + backward of the same shape (the warm-up). ``images`` and
        the gradient tensors must be device tensors that stay where they are: replay reads them again;
        the model keeps them alive. A change of conv options retires the recording; it is used only in
        the train/eval mode and on the weights it was made with."""
        if not isinstance(images, _C.Tensor):
            raise TypeError("images: record needs a device tensor (B, H, W, 3) in the compute dtype")
        d = []
        for br in _BRANCHES:
            for a in grads.get(br) or (None, None):
                if a is not None and not isinstance(a, _C.Tensor):
                    raise TypeError("grads: record needs float32 device tensors (or None)")
                d.append(a)
        _C.executor_record(self._exec, images, *d)
        self._recorded = (images, d)

    def replay(self, part: str = "both"):
        """CUDA: runs the recording: the same work as ``forward`` ("forward"), ``backward`` ("backward") or
        both on the recorded tensors. Between a forward and its backward the caller may rewrite the
        recorded gradient tensors (the objective does). Returns the head outputs (None for "backward")."""
        r = _C.executor_replay(self._exec, part)
        return None if r is None else {"one2many": (r[0], r[1]), "one2one": (r[2], r[3])}

    def retire(self) -> None:
        """Drops the recordings (and their memory)."""
        _C.executor_retire(self._exec)
        self._recorded = None

    @property
    def recorded(self) -> bool:
        """Whether the current shape's recording is usable now."""
        return bool(_C.executor_info(self._exec)["recorded"])

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
                f"dtype={self.dtype}, device={self.device!r}, training={self.training})")


def _layout_gaps(plan, show=4):
    """A short account of the tensors that do not fit: counts and the first few names."""
    def few(items):
        return ", ".join(items[:show]) + (", ..." if len(items) > show else "")
    parts = []
    if plan.missing:
        parts.append(f"{len(plan.missing)} tensors missing ({few(plan.missing)})")
    if plan.unexpected:
        parts.append(f"{len(plan.unexpected)} unexpected ({few(plan.unexpected)})")
    if plan.mismatched:
        parts.append(f"{len(plan.mismatched)} of another shape ({few([f'{k} {a}' for k, a, _ in plan.mismatched])})")
    return "; ".join(parts)

