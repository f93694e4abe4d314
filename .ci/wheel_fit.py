"""What .ci/wheel_test.sh runs with the installed wheel (and tests/test_packaging.py with the source tree):
import ptl, check the CUDA queries of a machine without GPU, fit one tiny CPU epoch, print the digests.

    python wheel_fit.py DATA_YAML OUT_DIR [--installed-under DIR] [--expect-no-cuda-libraries]

The last line printed is a JSON object: ptl's file, version, the CUDA-library outcome and the fit's
digests (the same fit from the source tree must give the same digests).
"""
import json
import os
import sys

import ptl


def cuda_libraries(expect_missing):
    """'found: ...' or 'missing: <message>'; with expect_missing the libraries must be absent and the
    message must name the library and the extra that provides it."""
    try:
        found = ptl.cuda.libraries()
    except ptl.CudaError as e:
        msg = str(e)
        for part in ("cuBLASLt", "pip install ptl[cuda]"):
            if part not in msg:
                raise AssertionError("the CudaError for missing CUDA libraries lacks %r: %s" % (part, msg))
        return "missing: " + msg
    except ValueError as e:  # a CPU-only build
        return "cpu-only build: %s" % e
    if expect_missing:
        raise AssertionError("CUDA libraries were expected to be hidden, yet found: %s" % found)
    return "found: %s" % found


def main():
    data_yaml, out_dir, opts = sys.argv[1], sys.argv[2], sys.argv[3:]
    expect_missing = "--expect-no-cuda-libraries" in opts
    if "--installed-under" in opts:
        prefix = os.path.realpath(opts[opts.index("--installed-under") + 1])
        if not os.path.realpath(ptl.__file__).startswith(prefix + os.sep):
            raise AssertionError("imported %s, not the ptl installed under %s" % (ptl.__file__, prefix))
    if ptl.cuda.is_available() is not False:
        raise AssertionError("ptl.cuda.is_available() on a machine without GPU: %r" % (ptl.cuda.is_available(),))
    libs = cuda_libraries(expect_missing)
    data = ptl.DetectionData(data_yaml, imgsz=64, batch_size=4, workers=1)
    model = ptl.Detector("yolo26n", num_classes=data.num_classes)
    trainer = ptl.Trainer(max_epochs=1, limit_train_batches=3, limit_val_batches=1, accelerator="cpu",
                          enable_progress_bar=False, default_root_dir=out_dir, seed=0)
    trainer.fit(model, data)
    print(json.dumps({"ptl": ptl.__file__, "version": ptl.__version__, "cuda_libraries": libs,
                      "digest": trainer.digest()}))


if __name__ == "__main__":
    main()
