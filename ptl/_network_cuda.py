"""The YOLO26 network on a CUDA device: the network executor (csrc/nn/executor.h) on the CUDA backend,
in float32, bfloat16 or float16 compute.

Parameters, gradients and BatchNorm running statistics stay float32 in the CPU network's flat layout
(``params``, ``grads``, ``buffers``: 1-D ptl.Tensors on the device, aliasing the network's memory, so
an optimizer can update them in place). Every forward casts the weights to the compute dtype; head
outputs and their gradients are float32 device tensors.

``CudaNetwork(detector, device="cuda", dtype="bfloat16")`` uploads the detector's parameters and
statistics; ``to_cpu()`` copies them (and the gradients) back into the detector's flat buffers.
"""
from __future__ import annotations

import numpy as np

from . import _C

__all__ = ["CudaNetwork", "parse_cuda_device"]

_BRANCHES = ("one2many", "one2one")
_DTYPES = ("float32", "bfloat16", "float16")


def parse_cuda_device(device) -> int:
    """'cuda' / 'cuda:N' / N -> N."""
    if isinstance(device, (int, np.integer)) and not isinstance(device, bool):
        idx = int(device)
    else:
        s = str(device)
        if s == "cuda":
            idx = 0
        elif s.startswith("cuda:") and s[5:].isdigit():
            idx = int(s[5:])
        else:
            raise ValueError(f"device: expected 'cuda' or 'cuda:N', got {device!r}")
    if idx < 0:
        raise ValueError(f"device: negative CUDA index {idx}")
    return idx


class CudaNetwork:
    """CUDA executor of a ``ptl.Detector``'s network (same structure, same function).

    ``forward(images)`` takes a ptl.Tensor (B, H, W, 3) on the device in the compute dtype (the
    training path, no host work), or the NumPy forms ``Detector.forward`` accepts (converted and
    uploaded). It returns ``{"one2many": (boxes, scores), "one2one": (boxes, scores)}`` as float32
    device tensors over the network's output buffers: the next forward of that shape overwrites them,
    and a third shape evicting theirs frees them (the executor keeps two shapes; copy what must be kept). ``backward(grads)`` takes the same structure of
    float32 device tensors (None = zero) and adds the parameter gradients into ``grads``.
    """

    def __init__(self, detector, device="cuda", dtype: str = "float32"):
        dtype = str(dtype)
        if dtype not in _DTYPES:
            raise ValueError(f"dtype: expected one of {_DTYPES}, got {dtype!r}")
        self.detector = detector
        self.index = parse_cuda_device(device)
        self.device = f"cuda:{self.index}"
        self.dtype = dtype
        self._h = _C.executor_create(detector._net, self.device, dtype)
        self.params, self.grads, self.buffers = _C.executor_tensors(self._h)
        self.train(bool(getattr(detector, "training", True)))

    # ------------------------------------------------------------------------------ state
    def train(self, mode: bool = True) -> "CudaNetwork":
        self.training = bool(mode)
        _C.executor_set_training(self._h, self.training)
        return self

    def eval(self) -> "CudaNetwork":
        return self.train(False)

    def zero_grad(self) -> None:
        _C.executor_zero_grad(self._h)

    def from_cpu(self, grads: bool = False) -> None:
        """Uploads the detector's flat parameters and BN statistics (and gradients if asked)."""
        _C.executor_sync(self._h, "params", True)
        _C.executor_sync(self._h, "buffers", True)
        if grads:
            _C.executor_sync(self._h, "grads", True)

    def to_cpu(self, grads: bool = True) -> None:
        """Copies parameters, BN statistics (and gradients) back into the detector's flat buffers."""
        _C.executor_sync(self._h, "params", False)
        _C.executor_sync(self._h, "buffers", False)
        if grads:
            _C.executor_sync(self._h, "grads", False)

    def set_conv_options(self, deterministic: bool = True, allow_tf32: bool = False, find: bool = False) -> None:
        """cuDNN algorithm choice for the conv plans (applies at the next prepare)."""
        _C.executor_set_conv_options(self._h, deterministic=bool(deterministic), allow_tf32=bool(allow_tf32),
                                         find=bool(find))

    def prepare(self, batch: int, height: int, width: int) -> None:
        """Allocates every buffer and makes every conv plan for this shape (forward does it too)."""
        _C.executor_prepare(self._h, int(batch), int(height), int(width))

    def info(self) -> dict:
        return _C.executor_info(self._h)

    # ---------------------------------------------------------------------------- compute
    def images(self, images):
        """A device tensor (B, H, W, 3) in the compute dtype from any accepted image form."""
        if isinstance(images, _C.Tensor):
            t = images
        else:
            nhwc = self.detector._images(images)  # NHWC float in [0, 1], the detector's dtype
            t = _C.tensor(np.ascontiguousarray(nhwc, dtype=np.float32), device=self.device)
        return t.to(device=self.device, dtype=self.dtype)

    def forward(self, images) -> dict:
        b0, s0, b1, s1 = _C.executor_forward(self._h, self.images(images))
        return {"one2many": (b0, s0), "one2one": (b1, s1)}

    __call__ = forward

    def backward(self, grads: dict, input_grad: bool = False):
        d = []
        for br in _BRANCHES:
            pair = grads.get(br) or (None, None)
            for a in pair:
                if a is not None and not isinstance(a, _C.Tensor):
                    a = _C.tensor(np.ascontiguousarray(a, dtype=np.float32), device=self.device)
                d.append(a)
        return _C.executor_backward(self._h, *d, input_grad=bool(input_grad))

    # ------------------------------------------------------------------------ graph replay
    def record(self, images, grads: dict) -> None:
        """Captures (without running) one forward of ``images`` and one backward of ``grads`` for
        :meth:`replay`, after an eager forward + backward of the same shape (the warm-up). ``images`` and
        the gradient tensors must be device tensors that stay where they are: replay reads them again;
        this object keeps them alive. A change of shape, train/eval mode or conv options retires the
        recording."""
        if not isinstance(images, _C.Tensor):
            raise TypeError("images: record needs a device tensor (B, H, W, 3) in the compute dtype")
        d = []
        for br in _BRANCHES:
            for a in grads.get(br) or (None, None):
                if a is not None and not isinstance(a, _C.Tensor):
                    raise TypeError("grads: record needs float32 device tensors (or None)")
                d.append(a)
        _C.executor_record(self._h, images, *d)
        self._recorded = (images, d)

    def replay(self, part: str = "both"):
        """Runs the recording: the same work as ``forward`` ("forward"), ``backward`` ("backward") or both
        on the recorded tensors. Between a forward and its backward the caller may rewrite the recorded
        gradient tensors (the objective does). Returns the head outputs (None for "backward")."""
        r = _C.executor_replay(self._h, part)
        return None if r is None else {"one2many": (r[0], r[1]), "one2one": (r[2], r[3])}

    def retire(self) -> None:
        _C.executor_retire(self._h)
        self._recorded = None

    @property
    def recorded(self) -> bool:
        return bool(_C.executor_info(self._h)["recorded"])
