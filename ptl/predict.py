"""Prediction on user sources, with optional annotated images and YOLO label files.

``predict(model, source, ...)`` (what ``Detector.predict`` and ``Trainer.predict`` call) takes:

- an image file, a folder (searched recursively), a glob pattern (``"data/*.jpg"``, ``**`` allowed),
  a ``.txt`` file listing images (paths relative to it), or a list of any of these;
- images as arrays: one ``(H, W, 3)`` uint8 RGB image of any size, a PIL image, or a list of them;
  these take the files' way (written as lossless PNGs to a temporary folder and read by the loader), so
  an array gives exactly what the same pixels in a file give;
- a network-ready batch: ``(N, H, W, 3)`` uint8 or ``(N, 3, H, W)`` float in [0, 1], H and W
  multiples of 32: run as it is, boxes in its own pixels.

Files are read, letterboxed to ``imgsz`` x ``imgsz`` and batched by the C loader (as validation
reads them); one that cannot be read is reported as a :class:`ptl.DataWarning` and gives ``None``.
Each result is a :class:`Results`: boxes (xyxy, original image pixels), scores, classes, the source
path (None for arrays), the original image size and the class names; ``res["boxes"]`` works too.

``save=True`` writes each image with its boxes, class names and scores drawn (Pillow) and
``save_txt=True`` a YOLO label file per image (``class cx cy w h`` normalised to the original image,
``score`` appended with ``save_conf``) into ``<project>/runs/<name>/version_N/`` (labels under
``labels/``); every file is written to a temporary name and renamed.

Command line: ``python -m ptl.predict --model best.safetensors --source images/ [--imgsz 640]
[--conf 0.25] [--iou 0.7] [--end2end] [--save-txt] [--no-save]``.
"""
import argparse
import glob
import os
import sys
import tempfile

import numpy as np

__all__ = ["Results", "predict", "resolve_source", "main"]

_FIELDS = ("boxes", "scores", "classes")


class Results:
    """Detections of one image: ``boxes`` (k, 4) float32 xyxy in ``orig_shape`` pixels, ``scores`` (k,),
    ``classes`` (k,) int64, score descending; ``path`` (None for arrays), ``orig_shape`` (h, w),
    ``names`` (the model's class names). ``res["boxes"]`` etc. read (and set) the arrays as well."""

    def __init__(self, boxes, scores, classes, names, orig_shape, path=None, image=None):
        self.boxes = np.asarray(boxes, np.float32).reshape(-1, 4)
        self.scores = np.asarray(scores, np.float32).reshape(-1)
        self.classes = np.asarray(classes, np.int64).reshape(-1)
        self.names, self.orig_shape, self.path = list(names), tuple(int(v) for v in orig_shape), path
        self._image = image  # the array the boxes refer to, when it was given as one
        self.save_dir = None  # the run folder its files were saved to
    def __getitem__(self, key):
        if key in _FIELDS or key in ("path", "orig_shape"):
            return getattr(self, key)
        raise KeyError("%r: a result holds %s" % (key, ", ".join(_FIELDS + ("path", "orig_shape"))))

    def __setitem__(self, key, value):
        if key not in _FIELDS:
            raise KeyError("%r: only %s can be set" % (key, ", ".join(_FIELDS)))
        setattr(self, key, np.asarray(value, {"boxes": np.float32, "scores": np.float32}.get(key, np.int64)))

    def __contains__(self, key):
        return key in _FIELDS or key in ("path", "orig_shape")

    def keys(self):
        return list(_FIELDS)

    def __len__(self):
        return len(self.scores)

    def __repr__(self):
        return "Results(%s, %d detections, orig_shape=%s)" % (self.path or "array", len(self), self.orig_shape)

    # ---------------------------------------------------------------------------------- files
    def image(self):
        """The original image (uint8 RGB (h, w, 3)): the given array, or the file read with Pillow."""
        if self._image is not None:
            return self._image
        if self.path is None:
            raise ValueError("this result has neither an image array nor a source path to draw on")
        from PIL import Image, ImageOps
        with Image.open(self.path) as im:
            return np.asarray(ImageOps.exif_transpose(im).convert("RGB"))

    def plot(self, line_width=None):
        """A PIL image of the original with every box, its class name and score drawn."""
        from PIL import Image, ImageDraw, ImageFont
        im = Image.fromarray(np.ascontiguousarray(self.image()))
        draw = ImageDraw.Draw(im)
        lw = line_width or max(round(sum(im.size) / 2 * 0.003), 2)
        font = ImageFont.load_default(size=max(lw * 5, 10))
        for box, score, cls in zip(self.boxes, self.scores, self.classes):
            color = _color(int(cls))
            (x1, x2), (y1, y2) = sorted((float(box[0]), float(box[2]))), sorted((float(box[1]), float(box[3])))
            draw.rectangle((x1, y1, x2, y2), outline=color, width=lw)
            name = self.names[cls] if 0 <= cls < len(self.names) else str(int(cls))
            text = "%s %.2f" % (name, score)
            tx0, ty0, tx1, ty1 = draw.textbbox((0, 0), text, font=font)
            tw, th = tx1 - tx0 + 2 * lw, ty1 - ty0 + 2 * lw
            top = y1 - th if y1 - th >= 0 else y1  # above the box when it fits, else inside it
            draw.rectangle((x1, top, x1 + tw, top + th), fill=color)
            draw.text((x1 + lw - tx0, top + lw - ty0), text, fill=(255, 255, 255), font=font)
        return im

    def save(self, path, line_width=None):
        """Writes :meth:`plot` to ``path`` (format from its extension), atomically."""
        im = self.plot(line_width)
        _atomic(path, lambda tmp: im.save(tmp, format=_format(path)))
        return path

    def save_txt(self, path, save_conf=False):
        """Writes a YOLO label file: ``class cx cy w h`` normalised to the original image (+ score)."""
        h, w = self.orig_shape
        lines = []
        for box, score, cls in zip(self.boxes.astype(np.float64), self.scores, self.classes):
            x1, y1, x2, y2 = box
            row = "%d %.6f %.6f %.6f %.6f" % (cls, (x1 + x2) / 2 / w, (y1 + y2) / 2 / h, (x2 - x1) / w, (y2 - y1) / h)
            lines.append(row + (" %.6f" % score if save_conf else ""))

        def write(tmp):
            with open(tmp, "w") as f:
                f.write("".join(ln + "\n" for ln in lines))
        _atomic(path, write)
        return path


def _color(i):
    """A fixed, well-spread colour per class (golden-ratio hues)."""
    import colorsys
    r, g, b = colorsys.hsv_to_rgb((i * 0.618033988749895) % 1.0, 0.85, 0.9)
    return int(r * 255), int(g * 255), int(b * 255)


_WRITABLE = {".jpg": "JPEG", ".jpeg": "JPEG", ".png": "PNG", ".bmp": "BMP", ".tif": "TIFF", ".tiff": "TIFF",
             ".webp": "WEBP"}  # annotated images keep their source's format when Pillow writes it


def _format(path):
    return _WRITABLE.get(os.path.splitext(os.fspath(path))[1].lower(), "JPEG")


def _atomic(path, write):
    path = os.fspath(path)
    tmp = "%s.tmp.%d%s" % (path, os.getpid(), os.path.splitext(path)[1])
    try:
        write(tmp)
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)


# -------------------------------------------------------------------------------------- sources

def _is_batch(x):
    return (hasattr(x, "shape") and len(x.shape) == 4) and not isinstance(x, (str, os.PathLike))


def resolve_source(source):
    """The list of items to predict on: image paths (str) and (H, W, 3) uint8 arrays, in order.
    Raises FileNotFoundError naming a path (or pattern) that gives no image."""
    from .data import _is_image, image_files
    items = source if isinstance(source, (list, tuple)) else [source]
    if not items:
        raise ValueError("source: no image given")
    out = []
    for item in items:
        if isinstance(item, (str, os.PathLike)):
            p = os.fspath(item)
            if any(c in p for c in "*?[") and not os.path.exists(p):
                found = sorted(f for f in glob.glob(p, recursive=True) if os.path.isfile(f) and _is_image(f))
                if not found:
                    raise FileNotFoundError("source: no images match %s" % p)
                out += found
            elif os.path.isdir(p) or (os.path.isfile(p) and p.endswith(".txt")):
                out += image_files(p)
            elif os.path.isfile(p):
                if not _is_image(p):
                    raise ValueError("source: %s is not an image file (by its extension)" % p)
                out.append(p)
            else:
                raise FileNotFoundError("source: %s does not exist" % p)
        else:
            out.append(_rgb(item))
    return out


def _rgb(item):
    if type(item).__module__.startswith("PIL."):
        return np.asarray(item.convert("RGB"))
    a = np.asarray(item)
    if a.ndim != 3 or a.shape[2] != 3 or a.dtype != np.uint8:
        raise ValueError("source: an image array must be (H, W, 3) uint8 RGB, got %s %s" % (a.dtype, a.shape))
    return np.ascontiguousarray(a)


# ------------------------------------------------------------------------------------ prediction

def predict(model, source, conf=0.25, max_det=300, imgsz=640, batch_size=16, save=False, save_txt=False,
            save_conf=False, project=None, name="predict", workers=2, iou=None, end2end=False):
    """Runs ``model`` on ``source`` (see the module doc); returns one :class:`Results` (or None for an
    unreadable file) per image. Detections as :meth:`ptl.Detector.predict` says (8.4.190's predictor:
    the one-to-many head with NMS at ``iou``, default ``metrics.NMS_IOU``; ``end2end``: the one-to-one
    top-k). With ``save``/``save_txt`` the files go to ``<project or cwd>/runs/<name>/version_N/``,
    named in each result's ``save_dir``."""
    from . import metrics
    detect = dict(conf=conf, max_det=max_det, iou=metrics.NMS_IOU if iou is None else iou, end2end=end2end)
    if _is_batch(source):
        rows = model._detect(source, **detect)
        x = source.numpy() if hasattr(source, "numpy") and not isinstance(source, np.ndarray) else np.asarray(source)
        hw = x.shape[1:3] if x.shape[-1] == 3 and x.dtype == np.uint8 else x.shape[2:4]
        images = list(x) if x.dtype == np.uint8 and x.shape[-1] == 3 else [None] * len(rows)
        # clipped to the batch's pixels, as 8.4.190's predictor clips every box to its image
        results = [Results(metrics.scale_boxes(r[:, :4], 1.0, (0, 0), hw).astype(np.float32), r[:, 4], r[:, 5],
                           model.names, hw, image=img) for r, img in zip(rows, images)]
    else:
        if not isinstance(imgsz, (int, np.integer)) or imgsz < 32 or imgsz % 32:
            raise ValueError("imgsz: expected a positive multiple of 32, got %r" % (imgsz,))
        items = resolve_source(source)
        results = [None] * len(items)
        with tempfile.TemporaryDirectory(prefix="ptl-predict-") as tmp:
            # arrays go through the files' pipeline (decode, resize, letterbox in C) as lossless PNGs
            paths = [p if isinstance(p, str) else _png(p, os.path.join(tmp, "%d.png" % i)) for i, p in enumerate(items)]
            from .data import image_batches
            for batch in image_batches(paths, imgsz=int(imgsz), batch_size=batch_size, workers=workers):
                dets = model._detect(batch.images, **detect)
                for k, det in enumerate(dets):
                    h0, w0, gy, gx, pl, pt = np.asarray(batch.meta, np.float64)[k]
                    boxes = metrics.scale_boxes(det[:, :4], (gx, gy), (pl, pt), (h0, w0))
                    j = int(batch.indices[k])
                    given = items[j]
                    results[j] = Results(boxes, det[:, 4], det[:, 5], model.names, (h0, w0),
                                         path=given if isinstance(given, str) else None,
                                         image=None if isinstance(given, str) else given)
    if save or save_txt:
        save_results(results, project=project, name=name, save=save, save_txt=save_txt, save_conf=save_conf)
    return results


def _png(image, path):
    from PIL import Image
    Image.fromarray(image).save(path, format="PNG", compress_level=1)
    return path


def save_results(results, project=None, name="predict", save=True, save_txt=False, save_conf=False):
    """Writes annotated images and/or label files of ``results`` into a new ``runs/<name>/version_N``
    under ``project`` (the current folder by default); returns that folder."""
    from .runlog import make_run_dir
    out = make_run_dir(os.fspath(project) if project is not None else os.getcwd(), name, True)
    if save_txt:
        os.makedirs(os.path.join(out, "labels"), exist_ok=True)
    taken = set()
    for i, res in enumerate(results):
        if res is None:
            continue
        stem, ext = (os.path.splitext(os.path.basename(res.path)) if res.path else ("image%d" % i, ".jpg"))
        base, n = stem, 1
        while base in taken:  # two sources with one file name: keep both
            base, n = "%s_%d" % (stem, n), n + 1
        taken.add(base)
        if save:
            res.save(os.path.join(out, base + (ext if ext.lower() in _WRITABLE else ".jpg")))
        if save_txt:
            res.save_txt(os.path.join(out, "labels", base + ".txt"), save_conf=save_conf)
        res.save_dir = out
    print("ptl: predictions saved to %s" % out, file=sys.stderr)
    return out


# ----------------------------------------------------------------------------------- command line

def build_parser():
    from .metrics import NMS_IOU
    p = argparse.ArgumentParser(prog="python -m ptl.predict", description="Detect objects with a YOLO26 model.")
    p.add_argument("--model", required=True, help="weights: ptl .safetensors / .ckpt, or an Ultralytics .pt")
    p.add_argument("--source", required=True, nargs="+", help="image files, folders, globs or .txt lists")
    p.add_argument("--imgsz", type=int, default=640, help="letterbox size, a multiple of 32 (640)")
    p.add_argument("--conf", type=float, default=0.25, help="keep detections scoring above this (0.25)")
    p.add_argument("--iou", type=float, default=NMS_IOU, help="NMS IoU threshold (%g)" % NMS_IOU)
    p.add_argument("--max-det", type=int, default=300, help="detections per image (300)")
    p.add_argument("--end2end", action="store_true",
                   help="the one-to-one head's top-k without NMS, as the ONNX export (default: one-to-many + NMS)")
    p.add_argument("--batch", type=int, default=16, help="images per forward (16)")
    p.add_argument("--device", default="cpu", help="cpu or cuda[:N] (cpu)")
    p.add_argument("--no-save", action="store_true", help="do not write annotated images")
    p.add_argument("--save-txt", action="store_true", help="write YOLO label files under labels/")
    p.add_argument("--save-conf", action="store_true", help="append the score to each label row")
    p.add_argument("--project", default=".", help="runs/<name>/version_N is made under it (.)")
    p.add_argument("--name", default="predict")
    return p


def main(argv=None):
    args = build_parser().parse_args(argv)
    from .model import Detector
    try:
        model = Detector.load(args.model)
        if args.device != "cpu":
            model.to(args.device)
        results = predict(model, args.source, conf=args.conf, iou=args.iou, end2end=args.end2end,
                          max_det=args.max_det, imgsz=args.imgsz,
                          batch_size=args.batch, save=not args.no_save, save_txt=args.save_txt,
                          save_conf=args.save_conf, project=args.project, name=args.name)
    except (ValueError, TypeError, KeyError, OSError) as exc:
        print("ptl.predict: error: %s" % exc, file=sys.stderr)
        return 2
    for res in results:
        if res is not None:
            counts = {}
            for c in res.classes:
                counts[res.names[c]] = counts.get(res.names[c], 0) + 1
            print("%s: %s" % (res.path, ", ".join("%d %s" % (n, k) for k, n in counts.items()) or "no detections"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
