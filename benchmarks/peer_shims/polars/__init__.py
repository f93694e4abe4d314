"""A stand-in for the one polars call Ultralytics' trainer makes on its training path (reading its own
results.csv when it saves a checkpoint), for GPU machines where the real polars wheel (54 MB) does not
fit the device tool's 64 MiB transfer beside coco256. Benchmark harness only: put it on PYTHONPATH
after the carried wheels, and only when polars itself is absent."""
import csv
import io


class _Frame:
    def __init__(self, columns):
        self._columns = columns

    def to_dict(self, as_series=True):
        return {k: list(v) for k, v in self._columns.items()}


def _number(text):
    try:
        return float(text)
    except ValueError:
        return text


def read_csv(source, infer_schema_length=None):
    text = source.decode() if isinstance(source, (bytes, bytearray)) else open(source).read()
    rows = list(csv.reader(io.StringIO(text)))
    if not rows:
        return _Frame({})
    head = [h.strip() for h in rows[0]]
    return _Frame({h: [_number(r[i].strip()) for r in rows[1:]] for i, h in enumerate(head)})
