"""Detection datasets: ``data.yaml`` parsing, file lists, and the C loader (``ptl._C.data_loader``).

A ``data.yaml`` has ``path`` (dataset root; relative paths are resolved against the yaml's folder),
``train`` and ``val`` and ``names`` (a list or an ``{id: name}`` mapping; ``nc`` optional). ``train`` and
``val`` are each either

- YOLO: a folder of images, a ``.txt`` list of image paths, a single image, or a list of those, relative to
  ``path``. Labels are found by replacing the last ``/images/`` folder of an image path with ``/labels/`` and
  its extension with ``.txt``; a missing label file means an image without objects.
- COCO: an instances file (``annotations/instances_val2017.json``); its images are looked for in
  ``images/val2017``, ``val2017`` (under ``path`` or beside the ``annotations`` folder), or the folder given
  as ``{"annotations": file.json, "images": folder}``. Category ids map to classes 0..K-1 in sorted id order
  (Ultralytics' converter; for COCO's 80 categories this is its 91-to-80 table), crowd boxes are ignored
  (as COCO's evaluation ignores them) and boxes without area dropped. ``names`` may then be omitted: the
  categories' names are used.

Image files are JPEG, PNG, BMP, WebP and TIFF (WebP and TIFF when ptl was built with libwebp / libtiff;
``ptl._C.DATA_FORMATS`` says which): the format is read from the first bytes, not the extension.

Batches come out of the loaders as :class:`Batch` objects holding NumPy arrays:

- ``images``: uint8 ``(N, H, W, 3)`` RGB, channels last, viewing one slot of the loader's ring (page-
  locked host memory when CUDA is usable). The slot returns to the ring when the last reference to the
  array (or to a view of it) goes away. The ring has ``prefetch`` slots (default
  ``max(3, workers // batch + 3)``); holding every slot makes the next request raise instead of hang.
- ``targets``: float32 ``(T, 6)`` rows ``(image index in batch, class, cx, cy, w, h)``, normalised to the
  batch's image size.
- ``indices``: int64 ``(N,)`` dataset index of each image (validation order is sorted by aspect ratio).
- ``sources``: int64 ``(N,)`` dataset index of the file each image shows: the same as ``indices`` unless
  that file failed to decode and was replaced (see below).
- ``meta``: float64 ``(N, 6)`` ``(h0, w0, gain_y, gain_x, pad_left, pad_top)``: a box ``x`` in the batch
  image maps back to the original file as ``(x - pad_left) / gain_x`` (validation).

``Batch.upload(dst, staging)`` copies the images to ``dst``'s device asynchronously and writes
``images / 255`` there in ``dst``'s dtype (float32, bfloat16, float16); ``staging`` is a uint8 CUDA
tensor of at least ``images.size`` elements (not needed for CPU tensors).

Every sample's augmentation is a pure function of ``(seed, epoch, dataset index)``: the bytes do not
depend on ``workers``, ``cache`` (none, RAM or disk) or ``persistent_workers``.

Data parallelism (:meth:`DetectionData.shard`): every rank plans the epoch as one process whose batch is
the global batch ``batch_size * world_size`` would, from the same seed, and takes its share. Training:
rank ``r`` takes the ``r``-th ``batch_size`` images of each global batch (the last, partial global batch
is split as evenly as possible, so there a rank may get fewer images, or none: an empty batch); every
rank has ``len(loader)`` batches, the same number. Validation: the single-process batches of
``val_batch_size`` are dealt whole, batch ``j`` to rank ``j % world_size``. Nothing is padded or dropped:
the ranks' batches together are the single-process epoch, each image once, with the same augmentation
bytes. ``Batch.batch`` is the global batch index. Mosaic partners are drawn
uniformly from the whole dataset (Ultralytics draws them from a buffer of recently loaded images when there
is no cache, which depends on timing).

Bad input: the scan skips (with one :class:`DataWarning` each) unreadable, truncated or corrupt files,
images whose declared size exceeds ``max_pixels`` and bad label files. A file that passes the scan but fails
to decode later (damaged data, a size changed since the scan) is reported once as a :class:`DataWarning` and
replaced, in every epoch, by the next image in dataset order that decodes, with that image's labels: the
replacement does not depend on ``workers``, the cache or timing (``Batch.sources`` shows it; validation then
counts the replacement twice, prediction leaves the file out). ``Loader.skipped_files`` counts both kinds.
"""
import hashlib
import json
import logging
import math
import os
import re
import warnings

import numpy as np

from . import _C
from .errors import yaml_error_line
from .hparams_check import check_data_args

log = logging.getLogger(__name__)

IMG_FORMATS = {"bmp", "dng", "jpeg", "jpg", "mpo", "png", "tif", "tiff", "webp", "pfm", "heic"}
STRIDE = 32  # the network's largest stride: image sizes are multiples of it

__all__ = ["Batch", "DataWarning", "DetectionData", "image_files", "label_path", "read_data_yaml"]


class DataWarning(UserWarning):
    """A dataset problem: a skipped image or a fixed label file (the message names file and line)."""


def label_path(image):
    """The label file of an image: last ``/images/`` -> ``/labels/``, extension -> ``.txt``."""
    sa, sb = os.sep + "images" + os.sep, os.sep + "labels" + os.sep
    return sb.join(image.rsplit(sa, 1)).rsplit(".", 1)[0] + ".txt"


def _is_image(p):
    return p.rpartition(".")[-1].lower() in IMG_FORMATS


def check_imgsz(imgsz, name="imgsz"):
    """``imgsz`` (an int or ``(h, w)``) as ``(h, w)``, each rounded up to a multiple of 32 (at least 32) with
    a warning when that changes it, as Ultralytics' ``check_imgsz`` does."""
    if isinstance(imgsz, (int, np.integer)) and not isinstance(imgsz, bool):
        hw = (int(imgsz), int(imgsz))
    elif (isinstance(imgsz, (tuple, list)) and len(imgsz) == 2
          and all(isinstance(v, (int, np.integer)) and not isinstance(v, bool) for v in imgsz)):
        hw = (int(imgsz[0]), int(imgsz[1]))
    else:
        raise ValueError("%s: expected an int or (h, w) ints, got %r" % (name, imgsz))
    if min(hw) < 1:
        raise ValueError("%s: expected positive sizes, got %r" % (name, imgsz))
    out = tuple(max(STRIDE, math.ceil(v / STRIDE) * STRIDE) for v in hw)
    if out != hw:
        shown = out[0] if not isinstance(imgsz, (tuple, list)) else list(out)
        warnings.warn("%s=%r must be a multiple of the stride %d: updating to %r" % (name, imgsz, STRIDE, shown),
                      UserWarning, stacklevel=3)
    return out


def image_files(spec, root=None):
    """Resolve a ``train``/``val`` entry (folder, ``.txt`` list, image file, or a list of them) to a sorted
    list of image paths. Raises FileNotFoundError naming the path when it is missing or holds no images."""
    entries = spec if isinstance(spec, (list, tuple)) else [spec]
    files = []
    for e in entries:
        p = os.fspath(e)
        if root is not None and not os.path.isabs(p):
            p = os.path.join(root, p)
        p = os.path.normpath(p)
        if os.path.isdir(p):
            found = []
            for dirpath, _, names in os.walk(p):
                found += [os.path.join(dirpath, n) for n in names if _is_image(n)]
            if not found:
                raise FileNotFoundError("no images found in %s" % p)
            files += found
        elif os.path.isfile(p) and p.endswith(".txt"):
            parent = os.path.dirname(p)
            with open(p) as f:
                lines = [ln.strip() for ln in f if ln.strip()]
            found = [os.path.normpath(x if os.path.isabs(x) else os.path.join(parent, x)) for x in lines]
            found = [x for x in found if _is_image(x)]
            if not found:
                raise FileNotFoundError("no images listed in %s" % p)
            files += found
        elif os.path.isfile(p) and _is_image(p):
            files.append(p)
        else:
            raise FileNotFoundError("dataset path %s does not exist" % p)
    return sorted(files)


# ---- COCO instances files ------------------------------------------------------------------------------

def _is_coco(spec):
    return (isinstance(spec, str) and spec.lower().endswith(".json")) or (
        isinstance(spec, dict) and "annotations" in spec)


def _coco_paths(spec, root):
    """(instances file, image folder) of a COCO train/val entry."""
    ann = spec["annotations"] if isinstance(spec, dict) else spec
    ann = os.path.normpath(ann if os.path.isabs(ann) else os.path.join(root, ann))
    if not os.path.isfile(ann):
        raise FileNotFoundError("COCO instances file %s does not exist" % ann)
    if isinstance(spec, dict) and spec.get("images") is not None:
        folder = spec["images"]
        folders = [os.path.normpath(folder if os.path.isabs(folder) else os.path.join(root, folder))]
    else:
        stem = os.path.splitext(os.path.basename(ann))[0]
        stem = stem[len("instances_"):] if stem.startswith("instances_") else stem
        up = os.path.dirname(os.path.dirname(ann))
        folders = [os.path.join(root, "images", stem), os.path.join(root, stem), os.path.join(up, "images", stem),
                   os.path.join(up, stem)]
    for f in folders:
        if os.path.isdir(f):
            return ann, f
    raise FileNotFoundError("no image folder for %s (looked for %s)" % (ann, ", ".join(folders)))


def _load_json(path):
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except (ValueError, UnicodeDecodeError) as e:
        raise ValueError("%s: not a valid JSON file (%s)" % (path, e)) from None


def _coco_categories(doc, path):
    cats = doc.get("categories")
    if not isinstance(cats, list) or not cats:
        raise ValueError("%s: no 'categories' list" % path)
    try:
        return sorted((int(c["id"]), str(c.get("name", c["id"]))) for c in cats)
    except (KeyError, TypeError, ValueError):
        raise ValueError("%s: every category needs an integer 'id'" % path) from None


def coco_split(spec, root, nc=None):
    """A COCO instances file as the loader takes it: (image paths, labels as (name, rows (k, 5)) tuples,
    category names). Images are sorted by path (as a YOLO folder); rows are (class, cx, cy, w, h)
    normalised by the image's width and height."""
    ann, folder = _coco_paths(spec, root)
    doc = _load_json(ann)
    cats = _coco_categories(doc, ann)
    if nc is not None and len(cats) != nc:
        raise ValueError("%s: %d categories but the data yaml has %d names" % (ann, len(cats), nc))
    cls_of = {cid: k for k, (cid, _) in enumerate(cats)}
    try:
        images = {int(im["id"]): im for im in doc["images"]}
        rows = {i: [] for i in images}
        for a in doc.get("annotations", []):
            if a.get("iscrowd", 0):
                continue
            im = images[int(a["image_id"])]
            x, y, w, h = (float(v) for v in a["bbox"])
            if w <= 0 or h <= 0:
                continue
            W, H = float(im["width"]), float(im["height"])
            rows[int(a["image_id"])].append((cls_of[int(a["category_id"])], (x + w / 2) / W, (y + h / 2) / H,
                                             w / W, h / H))
    except (KeyError, TypeError, ValueError) as e:
        raise ValueError("%s: malformed COCO instances (%s: %s)" % (ann, type(e).__name__, e)) from None
    order = sorted(images, key=lambda i: os.path.normpath(os.path.join(folder, images[i]["file_name"])))
    paths = [os.path.normpath(os.path.join(folder, images[i]["file_name"])) for i in order]
    labels = [("%s image_id %d" % (ann, i), np.asarray(rows[i], np.float32).reshape(-1, 5)) for i in order]
    return paths, labels, [n for _, n in cats]


def read_data_yaml(data):
    """Parse a data.yaml (path or dict) into a dict with absolute ``path``, ``train``, ``val`` entries,
    ``names`` (a list) and ``nc``."""
    import yaml

    if isinstance(data, dict):
        cfg, base = dict(data), os.getcwd()
        where = "data dict"
    else:
        where = os.fspath(data)
        if not os.path.isfile(where):
            raise FileNotFoundError("data yaml %s does not exist" % where)
        with open(where) as f:
            try:
                cfg = yaml.safe_load(f) or {}
            except yaml.YAMLError as e:
                raise ValueError(yaml_error_line(e, where)) from None
        if not isinstance(cfg, dict):
            raise ValueError("%s: expected a mapping with keys path, train, val, names" % where)
        base = os.path.dirname(os.path.abspath(where))
    root = cfg.get("path") or "."
    root = os.path.normpath(root if os.path.isabs(str(root)) else os.path.join(base, str(root)))
    for key in ("train", "val"):
        if key not in cfg or cfg[key] is None:
            raise ValueError("%s: missing '%s'" % (where, key))
    names = cfg.get("names")
    if isinstance(names, dict):
        keys = sorted(int(k) for k in names)
        if keys != list(range(len(keys))):
            raise ValueError("%s: names must be numbered 0..nc-1, got ids %s" % (where, keys))
        names = [str(names[k]) for k in keys]
    elif isinstance(names, (list, tuple)):
        names = [str(n) for n in names]
    elif names is None and "nc" in cfg:
        names = ["class%d" % i for i in range(int(cfg["nc"]))]
    elif names is None and (_is_coco(cfg["train"]) or _is_coco(cfg["val"])):
        spec = cfg["train"] if _is_coco(cfg["train"]) else cfg["val"]
        ann, _ = _coco_paths(spec, root)
        names = [n for _, n in _coco_categories(_load_json(ann), ann)]
    else:
        raise ValueError("%s: missing 'names' (a list or an {id: name} mapping)" % where)
    nc = int(cfg.get("nc", len(names)))
    if nc != len(names) or nc <= 0:
        raise ValueError("%s: nc=%d but %d names" % (where, nc, len(names)))
    return {"path": root, "train": cfg["train"], "val": cfg["val"], "names": names, "nc": nc, "yaml": where}


# ---- the disk cache ------------------------------------------------------------------------------------

def _cache_root(cache_dir):
    if cache_dir is not None:
        return os.path.abspath(os.fspath(cache_dir))
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "ptl", "disk-cache")


def _pid_alive(pid):
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


_TEMP = re.compile(r".+\.ptlc\.tmp\.(\d+)\.\d+")


def _remove_stale_temps(folder):
    """Temporary cache files left by a killed writer (its process is gone) in one of our cache folders."""
    for e in os.scandir(folder):
        m = _TEMP.fullmatch(e.name)
        if m and not _pid_alive(int(m.group(1))):
            try:
                os.unlink(e.path)
            except FileNotFoundError:
                pass


def _writable(folder):
    """Whether we may write into folder: permission bits that allow it (checked even for root, who may write
    into a folder made read-only on purpose), os.access, and no read-only mount."""
    try:
        st = os.stat(folder)
        return bool(st.st_mode & 0o222) and os.access(folder, os.W_OK) and not (
            os.statvfs(folder).f_flag & os.ST_RDONLY)
    except OSError:
        return False


def disk_cache_paths(files, tag, cache_dir=None):
    """The cache file of each image: ``<image folder>/.ptl-cache/<name>.<tag>.ptlc`` beside the images, or
    under ``cache_dir`` (default ``~/.cache/ptl/disk-cache``) in a folder named by a hash of the image folder
    when ``cache_dir`` is given or the image folder is read-only. Returns (paths, {image folder: cache
    folder}); the folders exist and hold no stale temporary files."""
    folders, out = {}, []
    for f in files:
        d, base = os.path.split(os.path.abspath(f))
        if d not in folders:
            target = None
            local = os.path.join(d, ".ptl-cache")
            if cache_dir is None and _writable(local if os.path.isdir(local) else d):
                try:
                    os.makedirs(local, exist_ok=True)
                    target = local
                except OSError:
                    pass
            if target is None:
                target = os.path.join(_cache_root(cache_dir), hashlib.sha1(d.encode()).hexdigest()[:16])
                os.makedirs(target, exist_ok=True)
            _remove_stale_temps(target)
            folders[d] = target
        out.append(os.path.join(folders[d], "%s.%s.ptlc" % (base, tag)))
    return out, folders


# ---- batches and loaders -------------------------------------------------------------------------------

class Batch:
    """One batch (see the module documentation for the arrays)."""

    __slots__ = ("images", "targets", "indices", "meta", "epoch", "batch", "sources")

    def __init__(self, images, targets, indices, meta, epoch, batch, sources=None):
        self.images, self.targets, self.indices, self.meta = images, targets, indices, meta
        self.epoch, self.batch = epoch, batch
        self.sources = indices if sources is None else sources

    def __len__(self):
        return self.images.shape[0]

    def upload(self, dst, staging=None):
        """Asynchronously copy the images to dst's device and normalise them into dst (N, H, W, 3)."""
        _C.data_upload(self.images, dst, staging)


class Loader:
    """Iterating yields the batches of the data module's current epoch (``DetectionData.set_epoch``)."""

    def __init__(self, owner, split, c_loader, info, train):
        self._owner, self.split, self._c, self.info, self.train = owner, split, c_loader, info, train
        self._reported = 0
        self._filled = not owner.cache

    def fill(self):
        """Fills the RAM cache (or checks and writes the disk cache) now, once; returns the loader.
        ``train_loader()`` and ``val_loader()`` return filled loaders."""
        if not self._filled:
            o = self._owner
            need, _ = self._c.cache_info()
            if o.verbose and o._says():
                log.info("caching %d %s images %s (%.2f GB)", self.info["n"], self.split,
                         "in RAM" if o.cache == "ram" else "on disk", need / 1e9)
            self._c.fill_cache()
            self._filled = True
            self.report_problems()
        return self

    def __len__(self):
        """Batches per epoch of this rank (in training every rank has as many, see the module documentation)."""
        return self._c.num_batches()

    @property
    def num_images(self):
        """Usable images of the whole split (all ranks)."""
        return self.info["n"]

    @property
    def num_global_batches(self):
        """Batches of the epoch's global plan, over all ranks."""
        return self._c.num_global_batches()

    @property
    def batch_slices(self):
        """int64 ``(len(self), 3)``: per batch of this rank, its global batch index, the position of its first
        image in the epoch's order and its size."""
        return self._c.batch_slices()

    def indices(self, epoch=None, batch=None):
        """The dataset indices this rank's batches hold in ``epoch`` (default: the current one), without
        building any image: one int64 array per batch, or that of batch ``batch``."""
        epoch = self._owner.epoch if epoch is None else epoch
        if batch is not None:
            return self._c.batch_indices(epoch, batch)
        return [self._c.batch_indices(epoch, b) for b in range(len(self))]

    @property
    def batch_shapes(self):
        """int64 ``(num_batches, 2)``: the ``(h, w)`` of every batch, fixed for the loader's life (rect
        batches differ, so the executor plans each distinct shape once)."""
        return self._c.batch_shapes()

    @property
    def skipped_files(self):
        """Image files left out so far: skipped at the scan plus those that failed to decode since (each is
        replaced by another image). The end-of-epoch line reports it."""
        return self.info["skipped"] + self._c.num_failed()

    @property
    def failed_files(self):
        """Files that passed the scan but failed to decode later (replaced, see the module documentation)."""
        return self._c.num_failed()

    def report_problems(self):
        """Issues one DataWarning per problem the C loader met since the last call (file and reason)."""
        new = self._c.problems(self._reported)
        self._reported += len(new)
        rank = "" if self._owner.world_size == 1 else "rank %d: " % self._owner.rank
        for msg in new:
            warnings.warn("%s%s: %s" % (rank, self.split, msg), DataWarning, stacklevel=3)
        self._owner.problems += new

    def __iter__(self):
        epoch = self._owner.epoch
        self._c.start(epoch, self._owner.mosaic_enabled(epoch) if self.train else False)
        while True:
            out = self._c.next()
            self.report_problems()
            if out is None:
                return
            yield Batch(*out)

    def sample(self, index, epoch=None, mosaic=None):
        """One sample built in the calling thread: (image (H, W, 3) uint8, targets (k, 5) float32
        (class, cx, cy, w, h normalised), meta (6,) float64)."""
        epoch = self._owner.epoch if epoch is None else epoch
        if mosaic is None:
            mosaic = self._owner.mosaic_enabled(epoch) if self.train else False
        img, targets, meta, _ = self._c.sample(epoch, index, bool(mosaic))
        self.report_problems()
        return img, targets, meta

    def cache_info(self):
        """(bytes the cache needs, bytes cached so far)."""
        return self._c.cache_info()


class DetectionData:
    """A detection dataset and its train/val loaders (augmentation defaults: spec §10).

    Beyond the augmentation hyperparameters (Ultralytics' names and meanings):

    - ``imgsz``: an int or ``(h, w)`` for training; each side is rounded up to a multiple of 32 with a
      warning. Validation (and ``rect`` training) use the long side as a square ``imgsz``.
    - ``cache``: ``None``, ``"ram"`` (decoded, resized images kept in memory) or ``"disk"`` (the same bytes
      in one file per image beside the images, ``.ptl-cache/`` in each image folder, or under ``cache_dir``
      when given or when that folder is read-only; mapped by the loader; rebuilt when an image's size or
      mtime changes; written atomically). Batches are byte-identical with any cache.
    - ``rect``: rectangular training batches (images sorted by aspect ratio, each batch letterboxed to its
      own shape, no mosaic; the order is then fixed across epochs when the shapes differ, as Ultralytics
      turns shuffle off).
    - ``single_cls``: every label becomes class 0 of one class named ``"item"`` (Ultralytics).
    - ``fraction``: the first fraction (a float in (0, 1]) or count (an int) of the training images.
    - ``max_pixels``: images whose declared width x height exceeds it are skipped at the scan (and again at
      decode); default ``ptl._C.DATA_MAX_PIXELS`` (Pillow's limit, ~89.5 M), ``None`` for no limit.
    - ``jpeg_scale_pixels``: JPEGs with more pixels than this are decoded at the smallest libjpeg DCT scale
      n/8 that still covers their load-time size, then resized as usual (deterministic; less memory and
      time for large photos; their bytes differ slightly from a full-size decode). Default
      ``ptl._C.DATA_JPEG_SCALE_PIXELS`` (4096 x 4096); ``0`` or ``None`` decodes every JPEG at full size.
    - ``allow_empty_labels``: training on a split where no image has a label raises ValueError unless this is
      True (then, as for a validation split without labels, a DataWarning says so with the counts: images,
      with labels, empty label files, no label file; with ``verbose`` the counts are said for every split).
    - ``verbose``: the label counts and cache lines go to the ``ptl.data`` logger at INFO (the library adds no
      handler: ``logging.basicConfig(level=logging.INFO)`` shows them; the command line prints them).
    """

    def __init__(self, data, imgsz=640, batch_size=16, workers=8, cache=None, persistent_workers=True, seed=0,
                 *, epochs=None, close_mosaic=10, mosaic=1.0, degrees=0.0, translate=0.1, scale=0.5, shear=0.0,
                 perspective=0.0, hsv_h=0.015, hsv_s=0.7, hsv_v=0.4, flipud=0.0, fliplr=0.5,
                 val_batch_size=None, rect_val=True, prefetch=None, pin_memory=None, verbose=True,
                 rect=False, single_cls=False, fraction=1.0, max_pixels=_C.DATA_MAX_PIXELS,
                 jpeg_scale_pixels=_C.DATA_JPEG_SCALE_PIXELS, allow_empty_labels=False, cache_dir=None):
        check_data_args(imgsz=imgsz, batch_size=batch_size, workers=workers, cache=cache,
                        persistent_workers=persistent_workers, seed=seed, epochs=epochs, close_mosaic=close_mosaic,
                        mosaic=mosaic, degrees=degrees, translate=translate, scale=scale, shear=shear,
                        perspective=perspective, hsv_h=hsv_h, hsv_s=hsv_s, hsv_v=hsv_v, flipud=flipud, fliplr=fliplr,
                        val_batch_size=val_batch_size, rect_val=rect_val, prefetch=prefetch, pin_memory=pin_memory,
                        verbose=verbose, rect=rect, single_cls=single_cls, fraction=fraction, max_pixels=max_pixels,
                        jpeg_scale_pixels=jpeg_scale_pixels, allow_empty_labels=allow_empty_labels,
                        cache_dir=cache_dir)
        if cache is True:
            cache = "ram"
        self.imgsz_hw = check_imgsz(imgsz)
        self.cfg = read_data_yaml(data)
        self.single_cls = bool(single_cls)
        self.names = ["item"] if self.single_cls else self.cfg["names"]
        self.num_classes = len(self.names)
        h, w = self.imgsz_hw
        self.imgsz = h if h == w else [h, w]
        self.batch_size, self.workers = batch_size, workers
        self.val_batch_size = val_batch_size or 2 * batch_size
        self.cache = cache or None
        self.cache_dir = cache_dir
        self.persistent_workers = bool(persistent_workers)
        self.seed = int(seed)
        self.epochs, self.close_mosaic = epochs, int(close_mosaic)
        self.hyp = dict(mosaic=mosaic, degrees=degrees, translate=translate, scale=scale, shear=shear,
                        perspective=perspective, hsv_h=hsv_h, hsv_s=hsv_s, hsv_v=hsv_v, flipud=flipud,
                        fliplr=fliplr)
        self.rect_val, self.prefetch, self.verbose = bool(rect_val), prefetch, verbose
        self.rect, self.fraction = bool(rect), fraction
        self.max_pixels = None if max_pixels is None else int(max_pixels)
        self.jpeg_scale_pixels = int(jpeg_scale_pixels or 0)
        self.allow_empty_labels = bool(allow_empty_labels)
        if pin_memory is None:
            from . import cuda
            pin_memory = cuda.is_available()
        self.pin_memory = bool(pin_memory)
        self.epoch = 0
        self.problems = []
        self._loaders = {}
        self.rank, self.world_size = 0, 1

    # -- data parallelism ---------------------------------------------------------------------------
    def shard(self, rank, world_size):
        """Makes the loaders give this process its share of every epoch (module documentation); loaders made
        for another share are dropped. Every rank scans the files; only rank 0 prints and warns about the scan."""
        if (isinstance(rank, bool) or isinstance(world_size, bool) or not isinstance(rank, int)
                or not isinstance(world_size, int) or world_size < 1 or not 0 <= rank < world_size):
            raise ValueError("shard: expected ints 0 <= rank < world_size, got rank=%r, world_size=%r"
                             % (rank, world_size))
        if (rank, world_size) != (self.rank, self.world_size):
            self._loaders = {}
        self.rank, self.world_size = rank, world_size

    @property
    def global_batch_size(self):
        """Training images per step over all ranks, ``batch_size * world_size``: the nominal-batch accumulation
        and the weight-decay scaling use it, as one process with this batch would."""
        return self.batch_size * self.world_size

    def _says(self):
        return self.rank == 0

    # -- epochs -------------------------------------------------------------------------------------
    def set_epoch(self, epoch):
        if not isinstance(epoch, int) or epoch < 0:
            raise ValueError("epoch: expected an int >= 0, got %r" % (epoch,))
        self.epoch = epoch

    def mosaic_enabled(self, epoch=None):
        """Mosaic is used unless it is off, ``rect`` is on, or ``epoch >= epochs - close_mosaic`` (spec
        §7.10)."""
        epoch = self.epoch if epoch is None else epoch
        if self.hyp["mosaic"] <= 0 or self.rect:
            return False
        if self.epochs is not None and self.close_mosaic > 0 and epoch >= self.epochs - self.close_mosaic:
            return False
        return True

    # -- loaders ------------------------------------------------------------------------------------
    def train_loader(self):
        return self._loader("train").fill()

    def val_loader(self):
        return self._loader("val").fill()

    def scan(self, split):
        """The ``"train"`` or ``"val"`` loader after the scan (files and labels read, batches and their
        shapes planned) and before its cache is filled (:meth:`Loader.fill`); the same object the split's
        ``*_loader()`` returns, filled."""
        if split not in ("train", "val"):
            raise ValueError("split: expected 'train' or 'val', got %r" % (split,))
        return self._loader(split)

    def __len__(self):
        return len(self._loader("train"))

    def _split(self, split):
        """(image paths, labels: label file paths or (name, rows) tuples) of a split, after ``fraction``."""
        spec = self.cfg[split]
        if _is_coco(spec):
            images, labels, _ = coco_split(spec, self.cfg["path"], self.cfg["nc"])
        else:
            images = image_files(spec, self.cfg["path"])
            labels = [label_path(p) for p in images]
        if split == "train" and self.fraction != 1.0:
            k = self.fraction if isinstance(self.fraction, (int, np.integer)) else max(
                1, round(len(images) * self.fraction))
            images, labels = images[:k], labels[:k]
        return images, labels

    def files(self, split):
        """The image files of a split (after ``fraction`` for train), before the scan."""
        return self._split(split)[0]

    def _loader(self, split):
        if split in self._loaders:
            return self._loaders[split]
        images, labels = self._split(split)
        train = split == "train"
        rect = self.rect if train else self.rect_val
        h, w = self.imgsz_hw
        # validation and rect training: square at the long side (Ultralytics takes one int imgsz)
        frame = (h, w) if train and not rect else (max(h, w), max(h, w))
        cache_paths = None
        if self.cache == "disk":
            cache_paths, folders = disk_cache_paths(images, "%dx%d" % (frame[1], frame[0]), self.cache_dir)
            moved = sorted(d for d, c in folders.items() if os.path.dirname(c) != d)
            if moved and self.verbose and self.cache_dir is None and self._says():
                log.info("%s is read-only; its disk cache is under %s", moved[0], _cache_root(None))
        hy = self.hyp
        c, info = _C.data_loader(
            images, labels, nc=self.cfg["nc"], imgsz=frame,
            batch=self.batch_size if train else self.val_batch_size, workers=self.workers, train=train,
            rect=rect, cache={None: 0, "ram": 1, "disk": 2}[self.cache], persistent=self.persistent_workers,
            prefetch=self.prefetch or 0, seed=self.seed & 0xFFFFFFFFFFFFFFFF, mosaic=0.0 if rect else hy["mosaic"],
            degrees=hy["degrees"], translate=hy["translate"], scale=hy["scale"], shear=hy["shear"],
            perspective=hy["perspective"], hsv_h=hy["hsv_h"], hsv_s=hy["hsv_s"], hsv_v=hy["hsv_v"],
            flipud=hy["flipud"], fliplr=hy["fliplr"], pinned=self.pin_memory, single_cls=self.single_cls,
            max_pixels=self.max_pixels or (1 << 62), scale_pixels=self.jpeg_scale_pixels, cache_paths=cache_paths,
            rank=self.rank, world=self.world_size, shard=0 if train else 1)
        for msg in info["log"] if self._says() else ():
            warnings.warn(msg, DataWarning, stacklevel=3)
        self.problems += info["log"]
        where = self.cfg[split]
        if isinstance(where, str) and not os.path.isabs(where):
            where = os.path.join(self.cfg["path"], where)
        if (info["skipped"] or info["duplicates"]) and self._says():
            warnings.warn("%s %s: %d images, %d skipped, %d duplicate label rows removed"
                          % (split, where, info["n"], info["skipped"], info["duplicates"]), DataWarning,
                          stacklevel=3)
        if c is None:
            raise ValueError("%s %s: none of the %d images is usable (see the warnings)" % (split, where, len(images)))
        self._check_labels(split, where, info, labels)
        loader = Loader(self, split, c, info, train)
        if train and rect and c.fixed_order() and self._says():
            warnings.warn("rect=True: batches have differing shapes, so the training order is kept (sorted by "
                          "aspect ratio) instead of shuffled, as Ultralytics does", UserWarning, stacklevel=3)
        self._loaders[split] = loader
        return loader

    def _check_labels(self, split, where, info, labels):
        """The label counts are said (a line with verbose, a DataWarning when no image has a label);
        training on a split without any label needs allow_empty_labels."""
        n, labeled, empty, missing = info["n"], info["labeled"], info["empty"], info["missing_labels"]
        counts = "%d images: %d with labels, %d empty, %d without a label file" % (n, labeled, empty, missing)
        if labeled == 0:
            looked = labels[0] if labels and isinstance(labels[0], str) else None
            hint = " (labels are looked for as %s)" % looked if looked else ""
            if split == "train" and not self.allow_empty_labels:
                raise ValueError("%s %s: no labels found, %s%s; pass allow_empty_labels=True to train on "
                                 "background images only" % (split, where, counts, hint))
            if self._says():
                warnings.warn("%s %s: no labels found, %s%s" % (split, where, counts, hint), DataWarning, stacklevel=4)
        elif self.verbose and self._says():
            log.info("%s %s: %s", split, where, counts)

    def shapes(self, split):
        """Original (h, w) of the usable images of a split, in dataset order."""
        return np.asarray(self._loader(split).info["shapes"])


def image_batches(paths, imgsz=640, batch_size=16, workers=2):
    """Letterboxed ``imgsz`` x ``imgsz`` batches of image files, for prediction: yields :class:`Batch`
    objects (``targets`` empty, ``meta`` maps boxes back to each file, ``indices`` index ``paths``).
    Unreadable or corrupt files are reported as :class:`DataWarning` and left out."""
    paths = [os.fspath(p) for p in paths]
    if not paths:
        raise ValueError("paths: no image given")
    if not isinstance(imgsz, int) or imgsz < 32 or imgsz % 32:
        raise ValueError("imgsz: expected a positive multiple of 32, got %r" % (imgsz,))
    for p in paths:
        if not os.path.isfile(p):
            raise FileNotFoundError("image %s does not exist" % p)
    # a label path that cannot exist: prediction ignores any labels next to the images
    nolabel = os.path.join(os.sep, "nonexistent-ptl-labels", "none.txt")
    c, info = _C.data_loader(
        paths, [nolabel] * len(paths), nc=1, imgsz=(imgsz, imgsz), batch=batch_size, workers=workers, train=False,
        rect=False, cache=0, persistent=False, prefetch=0, seed=0, mosaic=0.0, degrees=0.0, translate=0.0,
        scale=0.0, shear=0.0, perspective=0.0, hsv_h=0.0, hsv_s=0.0, hsv_v=0.0, flipud=0.0, fliplr=0.0,
        pinned=False)
    for msg in info["log"]:
        warnings.warn(msg, DataWarning, stacklevel=2)
    if c is None:
        raise ValueError("paths: none of the %d images is readable (see the warnings)" % len(paths))
    # dataset indices count the usable files, which keep the order of `paths`: map them back
    position, j = [], 0
    for f in info["files"]:
        while paths[j] != f:
            j += 1
        position.append(j)
        j += 1
    c.start(0, False)
    reported = 0
    while True:
        out = c.next()
        new = c.problems(reported)
        reported += len(new)
        for msg in new:
            warnings.warn(msg, DataWarning, stacklevel=2)
        if out is None:
            return
        batch = Batch(*out)
        keep = batch.sources == batch.indices  # a file that failed to decode has no result
        if not keep.all():
            batch = Batch(batch.images[keep], np.zeros((0, 6), np.float32), batch.indices[keep], batch.meta[keep],
                          batch.epoch, batch.batch, batch.sources[keep])
            if len(batch) == 0:
                continue
        batch.indices = np.asarray([position[i] for i in batch.indices], np.int64)
        yield batch
