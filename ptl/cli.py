"""The ``ptl`` command: ``ptl train``, ``ptl val``, ``ptl predict``, ``ptl export`` (also ``python -m ptl``).

Each sub-command is the module's own command line (``python -m ptl.train``, ``ptl.predict``,
``ptl.export``; ``val`` is :func:`ptl.train.val_main`), and each takes its options in either form:
``--imgsz 640`` or Ultralytics' ``imgsz=640``::

    ptl train data=coco256/data.yaml model=yolo26n epochs=3 imgsz=640 device=0
    ptl train cfg=runs/train/version_0/args.yaml          # the run again
    ptl val data=coco256/data.yaml model=runs/train/version_0/weights/best.safetensors
    ptl predict model=best.safetensors source=images/ save_txt=true
    ptl export model=best.safetensors imgsz=640 half=true
"""
import sys

from ._version import __version__

USAGE = """usage: ptl {train,val,predict,export} [options | key=value ...]

  train    train a detector (ptl train --help lists every option)
  val      validate a model on a dataset's val split
  predict  detect objects in images (annotated images, YOLO label files)
  export   write an ONNX model

Options take either form: --imgsz 640 or imgsz=640; cfg=args.yaml reads a run's arguments."""


def _predict(argv, prog):
    from . import predict
    from .train import normalize
    return predict.main(normalize(argv, predict.build_parser(prog)), prog)


def _export(argv, prog):
    from . import export
    from .train import normalize
    return export.main(normalize(argv, export.build_parser(prog)), prog)


def _train(argv, prog):
    from .train import main
    return main(argv, prog)


def _val(argv, prog):
    from .train import val_main
    return val_main(argv, prog)


COMMANDS = {"train": _train, "val": _val, "predict": _predict, "export": _export}


def main(argv=None):
    """Runs ``ptl <command> ...``; returns the exit status (0 done, 2 a user error: one line on stderr)."""
    from .errors import ConfigError
    argv = sys.argv[1:] if argv is None else list(argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(USAGE, file=sys.stdout if argv else sys.stderr)
        return 0 if argv else 2
    if argv[0] in ("-V", "--version"):
        print("ptl %s" % __version__)
        return 0
    command = COMMANDS.get(argv[0])
    if command is None:
        print("ptl: error: unknown command %r (expected train, val, predict or export)" % argv[0], file=sys.stderr)
        return 2
    prog = "ptl " + argv[0]
    try:
        return command(argv[1:], prog)
    except ConfigError as exc:  # an unknown key=value of predict / export
        print("%s: error: %s" % (prog, " ".join(str(exc).split())), file=sys.stderr)
        return 2
    except SystemExit as exc:  # argparse: --help (0) or its own one-line errors (2)
        return exc.code if isinstance(exc.code, int) else 2


if __name__ == "__main__":
    sys.exit(main())
