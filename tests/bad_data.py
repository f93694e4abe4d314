"""A corpus of bad data-pipeline input: every case the loader must survive (issue 18, rules 1-4), written
from one good JPEG. Bombs are header patches (a few kB that declare a huge size), never huge files.

    write_corpus(folder, good_jpeg_bytes) -> {case: path}

Image cases (each a file that a decoder must reject, or that a scan may pass and a later decode reject):
  jpeg_bomb            a JPEG whose frame header declares 65000 x 65000
  png_bomb             a valid PNG whose IHDR declares 30000 x 30000 (with a tiny IDAT)
  jpeg_truncated       the first half of a JPEG (no end marker)
  jpeg_truncated_eoi   the first half of a JPEG with an end marker appended: passes the scan
  jpeg_corrupt_body    a JPEG with 200 bytes of its entropy-coded data replaced: passes the scan
  png_truncated        a PNG cut in its image data, IEND appended: passes the scan
  png_short_data       a PNG whose (well-formed) image data holds half the rows: passes the scan
  png_bad_crc          a PNG whose IDAT checksum is wrong: passes the scan
Label cases (label_cases): a dataset without a labels folder, one with empty label files only.
"""
import io
import os
import struct
import zlib

import numpy as np


def _chunk(kind, data):
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)


def png_bytes(img, rows=None, compressed=None):
    """A PNG of an (H, W, 3) uint8 image; `rows` stores only that many rows of image data, `compressed`
    replaces the IDAT payload."""
    h, w = img.shape[:2]
    raw = b"".join(b"\x00" + img[y].tobytes() for y in range(h if rows is None else rows))
    data = zlib.compress(raw) if compressed is None else compressed
    return (b"\x89PNG\r\n\x1a\n" + _chunk(b"IHDR", struct.pack(">IIBBBBB", w, h, 8, 2, 0, 0, 0))
            + _chunk(b"IDAT", data) + _chunk(b"IEND", b""))


def jpeg_header_bomb(jpeg, w=65000, h=65000):
    """The JPEG with its frame header (SOF0/1/2) declaring w x h."""
    b = bytearray(jpeg)
    for marker in (b"\xff\xc0", b"\xff\xc1", b"\xff\xc2"):
        k = b.find(marker)
        if k >= 0:
            b[k + 5:k + 9] = struct.pack(">HH", h, w)
            return bytes(b)
    raise ValueError("no frame header found")


def png_header_bomb(w=30000, h=30000):
    """A well-formed PNG (checksums right) declaring w x h, with a few bytes of image data."""
    return (b"\x89PNG\r\n\x1a\n" + _chunk(b"IHDR", struct.pack(">IIBBBBB", w, h, 8, 2, 0, 0, 0))
            + _chunk(b"IDAT", zlib.compress(b"\x00" * 1000)) + _chunk(b"IEND", b""))


def truncated_jpeg(jpeg, end_marker=False):
    return jpeg[:len(jpeg) // 2] + (b"\xff\xd9" if end_marker else b"")


def corrupt_jpeg_body(jpeg):
    """200 bytes in the middle of the entropy-coded data replaced with bytes libjpeg reports as a bad Huffman
    code (seeded: some random replacements decode without any warning, as JPEG has no checksum)."""
    b = bytearray(jpeg)
    a = len(b) // 2
    b[a:a + 200] = np.random.default_rng(1).integers(0, 256, 200, dtype=np.uint8).tobytes()
    return bytes(b)


def truncated_png(png):
    cut = png[:png.index(b"IDAT") + (png.index(b"IEND") - png.index(b"IDAT")) // 2]
    return cut + _chunk(b"IEND", b"")


def png_bad_crc(png):
    k = png.index(b"IDAT") - 4
    n = struct.unpack(">I", png[k:k + 4])[0]
    b = bytearray(png)
    b[k + 8 + n] ^= 0xFF  # first byte of the IDAT CRC
    return bytes(b)


def image_cases(jpeg):
    """{case: bytes} of the bad images, made from a good JPEG."""
    from PIL import Image

    img = np.asarray(Image.open(io.BytesIO(jpeg)).convert("RGB"))
    png = png_bytes(img)
    return {
        "jpeg_bomb.jpg": jpeg_header_bomb(jpeg),
        "png_bomb.png": png_header_bomb(),
        "jpeg_truncated.jpg": truncated_jpeg(jpeg),
        "jpeg_truncated_eoi.jpg": truncated_jpeg(jpeg, end_marker=True),
        "jpeg_corrupt_body.jpg": corrupt_jpeg_body(jpeg),
        "png_truncated.png": truncated_png(png),
        "png_short_data.png": png_bytes(img, rows=img.shape[0] // 2),
        "png_bad_crc.png": png_bad_crc(png),
    }


# the cases a scan cannot see (it reads headers and checks end markers): only a full decode finds them
PASS_SCAN = ("jpeg_truncated_eoi.jpg", "jpeg_corrupt_body.jpg", "png_truncated.png", "png_short_data.png",
             "png_bad_crc.png")


def write_corpus(folder, jpeg):
    """Writes every bad image case into folder; returns {case: path}."""
    os.makedirs(folder, exist_ok=True)
    out = {}
    for name, data in image_cases(jpeg).items():
        out[name] = os.path.join(folder, name)
        with open(out[name], "wb") as f:
            f.write(data)
    return out


def label_cases(root, jpeg, n=3):
    """Two datasets under root: 'nolabels' (no labels folder) and 'empty' (every label file empty); returns
    {case: data.yaml path}."""
    out = {}
    for case in ("nolabels", "empty"):
        d = os.path.join(root, case)
        os.makedirs(os.path.join(d, "images", "train"), exist_ok=True)
        for i in range(n):
            with open(os.path.join(d, "images", "train", "im%d.jpg" % i), "wb") as f:
                f.write(jpeg)
            if case == "empty":
                os.makedirs(os.path.join(d, "labels", "train"), exist_ok=True)
                open(os.path.join(d, "labels", "train", "im%d.txt" % i), "w").close()
        out[case] = os.path.join(d, "data.yaml")
        with open(out[case], "w") as f:
            f.write("path: .\ntrain: images/train\nval: images/train\nnames: [a]\n")
    return out
