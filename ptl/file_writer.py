"""Files written by a background thread while training goes on (ModelCheckpoint's checkpoints and weights).

The caller takes the state on its own thread (copies, so training may change the live buffers at once) and
submits the write; one thread runs the jobs in submission order, so a file that replaces another is written
before the other is removed. A job that fails keeps its exception: the jobs queued after it are dropped (a
removal must not follow a write that did not happen) and the next ``submit``, ``wait`` or ``close`` raises
it, so a failed write is never silent. The writes themselves are atomic (``ptl.io.save_safetensors``): a
job cut short, by an error or a killed process, leaves the previous file whole.
"""
import collections
import threading


class BackgroundWriter:
    def __init__(self, name="ptl-file-writer"):
        self._name = name
        self._jobs = collections.deque()
        self._cv = threading.Condition()
        self._thread = None
        self._running = False  # a job is being run now
        self._error = None
        self._stop = False

    def submit(self, fn, *args):
        """Queues ``fn(*args)``; first raises the exception of an earlier job, if one failed."""
        self._raise_error()
        with self._cv:
            self._jobs.append((fn, args))
            if self._thread is None:
                self._stop = False
                self._thread = threading.Thread(target=self._run, name=self._name, daemon=True)
                self._thread.start()
            self._cv.notify_all()

    def wait(self):
        """Blocks until every queued job has run; raises the exception of a failed one."""
        with self._cv:
            while self._jobs or self._running:
                self._cv.wait()
        self._raise_error()

    def close(self):
        """wait(), then ends the thread (a later submit starts another); the thread ends even when a job failed."""
        try:
            self.wait()
        finally:
            with self._cv:
                thread, self._thread, self._stop = self._thread, None, True
                self._cv.notify_all()
            if thread is not None:
                thread.join()

    def _raise_error(self):
        with self._cv:
            error, self._error = self._error, None
        if error is not None:
            raise error

    def _run(self):
        while True:
            with self._cv:
                while not self._jobs and not self._stop:
                    self._cv.wait()
                if not self._jobs:
                    return
                fn, args = self._jobs.popleft()
                self._running = True
            try:
                fn(*args)
            except BaseException as exc:  # kept for the caller's thread, which raises it
                with self._cv:
                    self._error = exc
                    self._jobs.clear()
            finally:
                with self._cv:
                    self._running = False
                    self._cv.notify_all()
