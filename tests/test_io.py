"""ptl.io: the C safetensors writer/reader against the `safetensors` package, corrupt files, atomicity."""
import json
import os
import signal
import struct
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest

import ptl
from ptl.io import bf16_to_float32, float32_to_bf16, load_safetensors, save_safetensors

DTYPES = {
    "F64": np.float64, "F32": np.float32, "F16": np.float16, "I64": np.int64, "I32": np.int32,
    "I16": np.int16, "I8": np.int8, "U64": np.uint64, "U32": np.uint32, "U16": np.uint16, "U8": np.uint8,
    "BOOL": np.bool_,
}
SHAPES = [(), (0,), (3,), (2, 0, 4), (2, 3, 5), (1, 1, 1, 1, 1, 1, 1, 2)]


def sample(dtype, shape, rng):
    x = rng.standard_normal(shape) * 1000
    if dtype == np.bool_:
        return x > 0
    if np.issubdtype(dtype, np.integer):
        info = np.iinfo(dtype)
        return rng.integers(info.min, info.max, size=shape, dtype=dtype, endpoint=True)
    return x.astype(dtype)


def reference_load(path):
    """Every tensor of `path` as (dtype name, shape, raw bytes), read by the safetensors package."""
    safetensors = pytest.importorskip("safetensors")
    with open(path, "rb") as f:
        return {name: (v["dtype"], list(v["shape"]), bytes(v["data"]))
                for name, v in safetensors.deserialize(f.read())}


def reference_metadata(path):
    safetensors = pytest.importorskip("safetensors")
    with safetensors.safe_open(str(path), framework="numpy") as f:
        return f.metadata()


@pytest.mark.parametrize("st", sorted(DTYPES))
def test_round_trip_every_dtype(tmp_path, st):
    rng = np.random.default_rng(len(st))
    tensors = {"t%d" % i: sample(DTYPES[st], shape, rng) for i, shape in enumerate(SHAPES)}
    path = tmp_path / "x.safetensors"
    save_safetensors(path, tensors)
    back, meta = load_safetensors(path)
    assert meta == {}
    assert set(back) == set(tensors)
    for name, x in tensors.items():
        assert back[name].dtype == x.dtype and back[name].shape == x.shape
        np.testing.assert_array_equal(back[name], x)
    ref = reference_load(path)
    for name, x in tensors.items():
        assert ref[name] == (st, list(x.shape), x.tobytes()), name
    load_file = pytest.importorskip("safetensors.numpy").load_file
    for name, y in load_file(str(path)).items():
        np.testing.assert_array_equal(y, tensors[name])


def test_bf16_pairs_and_tensors(tmp_path):
    rng = np.random.default_rng(0)
    bits = float32_to_bf16(rng.standard_normal((4, 5)).astype(np.float32))
    t = ptl.tensor(bf16_to_float32(bits)).to(dtype="bfloat16")
    path = tmp_path / "bf16.safetensors"
    save_safetensors(path, {"pair": (bits, "BF16"), "tensor": t, "f32": ptl.tensor(np.ones(3, np.float32))})
    back, _ = load_safetensors(path)
    arr, st = back["pair"]
    assert st == "BF16" and arr.dtype == np.uint16
    np.testing.assert_array_equal(arr, bits)
    np.testing.assert_array_equal(back["tensor"][0], bits)
    np.testing.assert_array_equal(back["f32"], np.ones(3, np.float32))
    ref = reference_load(path)
    assert ref["pair"] == ("BF16", [4, 5], bits.tobytes())
    assert ref["tensor"] == ("BF16", [4, 5], bits.tobytes())


def test_bf16_conversions():
    x = np.array([1.0, -2.5, 3.14159, 1e-40, np.inf, -np.inf, 65504.0, 1.00390625, 1.01171875], np.float32)
    bits = float32_to_bf16(x)
    y = bf16_to_float32(bits)
    # round to nearest even: 1 + 2^-8 is a tie between 1 and 1 + 2^-7 and goes to 1
    np.testing.assert_array_equal(y[[0, 1, 4, 5, 7]], [1.0, -2.5, np.inf, -np.inf, 1.0])
    np.testing.assert_array_equal(y[8], np.float32(1.015625))
    normal = np.isfinite(x) & (np.abs(x) >= np.finfo(np.float32).tiny)
    assert np.all(np.abs(y[normal] - x[normal]) <= np.abs(x[normal]) * 2.0 ** -8)
    assert np.isnan(bf16_to_float32(float32_to_bf16(np.array([np.nan], np.float32))))[0]


def test_reads_reference_files(tmp_path):
    save_file = pytest.importorskip("safetensors.numpy").save_file
    rng = np.random.default_rng(1)
    tensors = {"b.w": rng.standard_normal((3, 4)).astype(np.float32), "a": np.arange(7, dtype=np.int64),
               "c": np.array(True), "z": np.zeros((0, 2), np.float16)}
    path = tmp_path / "ref.safetensors"
    save_file(tensors, str(path), metadata={"epoch": "3", "json": '{"a": [1, 2]}'})
    back, meta = load_safetensors(path)
    assert meta == {"epoch": "3", "json": '{"a": [1, 2]}'}
    for k, v in tensors.items():
        assert back[k].dtype == v.dtype
        np.testing.assert_array_equal(back[k], v)


def test_reads_reference_bf16(tmp_path):
    safetensors = pytest.importorskip("safetensors")
    if not hasattr(safetensors, "TensorSpec"):
        pytest.skip("this safetensors has no TensorSpec to write raw BF16")
    bits = np.arange(12, dtype=np.uint16) * 1000
    path = tmp_path / "refbf16.safetensors"
    spec = safetensors.TensorSpec(dtype="bfloat16", shape=[3, 4], data_ptr=bits.ctypes.data, data_len=bits.nbytes)
    safetensors.serialize_file({"w": spec}, str(path), None)
    back, _ = load_safetensors(path)
    np.testing.assert_array_equal(back["w"][0], bits.reshape(3, 4))
    assert back["w"][1] == "BF16"


def test_metadata_and_names(tmp_path):
    meta = {"trainer": json.dumps({"epoch": 2, "note": "quote \" backslash \\ tab \t"}), "unicode": "αβγ ✓ 🚀",
            "empty": "", "nl": "a\nb\x01"}
    names = {"model.0.conv.weight": np.ones(2, np.float32), "ünï \"q\" \\b\n": np.zeros(1, np.int32),
             "🚀": np.arange(3, dtype=np.uint8)}
    path = tmp_path / "m.safetensors"
    save_safetensors(path, names, metadata=meta)
    back, m = load_safetensors(path)
    assert m == meta
    assert reference_metadata(path) == meta
    assert set(back) == set(names)
    assert set(reference_load(path)) == set(names)


def test_header_layout(tmp_path):
    path = tmp_path / "h.safetensors"
    save_safetensors(path, {"a": np.ones(1, np.uint8), "b": np.ones(3, np.float64), "c": np.ones(1, np.int16)},
                     metadata={"k": "v"})
    raw = path.read_bytes()
    (n,) = struct.unpack("<Q", raw[:8])
    assert n % 8 == 0 and raw[8:9] == b"{"
    hdr = json.loads(raw[8:8 + n])
    assert hdr["__metadata__"] == {"k": "v"}
    # largest item size first, so every tensor is aligned to its item size
    assert hdr["b"]["data_offsets"] == [0, 24] and hdr["c"]["data_offsets"] == [24, 26]
    assert hdr["a"]["data_offsets"] == [26, 27] and len(raw) == 8 + n + 27


def test_bad_arguments(tmp_path):
    path = tmp_path / "bad.safetensors"
    with pytest.raises(TypeError, match="'obj'.*unsupported dtype"):
        save_safetensors(path, {"obj": np.array(["x"], dtype=object)})
    with pytest.raises(TypeError, match="metadata"):
        save_safetensors(path, {"a": np.ones(1)}, metadata={"k": 1})
    with pytest.raises(TypeError, match="'w'.*BF16"):
        save_safetensors(path, {"w": (np.ones(2, np.float32), "BF16")})
    with pytest.raises(ValueError, match="__metadata__"):
        save_safetensors(path, {"__metadata__": np.ones(1)})
    assert not path.exists()
    assert os.listdir(tmp_path) == []


def test_writer_rejects_shapes_whose_size_wraps(tmp_path):
    """(2^32, 2^32) bytes wraps to 0 in 64 bits: the writer used to accept it with an empty buffer and
    write a header its own reader rejects."""
    path = tmp_path / "wrap.safetensors"
    with pytest.raises(ValueError, match="'a'.*too large"):
        ptl._C.safetensors_save(os.fspath(path), [("a", "U8", (2 ** 32, 2 ** 32), b"")])
    with pytest.raises(ValueError, match="'b'.*not its shape"):
        ptl._C.safetensors_save(os.fspath(path), [("b", "F32", (2, 3), b"\0" * 20)])
    with pytest.raises(TypeError, match="entries"):
        ptl._C.safetensors_save(os.fspath(path), 5)
    assert os.listdir(tmp_path) == []


def test_concurrent_writers_to_one_path(tmp_path):
    """Threads saving to the same path at once each use their own temporary file; the result is one
    complete file and no leftovers."""
    import threading
    path = tmp_path / "same.safetensors"
    arrays = [np.full(50000, k, np.int64) for k in range(6)]
    errors = []

    def save(k):
        try:
            save_safetensors(path, {"x": arrays[k]})
        except Exception as e:  # noqa: BLE001  (reported below)
            errors.append(e)

    threads = [threading.Thread(target=save, args=(k,)) for k in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    got, _ = load_safetensors(path)
    assert any(np.array_equal(got["x"], a) for a in arrays)
    assert os.listdir(tmp_path) == ["same.safetensors"]


@pytest.mark.parametrize("text", [b'{"w":{"dtype":"F32"', b'{"w":{"dtype":"F32","shape":[2', b'{"a":{"x":[1',
                                  b'{"__metadata__":{"k":"v"', b'{"w":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}'])
def test_header_ending_inside_an_object(tmp_path, text):
    """A header that stops after a value reports the position of its end (the parser used to step one
    byte past the header buffer first)."""
    path = tmp_path / "cut.safetensors"
    path.write_bytes(struct.pack("<Q", len(text)) + text)
    with pytest.raises(ValueError, match="expected ',' or .* at header byte %d$" % len(text)):
        load_safetensors(path)


def good_file(tmp_path):
    path = tmp_path / "good.safetensors"
    save_safetensors(path, {"w": np.arange(6, dtype=np.float32).reshape(2, 3), "b": np.ones(2, np.int64)},
                     metadata={"k": "v"})
    return path, path.read_bytes()


def rewrite_header(raw, edit):
    (n,) = struct.unpack("<Q", raw[:8])
    hdr = json.loads(raw[8:8 + n])
    edit(hdr)
    text = json.dumps(hdr).encode()
    text += b" " * (-len(text) % 8)
    return struct.pack("<Q", len(text)) + text + raw[8 + n:]


CORRUPTIONS = {
    "empty": (lambda raw: b"", "shorter than the 8-byte header length"),
    "short": (lambda raw: raw[:5], "shorter than the 8-byte header length"),
    "header past end": (lambda raw: struct.pack("<Q", 10 ** 6) + raw[8:], "runs past the end"),
    "header too long": (lambda raw: struct.pack("<Q", 2 ** 62) + raw[8:], "runs past the end"),
    "not json": (lambda raw: raw[:8] + b"[" + raw[9:], "does not start with"),
    "cut header": (lambda raw: raw[:8 + 20], "runs past the end"),
    "truncated data": (lambda raw: raw[:-3], "truncated"),
    "extra data": (lambda raw: raw + b"\0" * 4, "file holds"),
    "bad dtype": (lambda raw: rewrite_header(raw, lambda h: h["w"].update(dtype="F99")), "unsupported dtype"),
    "shape mismatch": (lambda raw: rewrite_header(raw, lambda h: h["w"].update(shape=[2, 4])), "need 32 bytes"),
    "overlap": (lambda raw: rewrite_header(raw, lambda h: h["w"].update(data_offsets=[0, 24])), "tile the data"),
    "no dtype": (lambda raw: rewrite_header(raw, lambda h: h["w"].pop("dtype")), "lacks a dtype"),
    "bad metadata": (lambda raw: rewrite_header(raw, lambda h: h.update(__metadata__={"k": 3})), "metadata"),
    "negative": (lambda raw: rewrite_header(raw, lambda h: h["w"].update(shape=[-2, 3])), "non-negative"),
    "float shape": (lambda raw: rewrite_header(raw, lambda h: h["w"].update(shape=[2.0, 3])), "integer"),
}


@pytest.mark.parametrize("kind", sorted(CORRUPTIONS))
def test_corrupt_files_raise_clear_errors(tmp_path, kind):
    path, raw = good_file(tmp_path)
    make, message = CORRUPTIONS[kind]
    path.write_bytes(make(raw))
    with pytest.raises(ValueError, match=message) as err:
        load_safetensors(path)
    assert str(path) in str(err.value)


def test_missing_file_is_oserror(tmp_path):
    path = tmp_path / "nope.safetensors"
    with pytest.raises(OSError, match="nope.safetensors"):
        load_safetensors(path)
    with pytest.raises(OSError, match="is not a regular file"):
        load_safetensors(tmp_path)
    with pytest.raises(OSError, match="no_dir"):
        save_safetensors(tmp_path / "no_dir" / "x.safetensors", {"a": np.ones(1)})


def test_failure_mid_write_keeps_previous_file(tmp_path):
    path, raw = good_file(tmp_path)
    big = {"w": np.full((1000, 100), 7.0, np.float32)}
    for after in (0, 7, 40, 200_000):
        ptl.io._inject_write_fault(after)
        with pytest.raises(OSError, match="injected failure"):
            save_safetensors(path, big)
        assert path.read_bytes() == raw
        assert sorted(os.listdir(tmp_path)) == ["good.safetensors"]  # the temporary file is removed
    back, meta = load_safetensors(path)
    assert meta == {"k": "v"} and back["w"].shape == (2, 3)
    save_safetensors(path, big)
    np.testing.assert_array_equal(load_safetensors(path)[0]["w"], big["w"])


def test_write_fault_is_armed_for_one_write_only(tmp_path):
    ptl.io._inject_write_fault(10)
    with pytest.raises(OSError, match="injected failure after 10 bytes"):
        save_safetensors(tmp_path / "a.safetensors", {"x": np.ones(8)})
    save_safetensors(tmp_path / "b.safetensors", {"x": np.ones(8)})
    ptl.io._inject_write_fault(10)
    ptl.io._inject_write_fault(-1)
    save_safetensors(tmp_path / "c.safetensors", {"x": np.ones(8)})
    assert sorted(os.listdir(tmp_path)) == ["b.safetensors", "c.safetensors"]


def kill_mid_write(path, after_bytes, script=None):
    """Runs a child that saves a 400 KB file to `path` with the write paused after `after_bytes` bytes,
    SIGKILLs it from here while it waits there, and returns the temporary file it left."""
    code = script or textwrap.dedent("""
        import sys, numpy as np
        import ptl.io
        ptl.io._inject_write_fault(int(sys.argv[2]), pause_ms=120_000)
        ptl.io.save_safetensors(sys.argv[1], {"w": np.full((1000, 100), 7.0, np.float32)})
    """)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([os.path.dirname(os.path.dirname(ptl.__file__))]
                                                       + sys.path))
    folder, name = os.path.split(os.fspath(path))
    proc = subprocess.Popen([sys.executable, "-c", code, os.fspath(path), str(after_bytes)], env=env,
                            stderr=subprocess.PIPE)
    deadline = time.monotonic() + 120
    try:
        while True:
            temps = [f for f in os.listdir(folder) if f.startswith(name + ".tmp.")]
            if temps and os.path.getsize(os.path.join(folder, temps[0])) >= after_bytes:
                break
            assert proc.poll() is None, proc.stderr.read().decode()
            assert time.monotonic() < deadline, "the child never reached the paused write"
            time.sleep(0.02)
        proc.send_signal(signal.SIGKILL)
    finally:
        proc.kill()
        proc.wait(timeout=60)
        proc.stderr.close()
    assert proc.returncode == -signal.SIGKILL
    return os.path.join(folder, temps[0])


def test_process_killed_mid_write_keeps_previous_file(tmp_path):
    path, raw = good_file(tmp_path)
    tmp = kill_mid_write(path, 100_000)
    assert path.read_bytes() == raw
    leftovers = [f for f in os.listdir(tmp_path) if f != "good.safetensors"]
    assert leftovers == [os.path.basename(tmp)] and ".tmp." in leftovers[0]
    assert (tmp_path / leftovers[0]).stat().st_size == 100_000  # the crash really was mid-write
    assert load_safetensors(path)[1] == {"k": "v"}
    assert set(reference_load(path)) == {"w", "b"}


def test_stale_temporaries_of_killed_writes_are_removed(tmp_path):
    path, raw = good_file(tmp_path)
    tmp = kill_mid_write(path, 1000)
    live = tmp_path / ("good.safetensors.tmp.%d.%d.0" % (os.getpid(), 1))  # this process: a write in progress
    others = ["good.safetensors.tmp", "good.safetensors.tmp.1.2", "notes.tmp.x.1.2", "good.safetensors.tmp.a.1.2"]
    live.write_bytes(b"x")
    for name in others:
        (tmp_path / name).write_bytes(b"mine")
    assert ptl.io.remove_stale_temporaries(tmp_path, target="other.ckpt") == []
    assert ptl.io.remove_stale_temporaries(tmp_path) == [tmp]
    assert sorted(os.listdir(tmp_path)) == sorted(["good.safetensors", live.name] + others)
    assert path.read_bytes() == raw


def test_invalid_utf8_in_the_header_names_the_file(tmp_path):
    """Every header byte must be UTF-8, also in keys the reader skips (the safetensors package agrees)."""
    path, raw = good_file(tmp_path)
    (n,) = struct.unpack("<Q", raw[:8])
    for where in (b'"w"', b'"k"', b'"v"'):
        bad = raw.replace(where, where[:1] + b"\xff" + where[2:], 1)
        assert bad != raw and len(bad) == len(raw)
        path.write_bytes(bad)
        with pytest.raises(ValueError, match="not UTF-8") as err:
            load_safetensors(path)
        assert str(path) in str(err.value)
    text = raw[8:8 + n].replace(b'"w":{', b'"w":{"junk":"\xc3\x28",', 1).rstrip(b" ")
    assert b"junk" in text
    text += b" " * (-len(text) % 8)
    path.write_bytes(struct.pack("<Q", len(text)) + text + raw[8 + n:])
    with pytest.raises(ValueError, match="not UTF-8"):
        load_safetensors(path)
    safetensors = pytest.importorskip("safetensors")
    with pytest.raises(safetensors.SafetensorError, match="UTF-8"):
        safetensors.deserialize(path.read_bytes())


@pytest.mark.parametrize("seq,ok", [(b"a\xc3\xa9", True), (b"\xe2\x82\xac", True), (b"\xf0\x9f\x9a\x80", True),
                                    (b"\xc0\xaf", False), (b"\xe0\x80\xaf", False), (b"\xed\xa0\x80", False),
                                    (b"\xf4\x90\x80\x80", False), (b"\xc3", False), (b"\x80", False),
                                    (b"\xf8\x88\x80\x80\x80", False)])
def test_utf8_check_matches_python(tmp_path, seq, ok):
    """Overlong forms, surrogates, code points past U+10FFFF and cut sequences are rejected, as Python's
    strict decoder rejects them."""
    try:
        seq.decode("utf-8")
        assert ok
    except UnicodeDecodeError:
        assert not ok
    text = b'{"__metadata__":{"k":"' + seq + b'"}}'
    text += b" " * (-len(text) % 8)
    path = tmp_path / "u.safetensors"
    path.write_bytes(struct.pack("<Q", len(text)) + text)
    if ok:
        assert load_safetensors(path)[1] == {"k": seq.decode()}
    else:
        with pytest.raises(ValueError, match="not UTF-8"):
            load_safetensors(path)
