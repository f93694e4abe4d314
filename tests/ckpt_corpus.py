"""Damaged and foreign checkpoints made from one good training checkpoint, for the resume tests.

``write_case(good_bytes, case, path)`` writes one case of ``CASES`` and returns ``(pattern, tensor)``:
``pattern`` is a regular expression the CheckpointError must match and ``tensor`` the tensor name it
must mention (None when the problem is not one tensor's). The header cases patch the JSON header and
keep the data bytes, as a bit flip or a hand edit would. Run as a script to keep the files:
``python tests/ckpt_corpus.py runs/train/version_0/checkpoints/last.ckpt /tmp/corpus``.
"""
import json
import os
import struct
import sys

import numpy as np

FIRST = "model.model.0.conv.weight"  # the first convolution, (16, 3, 3, 3) float32 in yolo26n
EMA_FIRST = "ema.model.0.conv.weight"


def split(raw):
    (n,) = struct.unpack("<Q", raw[:8])
    return json.loads(raw[8:8 + n]), raw[8 + n:]


def join(header, data):
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    return struct.pack("<Q", len(text)) + text + data


def patch_header(raw, edit):
    header, data = split(raw)
    edit(header)
    return join(header, data)


def patch_trainer(raw, edit):
    """Edits the JSON trainer state inside the metadata."""
    def go(header):
        state = json.loads(header["__metadata__"]["ptl.trainer"])
        edit(state)
        header["__metadata__"]["ptl.trainer"] = json.dumps(state)
    return patch_header(raw, go)


def drop_tensor(raw, name):
    """Removes one tensor (its bytes and its header entry), keeping the file otherwise valid."""
    header, data = split(raw)
    begin, end = header.pop(name)["data_offsets"]
    for k, v in header.items():
        if k != "__metadata__" and v["data_offsets"][0] >= end:
            v["data_offsets"] = [v["data_offsets"][0] - (end - begin), v["data_offsets"][1] - (end - begin)]
    return join(header, data[:begin] + data[end:])


def add_tensor(raw, name, array):
    header, data = split(raw)
    b = np.ascontiguousarray(array, np.float32).tobytes()
    header[name] = {"dtype": "F32", "shape": list(array.shape), "data_offsets": [len(data), len(data) + len(b)]}
    return join(header, data + b)


def invalid_utf8(raw):
    """One byte of a tensor name in the header becomes 0xFF (not UTF-8)."""
    (n,) = struct.unpack("<Q", raw[:8])
    at = raw.index(b'"' + FIRST.encode() + b'"', 8, 8 + n) + 1
    return raw[:at] + b"\xff" + raw[at + 1:]


def foreign(path):
    """Some other program's safetensors file (written by the reference package when it is installed)."""
    tensors = {"embeddings.weight": np.ones((4, 8), np.float32), "lm_head.bias": np.zeros(4, np.float32)}
    try:
        from safetensors.numpy import save_file
    except ImportError:
        from ptl.io import save_safetensors as save_file
    save_file(tensors, path, metadata={"format": "np"})


def other_scale(raw):
    """The model tensors of a yolo26s in a yolo26n checkpoint whose hparams do not say so."""
    def write(path):
        import ptl
        with open(path + ".src", "wb") as f:
            f.write(raw)
        tensors, meta = ptl.io.load_safetensors(path + ".src")
        os.remove(path + ".src")
        tensors = {k: v for k, v in tensors.items() if not k.startswith("model.")}
        tensors.update({"model." + k: v for k, v in ptl.Detector("yolo26s").state_dict().items()})
        state = json.loads(meta["ptl.trainer"])
        state["hparams"].pop("model")
        ptl.io.save_safetensors(path, tensors, {"ptl.trainer": json.dumps(state)})
    return write


def _bytes(make):
    def write(path):
        with open(path, "wb") as f:
            f.write(make())
    return write


def cases(raw):
    """case -> (writer(path), pattern, tensor name or None); the bytes are made only when written."""
    def trainer(edit):
        return _bytes(lambda: patch_trainer(raw, edit))

    def header(edit):
        return _bytes(lambda: patch_header(raw, edit))

    def set_model(key, value):
        return trainer(lambda s: s["hparams"]["model"].__setitem__(key, value))

    def transpose_losses(h):
        rows, cols = h["trainer.losses"]["shape"]
        h["trainer.losses"]["shape"] = [cols, rows]

    return {
        "truncated data": (_bytes(lambda: raw[:-1000]), "truncated", None),
        "truncated header": (_bytes(lambda: raw[:200]), "runs past the end", None),
        "empty": (_bytes(lambda: b""), "shorter than the 8-byte header length", None),
        "dtype relabelled F32 -> I32": (header(lambda h: h[FIRST].update(dtype="I32")),
                                         "has dtype I32, expected F32", FIRST),
        "EMA dtype relabelled F32 -> U32": (header(lambda h: h[EMA_FIRST].update(dtype="U32")),
                                             "has dtype U32, expected F32", EMA_FIRST),
        "step counter relabelled I64 -> F64": (header(lambda h: h["schedule.last_opt_step"].update(dtype="F64")),
                                                "has dtype F64, expected I64", "schedule.last_opt_step"),
        "shape permuted": (header(lambda h: h[FIRST].update(shape=[3, 16, 3, 3])),
                           r"has shape \(3, 16, 3, 3\), expected \(16, 3, 3, 3\)", FIRST),
        "grads missing": (_bytes(lambda: drop_tensor(raw, "trainer.grads")), "is missing", "trainer.grads"),
        "optimizer scalars missing": (_bytes(lambda: drop_tensor(raw, "optim.scalars")), "is missing",
                                      "optim.scalars"),
        "ema tensor missing": (_bytes(lambda: drop_tensor(raw, EMA_FIRST)), "is missing", EMA_FIRST),
        "model tensor missing": (_bytes(lambda: drop_tensor(raw, FIRST)), "is missing", FIRST),
        "unexpected tensor": (_bytes(lambda: add_tensor(raw, "model.99.extra", np.ones(3))), "is not expected",
                              "model.99.extra"),
        "loss history malformed": (header(transpose_losses), "has shape", "trainer.losses"),
        "invalid UTF-8 header": (_bytes(lambda: invalid_utf8(raw)), "not UTF-8", None),
        "foreign safetensors file": (foreign, "not a ptl training checkpoint.*embeddings.weight", None),
        "no trainer state": (header(lambda h: h["__metadata__"].pop("ptl.trainer")), "not a ptl training checkpoint",
                             None),
        "trainer state not JSON": (header(lambda h: h["__metadata__"].update({"ptl.trainer": "{\"ep"})), "not JSON",
                                   None),
        "negative epoch": (trainer(lambda s: s.update(epoch=-1)), "epoch must be an int >= 0", None),
        "rng missing": (trainer(lambda s: s.pop("rng")), "rng must be", None),
        "callback state not an object": (trainer(lambda s: s.update(callbacks={"ModelCheckpoint": [1]})),
                                         "callback state", None),
        "checkpointer state refused": (trainer(lambda s: s["callbacks"]["ModelCheckpoint"].update(best_k_models=[1])),
                                       "the ModelCheckpoint state does not load", None),
        "other version": (trainer(lambda s: s.update(version=7)), "version 7", None),
        "wrong scale (hparams)": (set_model("model", "yolo26s"), "holds a yolo26s with 80 classes", None),
        "wrong class count (hparams)": (set_model("num_classes", 3), "holds a yolo26n with 3 classes", None),
        "wrong scale (shapes)": (other_scale(raw), r"does not hold a yolo26n.*has shape \(32, 3, 3, 3\)", FIRST),
    }


def write_case(raw, case, path):
    """Writes one case made from the good checkpoint's bytes; returns (pattern, tensor)."""
    write, pattern, tensor = cases(raw)[case]
    write(path)
    return pattern, tensor


CASES = tuple(cases(b""))


if __name__ == "__main__":
    with open(sys.argv[1], "rb") as f:
        good = f.read()
    os.makedirs(sys.argv[2], exist_ok=True)
    for i, case in enumerate(CASES):
        path = os.path.join(sys.argv[2], "case%02d.ckpt" % i)
        write_case(good, case, path)
        print("%-32s %s" % (case, path))
