"""Files written by a background thread while training goes on (ModelCheckpoint's checkpoints and weights).

The caller takes the state on its own thread (copies, so training may change the live buffers at once) and
submits the write; one thread runs the jobs in submission order, so a file that replaces another is written
before the other is removed. A job that fails keeps its exception: the jobs queued after it are dropped (a
removal must not follow a write that did not happen) and the next ``submit`` or ``wait`` raises it, so a
failed write is never silent. The writes themselves are atomic (``ptl.io.save_safetensors``): a job cut
short, by an error or a killed process, leaves the previous file whole. The thread ends when the queue is
empty, so an idle writer holds none.
"""
import collections
import threading


class BackgroundWriter:
    """Runs submitted jobs in order on a thread of its own, which exists only while there are jobs."""

    def __init__(self, name="ptl-file-writer"):
        self._name = name
        self._jobs = collections.deque()
        self._cv = threading.Condition()
        self._thread = None  # the thread running the jobs, None when idle
        self._error = None

    def submit(self, fn, *args):
        """Queues ``fn(*args)``; first raises the exception of an earlier job, if one failed."""
        self._raise_error()
        with self._cv:
            self._jobs.append((fn, args))
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name=self._name, daemon=True)
                self._thread.start()

    def wait(self):
        """Blocks until every queued job has run and the thread has ended; raises a failed job's exception."""
        with self._cv:
            thread = self._thread
            while self._thread is not None:
                self._cv.wait()
        if thread is not None:
            thread.join()
        self._raise_error()

    def _raise_error(self):
        with self._cv:
            error, self._error = self._error, None
        if error is not None:
            raise error

    def _run(self):
        while True:
            with self._cv:
                if not self._jobs:
                    self._thread = None
                    self._cv.notify_all()
                    return
                fn, args = self._jobs.popleft()
            try:
                fn(*args)
            except BaseException as exc:  # kept for the caller's thread, which raises it
                with self._cv:
                    self._error = exc
                    self._jobs.clear()
