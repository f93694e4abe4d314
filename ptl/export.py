"""ONNX export of a :class:`ptl.Detector`, end to end: ``images (N, 3, H, W)`` float in [0, 1] (RGB) ->
``output0 (N, max_det, 6)`` = x1, y1, x2, y2 (input pixels), score, class, as Ultralytics' end-to-end
YOLO26 export gives.

The graph is built with the ``onnx`` package's helper API from the network's own op list
(``ptl._C.network_ops``: the ops the C executor runs, in order), so it is the network ptl trains:

- every conv + BatchNorm (running statistics, the network's eps) becomes one Conv with the
  BatchNorm folded into its weights and bias (computed in float64, stored in float32), SiLU as
  ``x * Sigmoid(x)``; the Detect outputs are plain Convs with bias;
- only the one-to-one head is kept: the graph is end-to-end (8.4.190's ``nms=False`` export), the
  detections of ``Detector.predict(..., end2end=True)``; the default predict (8.4.190's predictor:
  the one-to-many head with NMS) is not what the graph computes;
- post-processing is ptl's (``csrc/metrics/postprocess.h``, spec §8.2), in the graph: the ``k =
  min(max_det, A)`` anchors with the largest class logit, then the k largest logits of those
  anchors' class rows, ranked on logits (sigmoid is monotone) with ties to the lower index (ONNX
  TopK's rule and ptl's); boxes decoded as ``(anchor -/+ distance) * stride``, score = sigmoid.
  Unlike ``Detector.predict`` no ``conf`` threshold is applied and boxes are not clipped: all k rows
  come out, as from Ultralytics' export.

Needs the optional ``onnx`` package (``pip install ptl[export]``; ``onnxruntime`` to run the result).

Command line: ``python -m ptl.export --model best.safetensors --imgsz 640 [--batch 1] [--dynamic]
[--half] [--output model.onnx]``.
"""
import argparse
import json
import os
import sys

import numpy as np

__all__ = ["export_onnx", "build_onnx", "OPSET"]

OPSET = 17


def _onnx():
    try:
        import onnx
        from onnx import helper, numpy_helper
    except ImportError:
        raise ImportError("ONNX export needs the onnx package: pip install 'ptl[export]' (or pip install onnx)") \
            from None
    return onnx, helper, numpy_helper


def _imgsz(imgsz):
    h, w = (imgsz, imgsz) if isinstance(imgsz, (int, np.integer)) else tuple(imgsz)
    if not all(isinstance(v, (int, np.integer)) and v >= 32 and v % 32 == 0 for v in (h, w)):
        raise ValueError("imgsz: expected an int or (height, width), positive multiples of 32, got %r" % (imgsz,))
    return int(h), int(w)


class _Builder:
    """Collects nodes and initializers; every value gets a fresh name."""

    def __init__(self, helper, numpy_helper, float_type):
        self.helper, self.numpy_helper = helper, numpy_helper
        self.float_type = float_type  # np.float32 or np.float16
        self.nodes, self.inits, self.n = [], [], 0

    def name(self, hint):
        self.n += 1
        return "%s_%d" % (hint, self.n)

    def const(self, hint, array):
        name = self.name(hint)
        self.inits.append(self.numpy_helper.from_array(np.ascontiguousarray(array), name))
        return name

    def floats(self, hint, array):
        return self.const(hint, np.asarray(array, dtype=np.float64).astype(self.float_type))

    def ints(self, hint, values):
        return self.const(hint, np.asarray(values, dtype=np.int64))

    def op(self, op_type, inputs, hint=None, outputs=1, name=None, **attrs):
        """Adds a node; returns its output name(s): ``name`` exactly, else fresh ones from ``hint``."""
        outs = [name] if name else [self.name(hint or op_type.lower()) for _ in range(outputs)]
        self.nodes.append(self.helper.make_node(op_type, list(inputs), outs, name=outs[0], **attrs))
        return outs[0] if outputs == 1 else outs


def _folded_conv(op, params, buffers, eps):
    """Weights and bias of a conv with its BatchNorm folded in (float64)."""
    k, cin_g = op["k"], op["cin"] // op["groups"]
    w = params[op["w_off"]:op["w_off"] + op["cout"] * cin_g * k * k].astype(np.float64).reshape(op["cout"], cin_g, k, k)
    if op["kind"] == "conv_bias":
        return w, params[op["bias_off"]:op["bias_off"] + op["cout"]].astype(np.float64)
    c = op["cout"]
    gamma = params[op["gamma_off"]:op["gamma_off"] + c].astype(np.float64)
    beta = params[op["beta_off"]:op["beta_off"] + c].astype(np.float64)
    mean = buffers[op["rmean_off"]:op["rmean_off"] + c].astype(np.float64)
    var = buffers[op["rvar_off"]:op["rvar_off"] + c].astype(np.float64)
    scale = gamma / np.sqrt(var + eps)
    return w * scale[:, None, None, None], beta - mean * scale


def _live_ops(desc):
    """The ops the one-to-one head's outputs depend on (the one-to-many head is left out)."""
    ops = desc["ops"]
    need, live = set(), [False] * len(ops)
    for i in range(len(ops) - 1, -1, -1):
        op = ops[i]
        if op["kind"] == "head":
            if op["branch"] != 1:
                continue
        elif op["out"] not in need and op.get("out2", -1) not in need:
            continue
        live[i] = True
        if op["kind"] == "cat":
            need.update(p[0] for p in op["parts"])
        else:
            need.add(op["in"])
            if op["kind"] == "add":
                need.add(op["in2"])
    return [op for op, keep in zip(ops, live) if keep]


def build_onnx(model, imgsz=640, batch=1, dynamic=False, half=False, max_det=300, raw_outputs=False):
    """The ONNX ModelProto of ``model`` (see the module doc). ``raw_outputs`` also outputs the one-to-one
    head's raw ``boxes`` (N, A, 4) (l, t, r, b in grid units) and ``scores`` (N, A, nc) (logits), as
    ``Detector.forward`` gives them."""
    from . import _C
    onnx, helper, numpy_helper = _onnx()
    H, W = _imgsz(imgsz)
    if not isinstance(batch, (int, np.integer)) or batch < 1:
        raise ValueError("batch: expected an int >= 1, got %r" % (batch,))
    desc = _C.network_ops(model._net)
    A = sum((H // s) * (W // s) for s in desc["strides"])
    if not isinstance(max_det, (int, np.integer)) or not 1 <= max_det:
        raise ValueError("max_det: expected an int >= 1, got %r" % (max_det,))
    k, nc = min(int(max_det), A), desc["num_classes"]
    sd = model.state_dict()  # also brings the weights back from a GPU
    params = np.concatenate([sd[n].reshape(-1) for n, _, _ in model.parameter_table()])
    buffers = np.concatenate([sd[n].reshape(-1) for n, _, _ in model.buffer_table()])
    ftype = np.float16 if half else np.float32
    elem = onnx.TensorProto.FLOAT16 if half else onnx.TensorProto.FLOAT
    g = _Builder(helper, numpy_helper, ftype)
    N = "batch" if dynamic else int(batch)

    names = {desc["input"]: "images"}
    heads = {0: {}, 1: {}}  # box flag -> level -> (N, C, h*w) value
    for op in _live_ops(desc):
        kind = op["kind"]
        x = names.get(op["in"])
        if kind in ("conv", "conv_bias"):
            w, b = _folded_conv(op, params, buffers, desc["bn_eps"])
            p = op["k"] // 2
            y = g.op("Conv", [x, g.floats("w", w), g.floats("b", b)], "conv", kernel_shape=[op["k"]] * 2,
                     strides=[op["stride"]] * 2, pads=[p] * 4, group=op["groups"])
            if kind == "conv" and op["silu"]:
                y = g.op("Mul", [y, g.op("Sigmoid", [y])], "silu")
        elif kind == "add":
            y = g.op("Add", [x, names[op["in2"]]])
        elif kind == "cat":
            pieces = []
            for value, c0, count in op["parts"]:
                src = names[value]
                if c0 != 0 or count != desc["values"][value][0]:
                    src = g.op("Slice", [src, g.ints("start", [c0]), g.ints("end", [c0 + count]), g.ints("axis", [1])])
                pieces.append(src)
            y = pieces[0] if len(pieces) == 1 else g.op("Concat", pieces, axis=1)
        elif kind == "maxpool5":
            y = g.op("MaxPool", [x], kernel_shape=[5, 5], strides=[1, 1], pads=[2, 2, 2, 2])
        elif kind == "upsample2x":
            y = g.op("Resize", [x, "", g.const("scales", np.asarray([1, 1, 2, 2], np.float32))], "up", mode="nearest",
                     coordinate_transformation_mode="asymmetric", nearest_mode="floor")  # out[i] = in[i // 2]
        elif kind == "attention":
            y, v = _attention(g, x, op, desc["values"][op["in"]], H, W)
            names[op["out2"]] = v
        elif kind == "head":
            C, down = desc["values"][op["in"]]
            heads[op["box"]][op["level"]] = g.op("Reshape", [x, g.ints("shape", [0, C, (H // down) * (W // down)])])
            continue
        names[op["out"]] = y

    def head_output(box):
        cat = g.op("Concat", [heads[box][lvl] for lvl in range(3)], axis=2)
        return g.op("Transpose", [cat], name="boxes" if box else "scores", perm=[0, 2, 1])

    boxes, scores = head_output(1), head_output(0)  # (N, A, 4), (N, A, nc)
    detections = _end_to_end(g, model, boxes, scores, H, W, k, nc)

    outputs = [helper.make_tensor_value_info(detections, elem, [N, k, 6])]
    if raw_outputs:
        outputs += [helper.make_tensor_value_info(boxes, elem, [N, A, 4]),
                    helper.make_tensor_value_info(scores, elem, [N, A, nc])]
    graph = helper.make_graph(g.nodes, model.model_name, [helper.make_tensor_value_info("images", elem, [N, 3, H, W])],
                              outputs, g.inits)
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)], producer_name="ptl")
    m.ir_version = 8  # the IR of opset 17, which onnxruntime releases of the last years read
    meta = {"model": model.model_name, "task": "detect", "stride": str(max(desc["strides"])), "batch": str(batch),
            "imgsz": str([H, W]), "names": str(dict(enumerate(model.names))), "names_json": json.dumps(model.names),
            "end2end": "True", "max_det": str(k), "half": str(bool(half)), "dynamic": str(bool(dynamic))}
    helper.set_model_props(m, meta)
    return m


def _attention(g, qkv, op, value, H, W):
    """ptl's attention core (csrc/nn/attention.h) on a (N, heads*(2kd+hd), h, w) qkv map: returns the
    attention output and the dense v, both (N, heads*hd, h, w), head-major channels."""
    heads, kd, hd = op["heads"], op["kd"], op["hd"]
    down = value[1]
    h, w = H // down, W // down
    t = g.op("Reshape", [qkv, g.ints("shape", [0, heads, 2 * kd + hd, h * w])])
    q, kk, v = g.op("Split", [t, g.ints("split", [kd, kd, hd])], "qkv", outputs=3, axis=2)
    logits = g.op("MatMul", [g.op("Transpose", [q], perm=[0, 1, 3, 2]), kk])  # (N, heads, n, n): q_i . k_j
    scale = g.const("scale", np.asarray(1.0 / np.sqrt(kd), np.float32).astype(g.float_type))
    p = g.op("Softmax", [g.op("Mul", [logits, scale])], axis=-1)
    o = g.op("MatMul", [v, g.op("Transpose", [p], perm=[0, 1, 3, 2])])  # (N, heads, hd, n)
    shape = g.ints("shape", [0, heads * hd, h, w])
    return g.op("Reshape", [o, shape], "attn"), g.op("Reshape", [v, shape], "v")


def _end_to_end(g, model, boxes, scores, H, W, k, nc):
    """spec §8.2 / csrc/metrics/postprocess.h in ONNX ops: (N, k, 6) = x1, y1, x2, y2, score, class."""
    anchors, strides = model.anchors(H, W)  # (A, 2) grid units, (A,)
    best = g.op("ReduceMax", [scores], axes=[2], keepdims=0)  # (N, A)
    kk = g.ints("k", [k])
    _, top = g.op("TopK", [best, kk], "anchors", outputs=2, axis=1, largest=1, sorted=1)  # (N, k)
    rows = g.op("GatherElements", [scores, g.op("Expand", [g.op("Unsqueeze", [top, g.ints("axis", [2])]),
                                                           g.ints("shape", [1, 1, nc])])], axis=1)  # (N, k, nc)
    flat = g.op("Reshape", [rows, g.ints("shape", [0, k * nc])])
    logit, pick = g.op("TopK", [flat, kk], "picks", outputs=2, axis=1, largest=1, sorted=1)  # (N, k)
    ncs = g.ints("nc", nc)
    slot, cls = g.op("Div", [pick, ncs]), g.op("Mod", [pick, ncs])
    anchor = g.op("GatherElements", [top, slot], axis=1)  # (N, k) anchor index of each pick
    ltrb = g.op("GatherElements", [boxes, g.op("Expand", [g.op("Unsqueeze", [anchor, g.ints("axis", [2])]),
                                                         g.ints("shape", [1, 1, 4])])], axis=1)  # (N, k, 4)
    centre = g.op("Gather", [g.floats("anchor_points", anchors), anchor], axis=0)  # (N, k, 2)
    stride = g.op("Gather", [g.floats("anchor_strides", strides[:, None]), anchor], axis=0)  # (N, k, 1)
    lt, rb = g.op("Split", [ltrb, g.ints("split", [2, 2])], "ltrb", outputs=2, axis=2)
    x1y1 = g.op("Mul", [g.op("Sub", [centre, lt]), stride])
    x2y2 = g.op("Mul", [g.op("Add", [centre, rb]), stride])
    score = g.op("Unsqueeze", [g.op("Sigmoid", [logit]), g.ints("axis", [2])])
    label = g.op("Unsqueeze", [g.op("Cast", [cls], to=_elem_of(g)), g.ints("axis", [2])])
    return g.op("Concat", [x1y1, x2y2, score, label], name="output0", axis=2)


def _elem_of(g):
    onnx, _, _ = _onnx()
    return onnx.TensorProto.FLOAT16 if g.float_type is np.float16 else onnx.TensorProto.FLOAT


def export_onnx(model, path, imgsz=640, batch=1, dynamic=False, half=False, max_det=300):
    """Writes ``model`` as ONNX to ``path`` (atomically) after ``onnx.checker``; returns the path.
    ``dynamic``: the batch dimension is left free (``batch`` is then only recorded); ``half``: float16
    weights, input and output (for GPU runtimes)."""
    onnx, _, _ = _onnx()
    m = build_onnx(model, imgsz=imgsz, batch=batch, dynamic=dynamic, half=half, max_det=max_det)
    onnx.checker.check_model(m, full_check=True)
    path = os.fspath(path)
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    tmp = "%s.tmp.%d" % (path, os.getpid())
    try:
        with open(tmp, "wb") as f:
            f.write(m.SerializeToString())
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)
    return path


def build_parser():
    p = argparse.ArgumentParser(prog="python -m ptl.export",
                                description="Export a YOLO26 detector to ONNX (end to end: (N, max_det, 6)).")
    p.add_argument("--model", required=True,
                   help="weights: a ptl .safetensors (e.g. runs/train/version_0/weights/best.safetensors), a training "
                        ".ckpt, or an Ultralytics .pt")
    p.add_argument("--imgsz", type=int, nargs="+", default=[640], help="input size: one value or height width (640)")
    p.add_argument("--batch", type=int, default=1, help="batch size of the graph (1)")
    p.add_argument("--dynamic", action="store_true", help="leave the batch dimension free")
    p.add_argument("--half", action="store_true", help="float16 weights, input and output")
    p.add_argument("--max-det", type=int, default=300, help="detections per image (300)")
    p.add_argument("--output", default=None, help="the .onnx file (default: the weights' path with .onnx)")
    return p


def main(argv=None):
    args = build_parser().parse_args(argv)
    from .model import Detector
    if len(args.imgsz) not in (1, 2):
        print("ptl.export: error: --imgsz takes one value or height width", file=sys.stderr)
        return 2
    imgsz = args.imgsz[0] if len(args.imgsz) == 1 else tuple(args.imgsz)
    out = args.output or os.path.splitext(args.model)[0] + ".onnx"
    try:
        model = Detector.load(args.model)
        export_onnx(model, out, imgsz=imgsz, batch=args.batch, dynamic=args.dynamic, half=args.half,
                    max_det=args.max_det)
    except (ValueError, TypeError, KeyError, OSError, ImportError) as exc:
        print("ptl.export: error: %s" % exc, file=sys.stderr)
        return 2
    print("ptl.export: wrote %s" % out, file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
