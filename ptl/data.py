"""Detection datasets: ``data.yaml`` parsing, file lists, and the C loader (``ptl._C.data_loader``).

A ``data.yaml`` has ``path`` (dataset root; relative paths are resolved against the yaml's folder),
``train`` and ``val`` (each a folder of images, a ``.txt`` list of image paths, a single image, or a list of
those, relative to ``path``) and ``names`` (a list or an ``{id: name}`` mapping; ``nc`` optional). Labels
are found by replacing the last ``/images/`` folder of an image path with ``/labels/`` and its extension
with ``.txt``; a missing label file means an image without objects.

Batches come out of the loaders as :class:`Batch` objects holding NumPy arrays:

- ``images``: uint8 ``(N, H, W, 3)`` RGB, channels last, viewing one slot of the loader's ring (page-
  locked host memory when CUDA is usable). The slot returns to the ring when the last reference to the
  array (or to a view of it) goes away. The ring has ``prefetch`` slots (default
  ``max(3, workers // batch + 3)``); holding every slot makes the next request raise instead of hang.
- ``targets``: float32 ``(T, 6)`` rows ``(image index in batch, class, cx, cy, w, h)``, normalised to the
  batch's image size.
- ``indices``: int64 ``(N,)`` dataset index of each image (validation order is sorted by aspect ratio).
- ``meta``: float64 ``(N, 6)`` ``(h0, w0, gain_y, gain_x, pad_left, pad_top)``: a box ``x`` in the batch
  image maps back to the original file as ``(x - pad_left) / gain_x`` (validation).

``Batch.upload(dst, staging)`` copies the images to ``dst``'s device asynchronously and writes
``images / 255`` there in ``dst``'s dtype (float32, bfloat16, float16); ``staging`` is a uint8 CUDA
tensor of at least ``images.size`` elements (not needed for CPU tensors).

Every sample's augmentation is a pure function of ``(seed, epoch, dataset index)``: the bytes do not
depend on ``workers``, ``cache`` or ``persistent_workers``. Mosaic partners are drawn uniformly from the
whole dataset (Ultralytics draws them from a buffer of recently loaded images when there is no cache, which
depends on timing).
"""
import os
import sys
import warnings

import numpy as np

from . import _C

IMG_FORMATS = {"bmp", "dng", "jpeg", "jpg", "mpo", "png", "tif", "tiff", "webp", "pfm", "heic"}

__all__ = ["Batch", "DataWarning", "DetectionData", "image_files", "label_path", "read_data_yaml"]


class DataWarning(UserWarning):
    """A dataset problem: a skipped image or a fixed label file (the message names file and line)."""


def label_path(image):
    """The label file of an image: last ``/images/`` -> ``/labels/``, extension -> ``.txt``."""
    sa, sb = os.sep + "images" + os.sep, os.sep + "labels" + os.sep
    return sb.join(image.rsplit(sa, 1)).rsplit(".", 1)[0] + ".txt"


def _is_image(p):
    return p.rpartition(".")[-1].lower() in IMG_FORMATS


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
            cfg = yaml.safe_load(f) or {}
        if not isinstance(cfg, dict):
            raise ValueError("%s: expected a mapping with keys path, train, val, names" % where)
        base = os.path.dirname(os.path.abspath(where))
    root = cfg.get("path") or "."
    root = os.path.normpath(root if os.path.isabs(str(root)) else os.path.join(base, str(root)))
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
    else:
        raise ValueError("%s: missing 'names' (a list or an {id: name} mapping)" % where)
    nc = int(cfg.get("nc", len(names)))
    if nc != len(names) or nc <= 0:
        raise ValueError("%s: nc=%d but %d names" % (where, nc, len(names)))
    for key in ("train", "val"):
        if key not in cfg or cfg[key] is None:
            raise ValueError("%s: missing '%s'" % (where, key))
    return {"path": root, "train": cfg["train"], "val": cfg["val"], "names": names, "nc": nc, "yaml": where}


class Batch:
    """One batch (see the module documentation for the arrays)."""

    __slots__ = ("images", "targets", "indices", "meta", "epoch", "batch")

    def __init__(self, images, targets, indices, meta, epoch, batch):
        self.images, self.targets, self.indices, self.meta = images, targets, indices, meta
        self.epoch, self.batch = epoch, batch

    def __len__(self):
        return self.images.shape[0]

    def upload(self, dst, staging=None):
        """Asynchronously copy the images to dst's device and normalise them into dst (N, H, W, 3)."""
        _C.data_upload(self.images, dst, staging)


class Loader:
    """Iterating yields the batches of the data module's current epoch (``DetectionData.set_epoch``)."""

    def __init__(self, owner, split, c_loader, info, train):
        self._owner, self.split, self._c, self.info, self.train = owner, split, c_loader, info, train

    def __len__(self):
        return self._c.num_batches()

    @property
    def num_images(self):
        return self.info["n"]

    def __iter__(self):
        epoch = self._owner.epoch
        self._c.start(epoch, self._owner.mosaic_enabled(epoch) if self.train else False)
        while True:
            out = self._c.next()
            if out is None:
                return
            yield Batch(*out)

    def sample(self, index, epoch=None, mosaic=None):
        """One sample built in the calling thread: (image (H, W, 3) uint8, targets (k, 5) float32
        (class, cx, cy, w, h normalised), meta (6,) float64)."""
        epoch = self._owner.epoch if epoch is None else epoch
        if mosaic is None:
            mosaic = self._owner.mosaic_enabled(epoch) if self.train else False
        return self._c.sample(epoch, index, bool(mosaic))

    def cache_info(self):
        """(bytes the RAM cache needs, bytes cached so far)."""
        return self._c.cache_info()


class DetectionData:
    """A YOLO detection dataset and its train/val loaders (augmentation defaults: spec §10)."""

    def __init__(self, data, imgsz=640, batch_size=16, workers=8, cache=None, persistent_workers=True, seed=0,
                 *, epochs=None, close_mosaic=10, mosaic=1.0, degrees=0.0, translate=0.1, scale=0.5, shear=0.0,
                 perspective=0.0, hsv_h=0.015, hsv_s=0.7, hsv_v=0.4, flipud=0.0, fliplr=0.5,
                 val_batch_size=None, rect_val=True, prefetch=None, pin_memory=None, verbose=True):
        if cache not in (None, False, "ram"):
            raise ValueError("cache: expected None or 'ram', got %r" % (cache,))
        if not isinstance(imgsz, int) or imgsz < 32 or imgsz % 32:
            raise ValueError("imgsz: expected a positive multiple of 32, got %r" % (imgsz,))
        if not isinstance(batch_size, int) or batch_size < 1:
            raise ValueError("batch_size: expected an int >= 1, got %r" % (batch_size,))
        if not isinstance(workers, int) or not 0 <= workers <= 256:
            raise ValueError("workers: expected an int in [0, 256], got %r" % (workers,))
        for name, v, lo, hi in (("mosaic", mosaic, 0, 1), ("fliplr", fliplr, 0, 1), ("flipud", flipud, 0, 1),
                                ("scale", scale, 0, 0.999), ("translate", translate, 0, 1),
                                ("degrees", degrees, 0, 360), ("shear", shear, 0, 89), ("hsv_h", hsv_h, 0, 1),
                                ("hsv_s", hsv_s, 0, 1), ("hsv_v", hsv_v, 0, 1), ("perspective", perspective, 0, 0.1)):
            if not lo <= float(v) <= hi:
                raise ValueError("%s: expected a value in [%g, %g], got %r" % (name, lo, hi, v))
        self.cfg = read_data_yaml(data)
        self.names = self.cfg["names"]
        self.num_classes = self.cfg["nc"]
        self.imgsz, self.batch_size, self.workers = imgsz, batch_size, workers
        self.val_batch_size = val_batch_size or 2 * batch_size
        self.cache = "ram" if cache == "ram" else None
        self.persistent_workers = bool(persistent_workers)
        self.seed = int(seed)
        self.epochs, self.close_mosaic = epochs, int(close_mosaic)
        self.hyp = dict(mosaic=mosaic, degrees=degrees, translate=translate, scale=scale, shear=shear,
                        perspective=perspective, hsv_h=hsv_h, hsv_s=hsv_s, hsv_v=hsv_v, flipud=flipud,
                        fliplr=fliplr)
        self.rect_val, self.prefetch, self.verbose = bool(rect_val), prefetch, verbose
        if pin_memory is None:
            from . import cuda
            pin_memory = cuda.is_available()
        self.pin_memory = bool(pin_memory)
        self.epoch = 0
        self.problems = []
        self._loaders = {}

    # -- epochs -------------------------------------------------------------------------------------
    def set_epoch(self, epoch):
        if not isinstance(epoch, int) or epoch < 0:
            raise ValueError("epoch: expected an int >= 0, got %r" % (epoch,))
        self.epoch = epoch

    def mosaic_enabled(self, epoch=None):
        """Mosaic is used unless it is off or ``epoch >= epochs - close_mosaic`` (spec §7.10)."""
        epoch = self.epoch if epoch is None else epoch
        if self.hyp["mosaic"] <= 0:
            return False
        if self.epochs is not None and self.close_mosaic > 0 and epoch >= self.epochs - self.close_mosaic:
            return False
        return True

    # -- loaders ------------------------------------------------------------------------------------
    def train_loader(self):
        return self._loader("train")

    def val_loader(self):
        return self._loader("val")

    def __len__(self):
        return len(self.train_loader())

    def files(self, split):
        return image_files(self.cfg[split], self.cfg["path"])

    def _loader(self, split):
        if split in self._loaders:
            return self._loaders[split]
        images = self.files(split)
        labels = [label_path(p) for p in images]
        train = split == "train"
        h = self.hyp
        c, info = _C.data_loader(
            images, labels, nc=self.num_classes, imgsz=self.imgsz,
            batch=self.batch_size if train else self.val_batch_size, workers=self.workers, train=train,
            rect=self.rect_val, cache=self.cache == "ram", persistent=self.persistent_workers,
            prefetch=self.prefetch or 0, seed=self.seed & 0xFFFFFFFFFFFFFFFF, mosaic=h["mosaic"],
            degrees=h["degrees"], translate=h["translate"], scale=h["scale"], shear=h["shear"],
            perspective=h["perspective"], hsv_h=h["hsv_h"], hsv_s=h["hsv_s"], hsv_v=h["hsv_v"],
            flipud=h["flipud"], fliplr=h["fliplr"], pinned=self.pin_memory)
        for msg in info["log"]:
            warnings.warn(msg, DataWarning, stacklevel=3)
        self.problems += info["log"]
        where = self.cfg[split]
        if info["skipped"] or info["duplicates"]:
            warnings.warn("%s %s: %d images, %d skipped, %d duplicate label rows removed"
                          % (split, where, info["n"], info["skipped"], info["duplicates"]), DataWarning,
                          stacklevel=3)
        if c is None:
            raise ValueError("%s %s: none of the %d images is usable (see the warnings)"
                             % (split, os.path.join(self.cfg["path"], str(where)), len(images)))
        loader = Loader(self, split, c, info, train)
        if self.cache == "ram":
            need, _ = c.cache_info()
            if self.verbose:
                print("ptl.data: caching %d %s images in RAM (%.2f GB)" % (info["n"], split, need / 1e9),
                      file=sys.stderr)
            c.fill_cache()
        self._loaders[split] = loader
        return loader

    def shapes(self, split):
        """Original (h, w) of the usable images of a split, in dataset order."""
        return np.asarray(self._loader(split).info["shapes"])


def image_batches(paths, imgsz=640, batch_size=16, workers=2):
    """Letterboxed ``imgsz`` x ``imgsz`` batches of image files, for prediction: yields :class:`Batch`
    objects (``targets`` empty, ``meta`` maps boxes back to each file, ``indices`` index ``paths``).
    Unreadable or corrupt files are reported as :class:`DataWarning` and skipped."""
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
        paths, [nolabel] * len(paths), nc=1, imgsz=imgsz, batch=batch_size, workers=workers, train=False,
        rect=False, cache=False, persistent=False, prefetch=0, seed=0, mosaic=0.0, degrees=0.0, translate=0.0,
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
    while True:
        out = c.next()
        if out is None:
            return
        batch = Batch(*out)
        batch.indices = np.asarray([position[i] for i in batch.indices], np.int64)
        yield batch
