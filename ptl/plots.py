"""The run folder's pictures, named as Ultralytics names them, written by the :class:`Plots` callback
(installed by ``Trainer(plots=True)`` whenever the fit has a run folder):

* at the end of the fit's first epoch: ``labels.jpg`` (instances per class, box centres, box sizes, box
  outlines of the training labels) and ``train_batch0.jpg`` .. ``train_batch2.jpg`` (the fit's first
  three augmented batches with their boxes: the check that labels and augmentation agree);
* at the end of the fit, from its last validation: ``confusion_matrix.png``,
  ``confusion_matrix_normalized.png`` (columns normalised: the share of each true class predicted as
  each class, background last), ``BoxPR_curve.png``, ``BoxP_curve.png``, ``BoxR_curve.png``,
  ``BoxF1_curve.png``, ``val_batch0_labels.jpg`` / ``val_batch0_pred.jpg`` (its first batch with the
  ground truth / the predictions scoring at least 0.25), and ``results.png`` (every loss and metric
  column of ``results.csv``; also written when the fit fails).

matplotlib (and its Pillow) are the optional extra ``ptl[plot]``; without them one notice is printed and
no picture is made. Pictures are drawn in the trainer's process between steps, from copies of the
batches, and never change what the fit computes; each file is written atomically. A picture that cannot
be written gives a warning, not a failed fit.
"""
import colorsys
import csv
import os
import sys
import warnings

import numpy as np

from .callbacks import Callback
from .metrics import smooth
from .runlog import atomic_path

__all__ = ["Plots", "available", "plot_results", "plot_confusion_matrix", "plot_pr_curve", "plot_mc_curve",
           "plot_labels", "plot_batch"]

MAX_TILES = 16      # images per batch picture
MAX_SIDE = 1920     # pixels of a batch picture's long side (small images are enlarged up to MAX_UPSCALE)
MAX_UPSCALE = 4
PRED_CONF = 0.25    # predictions drawn in val_batch*_pred.jpg
TRAIN_BATCHES = 3   # train_batch0..2.jpg
DPI = 120           # of the matplotlib figures (a 9 x 6 inch curve: 1080 x 720 pixels)
_notice = {"given": False}


def available():
    """Whether matplotlib and Pillow are importable; prints one notice per process when not."""
    try:
        import matplotlib  # noqa: F401
        import PIL  # noqa: F401
        return True
    except ImportError:
        if not _notice["given"]:
            print("ptl: matplotlib is not installed (pip install 'ptl[plot]'): no plots are made", file=sys.stderr)
            _notice["given"] = True
        return False


def class_color(c):
    """An RGB colour per class: hues spread by the golden ratio, so neighbouring ids differ."""
    r, g, b = colorsys.hsv_to_rgb((c * 0.618033988749895) % 1.0, 0.8, 0.95)
    return int(r * 255), int(g * 255), int(b * 255)


def _figure(figsize, **margins):
    """A matplotlib Figure on its own Agg canvas (pyplot's global state and the user's backend untouched),
    with fixed margins (a layout engine would double the drawing time)."""
    from matplotlib.figure import Figure
    fig = Figure(figsize=figsize)
    fig.subplots_adjust(**margins)
    return fig


def _save_figure(fig, path, dpi):
    fmt = "jpeg" if path.lower().endswith((".jpg", ".jpeg")) else "png"
    with atomic_path(path) as tmp:
        fig.savefig(tmp, dpi=dpi, format=fmt)


def _save_image(img, path):
    with atomic_path(path) as tmp:
        img.save(tmp, format="JPEG", quality=90)


# ---- curves and matrices ------------------------------------------------------------------------------

def plot_results(path, csv_path):
    """``results.png``: one panel per loss and metric column of ``results.csv`` against the epoch (lr
    columns left out), train losses and P/R on top, validation losses and mAP below, as Ultralytics."""
    with open(csv_path, newline="") as f:
        rows = list(csv.DictReader(f))
    if not rows:
        return
    keys = ["train/box_loss", "train/cls_loss", "train/dfl_loss", "metrics/precision(B)", "metrics/recall(B)",
            "val/box_loss", "val/cls_loss", "val/dfl_loss", "metrics/mAP50(B)", "metrics/mAP50-95(B)"]
    keys = [k for k in keys if k in rows[0]]
    from matplotlib.ticker import MaxNLocator
    x = [float(r["epoch"]) for r in rows]
    fig = _figure((15, 6), left=0.04, right=0.99, bottom=0.09, top=0.94, wspace=0.3, hspace=0.45)
    axes = fig.subplots(2, 5, squeeze=False).ravel()
    for ax, k in zip(axes, keys):
        y = [float(r[k]) if r[k] != "" else np.nan for r in rows]
        ax.plot(x, y, marker=".", linewidth=2, markersize=8, color="tab:blue")
        ax.set_title(k, fontsize=12)
        ax.set_xlabel("epoch")
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    for ax in axes[len(keys):]:
        ax.axis("off")
    _save_figure(fig, path, DPI)


def plot_confusion_matrix(path, matrix, names, normalize):
    """``matrix`` (nc + 1, nc + 1) [predicted, true], background last (``DetectionMetrics``'s).
    ``normalize``: each true class's column divided by its sum. Cells under 0.005 are left blank; values
    are written in the cells below 30 classes; class names on the axes below 99."""
    m = np.asarray(matrix, np.float64)
    array = m / (m.sum(0, keepdims=True) + 1e-9) if normalize else m.copy()
    array[array < 0.005] = np.nan
    n = len(array)
    labels = list(names) + ["background"]
    fig = _figure((12, 9), left=0.14, right=0.98, bottom=0.14, top=0.95)
    ax = fig.subplots()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # an all-blank matrix
        im = ax.imshow(array, cmap="Blues", vmin=0.0, interpolation="none")
        if n < 30:
            top = 1.0 if normalize else np.nanmax(array) if np.isfinite(array).any() else 1.0
            for i in range(n):
                for j in range(n):
                    v = array[i, j]
                    if np.isfinite(v):
                        ax.text(j, i, "%.2f" % v if normalize else "%d" % v, ha="center", va="center",
                                fontsize=8, color="white" if v > 0.45 * top else "black")
    if n < 99:
        fs = max(5, 12 - 0.1 * n)
        ax.set_xticks(range(n), labels, rotation=90 if n > 10 else 0, fontsize=fs)
        ax.set_yticks(range(n), labels, fontsize=fs)
    ax.set_xlabel("True")
    ax.set_ylabel("Predicted")
    ax.set_title("Confusion Matrix" + (" Normalized" if normalize else ""))
    fig.colorbar(im, ax=ax, shrink=0.8)
    _save_figure(fig, path, DPI)


_CURVE_MARGINS = dict(left=0.08, right=0.74, bottom=0.09, top=0.94)


def _legend(ax, lines):
    ax.legend(handles=lines, bbox_to_anchor=(1.02, 1), loc="upper left", fontsize=8, frameon=False)


def plot_pr_curve(path, px, pr_curve, ap50, names):
    """``BoxPR_curve.png``: each class's precision envelope at IoU 0.5 against recall (named below 21
    classes, grey above) and their mean, labelled with mAP50."""
    fig = _figure((9, 6), **_CURVE_MARGINS)
    ax = fig.subplots()
    shown = []
    py = np.asarray(pr_curve)
    for k in range(len(py)):
        if len(py) < 21:
            shown += ax.plot(px, py[k], linewidth=1, label="%s %.3f" % (names[k], ap50[k]))
        else:
            ax.plot(px, py[k], linewidth=1, color="grey", alpha=0.5)
    if len(py):
        shown += ax.plot(px, py.mean(0), linewidth=3, color="blue",
                         label="all classes %.3f mAP@0.5" % float(np.mean(ap50)))
    ax.set(xlabel="Recall", ylabel="Precision", xlim=(0, 1), ylim=(0, 1), title="Precision-Recall Curve")
    _legend(ax, shown)
    _save_figure(fig, path, DPI)


def plot_mc_curve(path, px, curves, names, ylabel):
    """``Box{P,R,F1}_curve.png``: a metric against confidence per class and the smoothed mean, labelled
    with its maximum and where it is reached."""
    fig = _figure((9, 6), **_CURVE_MARGINS)
    ax = fig.subplots()
    shown = []
    py = np.asarray(curves)
    for k in range(len(py)):
        if len(py) < 21:
            shown += ax.plot(px, py[k], linewidth=1, label=str(names[k]))
        else:
            ax.plot(px, py[k], linewidth=1, color="grey", alpha=0.5)
    if len(py):
        y = smooth(py.mean(0))  # the F1 curve's maximum is where best_conf was chosen
        shown += ax.plot(px, y, linewidth=3, color="blue",
                         label="all classes %.2f at %.3f" % (y.max(), px[int(y.argmax())]))
    ax.set(xlabel="Confidence", ylabel=ylabel, xlim=(0, 1), ylim=(0, 1), title="%s-Confidence Curve" % ylabel)
    _legend(ax, shown)
    _save_figure(fig, path, DPI)


def plot_labels(path, labels, names, max_outlines=1000):
    """``labels.jpg`` from label rows (cls, cx, cy, w, h), normalised: instances per class, up to
    ``max_outlines`` box outlines centred on one point (sizes at a glance), box centres and box sizes as 2-D
    histograms."""
    from matplotlib.collections import LineCollection
    rows = np.asarray(labels, np.float64).reshape(-1, 5)
    cls = rows[:, 0].astype(np.int64)
    nc = len(names)
    fig = _figure((10, 10), left=0.08, right=0.98, bottom=0.12 if nc < 30 else 0.07, top=0.96, wspace=0.25,
                  hspace=0.3 if nc < 30 else 0.2)
    (a, b), (c, d) = fig.subplots(2, 2)
    counts = np.bincount(cls, minlength=nc)[:nc]
    a.bar(range(nc), counts, color=[tuple(v / 255 for v in class_color(k)) for k in range(nc)])
    a.set_ylabel("instances")
    a.set_title("%d instances, %d classes present" % (len(rows), int((counts > 0).sum())))
    if nc < 30:
        a.set_xticks(range(nc), names, rotation=90, fontsize=8)
    else:
        a.set_xlabel("class")
    sel = rows[:max_outlines]
    segs = [[(0.5 - w / 2, 0.5 - h / 2), (0.5 + w / 2, 0.5 - h / 2), (0.5 + w / 2, 0.5 + h / 2),
             (0.5 - w / 2, 0.5 + h / 2), (0.5 - w / 2, 0.5 - h / 2)] for w, h in sel[:, 3:5]]
    b.add_collection(LineCollection(segs, colors=[tuple(v / 255 for v in class_color(k)) for k in
                                                  sel[:, 0].astype(np.int64)], linewidths=0.6, alpha=0.6))
    b.set(xlim=(0, 1), ylim=(1, 0), aspect="equal", title="box outlines (first %d)" % len(sel))
    for ax, (i, j), (xl, yl) in ((c, (1, 2), ("x", "y")), (d, (3, 4), ("width", "height"))):
        ax.hist2d(rows[:, i], rows[:, j], bins=50, range=[[0, 1], [0, 1]], cmap="Blues", cmin=1)
        ax.set(xlabel=xl, ylabel=yl, xlim=(0, 1), ylim=(0, 1))
    c.invert_yaxis()
    c.set_title("box centres")
    d.set_title("box sizes")
    _save_figure(fig, path, DPI)


# ---- batch pictures -----------------------------------------------------------------------------------

def _font(size):
    from PIL import ImageFont
    try:
        return ImageFont.load_default(size=size)
    except TypeError:  # Pillow < 10.1: one bitmap size
        return ImageFont.load_default()


def plot_batch(path, images, boxes, names, titles=None):
    """A grid of up to 16 images (uint8 (N, H, W, 3)) with boxes drawn: ``boxes`` is a list, one per image,
    of (k, 5) rows (cls, x1, y1, x2, y2) in the image's pixels or (k, 6) rows with a score last (labelled
    ``name 0.87``). ``titles``: a line written on each tile (e.g. its file name)."""
    from PIL import Image, ImageDraw
    imgs = np.asarray(images)[:MAX_TILES]
    n, h, w = imgs.shape[:3]
    cols = int(np.ceil(np.sqrt(n)))
    rows = int(np.ceil(n / cols))
    scale = min(MAX_UPSCALE, MAX_SIDE / max(cols * w, rows * h))
    tw, th = max(1, int(w * scale)), max(1, int(h * scale))
    canvas = Image.new("RGB", (cols * tw, rows * th), (255, 255, 255))
    draw = ImageDraw.Draw(canvas)
    font = _font(max(10, int(th / 28)))
    line = max(1, int(round(th / 320)))
    for k in range(n):
        x0, y0 = (k % cols) * tw, (k // cols) * th
        tile = Image.fromarray(imgs[k])
        canvas.paste(tile.resize((tw, th), Image.BILINEAR) if scale != 1.0 else tile, (x0, y0))
        rows_k = np.asarray(boxes[k], np.float64)
        for r in rows_k.reshape(len(rows_k), -1) if rows_k.size else ():
            c = int(r[0])
            x1, x2 = sorted(min(max(float(v), 0.0), w) * scale for v in (r[1], r[3]))
            y1, y2 = sorted(min(max(float(v), 0.0), h) * scale for v in (r[2], r[4]))
            color = class_color(c)
            draw.rectangle([x0 + x1, y0 + y1, x0 + x2, y0 + y2], outline=color, width=line)
            text = str(names[c]) if 0 <= c < len(names) else str(c)
            if len(r) > 5:
                text += " %.2f" % r[5]
            tx, ty = x0 + x1, max(y0, y0 + y1 - font.size - 2)
            box = draw.textbbox((tx, ty), text, font=font)
            draw.rectangle(box, fill=color)
            draw.text((tx, ty), text, fill=(255, 255, 255), font=font)
        if titles is not None:
            draw.text((x0 + 4, y0 + 2), str(titles[k]), fill=(255, 255, 255), font=font, stroke_width=2,
                      stroke_fill=(0, 0, 0))
        draw.rectangle([x0, y0, x0 + tw - 1, y0 + th - 1], outline=(255, 255, 255), width=2)
    _save_image(canvas, path)


def target_rows(targets, n, h, w):
    """A batch's targets (image index, cls, cx, cy, w, h normalised) as per-image (k, 5) pixel rows
    (cls, x1, y1, x2, y2)."""
    t = np.asarray(targets, np.float64).reshape(-1, 6)
    out = []
    for k in range(n):
        r = t[t[:, 0] == k]
        cx, cy, bw, bh = r[:, 2] * w, r[:, 3] * h, r[:, 4] * w, r[:, 5] * h
        out.append(np.stack([r[:, 1], cx - bw / 2, cy - bh / 2, cx + bw / 2, cy + bh / 2], 1))
    return out


def prediction_rows(dets, conf=PRED_CONF):
    """Detections (n, 6) x1, y1, x2, y2, score, class per image as (k, 6) rows (cls, x1, y1, x2, y2,
    score) of the scores >= conf."""
    out = []
    for d in dets:
        d = np.asarray(d, np.float64).reshape(-1, 6)
        d = d[d[:, 4] >= conf]
        out.append(np.concatenate([d[:, 5:6], d[:, :4], d[:, 4:5]], 1))
    return out


# ---- the callback -------------------------------------------------------------------------------------

class Plots(Callback):
    """Writes the pictures of the module doc into the fit's run folder (rank 0; only when the trainer has a
    logger, hence a run folder). ``train_batches``: how many of the first training batches are drawn."""

    def __init__(self, train_batches=TRAIN_BATCHES):
        self.train_batches = int(train_batches)
        self._active = False

    def setup(self, trainer, pl_module, stage):
        self._active = (stage == "fit" and bool(getattr(trainer, "loggers", None))
                        and getattr(trainer, "is_global_zero", True) and available())
        self._train, self._train_written, self._val = [], False, None

    @staticmethod
    def _write(trainer, name, fn, *args):
        path = os.path.join(trainer.log_dir, name)
        try:
            fn(path, *args)
        except Exception as exc:  # a picture is never worth the fit
            warnings.warn("ptl.plots: %s not written: %s: %s" % (path, type(exc).__name__, exc), UserWarning)

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        if self._active and not self._train_written and len(self._train) < self.train_batches:
            self._train.append((np.array(batch.images[:MAX_TILES]), np.array(batch.targets)))

    def on_train_epoch_end(self, trainer, pl_module):
        if not self._active or self._train_written:
            return
        self._train_written = True
        names = trainer.datamodule.names
        for k, (images, targets) in enumerate(self._train):
            n, h, w = images.shape[:3]
            self._write(trainer, "train_batch%d.jpg" % k, plot_batch, images, target_rows(targets, n, h, w), names)
        self._train = []
        labels = trainer.datamodule.train_loader().info["labels"]
        self._write(trainer, "labels.jpg", plot_labels, labels[:, 1:], names)

    def on_validation_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        if self._active and batch_idx == 0 and outputs is not None:
            files = trainer.datamodule.val_loader().info["files"]
            self._val = (np.array(batch.images[:MAX_TILES]), np.array(batch.targets),
                         [np.array(d) for d in outputs[:MAX_TILES]],
                         [os.path.basename(files[i]) for i in batch.sources[:MAX_TILES]])

    def on_fit_end(self, trainer, pl_module):
        if not self._active:
            return
        names = trainer.datamodule.names
        res = getattr(trainer._engine, "last_results", None)
        if res is not None:
            shown = [names[int(c)] for c in res["classes"]]
            if "confusion_matrix" in res:
                for file, normalize in (("confusion_matrix.png", False), ("confusion_matrix_normalized.png", True)):
                    self._write(trainer, file, plot_confusion_matrix, res["confusion_matrix"], names, normalize)
            self._write(trainer, "BoxPR_curve.png", plot_pr_curve, res["px"], res["pr_curve"], res["ap50"], shown)
            for key, label, file in (("p_curve", "Precision", "BoxP_curve.png"), ("r_curve", "Recall",
                                     "BoxR_curve.png"), ("f1_curve", "F1", "BoxF1_curve.png")):
                self._write(trainer, file, plot_mc_curve, res["px"], res[key], shown, label)
        if self._val is not None:
            images, targets, dets, files = self._val
            n, h, w = images.shape[:3]
            for file, boxes in (("val_batch0_labels.jpg", target_rows(targets, n, h, w)),
                                ("val_batch0_pred.jpg", prediction_rows(dets))):
                self._write(trainer, file, plot_batch, images, boxes, names, files)
        self._results_png(trainer)

    def on_exception(self, trainer, pl_module, exception):
        if self._active:
            self._results_png(trainer)

    def _results_png(self, trainer):
        csv_path = os.path.join(trainer.log_dir, "results.csv")
        if os.path.exists(csv_path):
            self._write(trainer, "results.png", plot_results, csv_path)
