"""Run small pure functions in persistent worker processes, each call under a hard wall-clock deadline.

math-verify can hang on hostile LaTeX and its own timeout (`signal.alarm`) works only in the main thread, so each
call runs in a worker process that is killed (SIGKILL) when it overruns: the deadline holds from any thread. Workers
are fresh interpreters (`sys.executable -c`), neither forks of the trainer nor multiprocessing's spawn (which
re-imports the trainer's `__main__`, and torch), and import only this file and their job modules. They persist
across calls and take one call at a time, its deadline running from when it is sent; messages are length-prefixed
pickles over their stdin/stdout. Outcomes are reported, never raised; only workers that cannot start at all raise
WorkerStartError.
"""

from __future__ import annotations

import importlib
import logging
import os
import pickle
import selectors
import struct
import subprocess
import sys
import threading
import time
import weakref
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Callable

logger = logging.getLogger(__name__)

_HEADER = struct.Struct("!I")  # payload length, network byte order
# The repository root, put on a worker's path: job modules are named as packages ("grading.grader").
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_READ_CHUNK = 1 << 16
_MAX_START_FAILURES = 3  # workers in a row dying before "ready": the environment is broken, so raise
_STARTUP_TIMEOUT_S = 120.0


class WorkerStartError(RuntimeError):
    """Worker processes keep dying before they are ready: the environment is broken, not the input."""


@dataclass(frozen=True)
class Outcome:
    """What became of one call: status "ok", "error" (the job raised), "timeout" (killed at the deadline) or
    "crash" (the worker died during the call)."""

    status: str
    value: Any = None  # the return value ("ok") or the error message ("error")
    seconds: float = 0.0  # wall time from sending the call to its outcome


def _frame(obj: object) -> bytes:
    data = pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
    return _HEADER.pack(len(data)) + data


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


class _Worker:
    """One worker process as the parent sees it."""

    def __init__(self, modules: tuple[str, ...]) -> None:
        code = (f"import sys; sys.path.insert(0, {ROOT!r}); "
                f"from grading import deadline; deadline.worker_main({modules!r})")
        self.proc = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE)
        self.fd_out = self.proc.stdout.fileno()  # type: ignore[union-attr]  # results arrive here
        self.fd_in = self.proc.stdin.fileno()  # type: ignore[union-attr]  # calls are sent here
        os.set_blocking(self.fd_out, False)
        self.buffer = bytearray()
        self.ready = False
        self.started_at = time.monotonic()
        self.call: int | None = None  # index of the call in flight
        self.sent_at = 0.0

    def read_messages(self) -> tuple[list[Any], bool]:
        """Drain the pipe; return the complete messages and whether the worker has closed it (died)."""
        eof = False
        try:
            while chunk := os.read(self.fd_out, _READ_CHUNK):
                self.buffer += chunk
            eof = True  # an empty read: the worker closed its end
        except BlockingIOError:
            pass  # nothing more to read for now
        messages = []
        while len(self.buffer) >= _HEADER.size:
            end = _HEADER.size + _HEADER.unpack_from(self.buffer)[0]
            if len(self.buffer) < end:
                break
            messages.append(pickle.loads(bytes(self.buffer[_HEADER.size : end])))
            del self.buffer[:end]
        return messages, eof

    def stop(self, grace_s: float = 0.0) -> None:
        """Close its stdin (at EOF a worker exits), wait up to `grace_s` seconds, then kill it if it lives."""
        try:
            self.proc.stdin.close()  # type: ignore[union-attr]
        except OSError:
            pass  # broken pipe: the worker is gone already
        try:
            self.proc.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.proc.stdout.close()  # type: ignore[union-attr]


def _shutdown(workers: list[_Worker]) -> None:
    for worker in workers:
        worker.stop(grace_s=1.0)
    workers.clear()


class DeadlinePool:
    """A persistent pool of worker processes running `WORKER_JOBS[name](*args)` under a deadline.

    Each worker imports `modules` (one name or several) in order, runs each one's `warm_up()` if it has one, and
    merges their `WORKER_JOBS` dicts. `run` may be called from any thread; calls are serialised.
    Differs from CANOE (docs/differences.md, D3): symbolic grading runs under a hard deadline in worker processes.
    """

    def __init__(self, modules: str | Sequence[str], workers: int = 2, deadline_s: float = 1.0):
        if workers < 1:
            raise ValueError(f"workers must be >= 1, got {workers}")
        if deadline_s <= 0:
            raise ValueError(f"deadline_s must be > 0, got {deadline_s}")
        self.modules = (modules,) if isinstance(modules, str) else tuple(modules)
        self.deadline_s = deadline_s
        self._size = workers
        self._lock = threading.Lock()
        self._selector = selectors.DefaultSelector()
        self._workers: list[_Worker] = []
        self._start_failures = 0
        self._closed = False
        # Kills the workers when the pool is garbage-collected or the interpreter exits without close().
        self._finalizer = weakref.finalize(self, _shutdown, self._workers)
        self._top_up()  # the workers import in the background while the caller goes on

    def _top_up(self) -> None:
        while len(self._workers) < self._size:  # after a WorkerStartError the pool may be short
            worker = _Worker(self.modules)
            self._workers.append(worker)
            self._selector.register(worker.fd_out, selectors.EVENT_READ, worker)

    def _retire(self, worker: _Worker, replace: bool = True) -> None:
        """Kill a worker and, unless told not to or closed, start its replacement."""
        self._selector.unregister(worker.fd_out)
        self._workers.remove(worker)
        worker.stop()
        if replace and not self._closed:
            self._top_up()

    def _failed_start(self, worker: _Worker, why: str) -> None:
        self._start_failures += 1
        logger.warning("grader worker pid %d failed to start (%s)", worker.proc.pid, why)
        give_up = self._start_failures >= _MAX_START_FAILURES
        self._retire(worker, replace=not give_up)
        if give_up:
            self._start_failures = 0  # the next run() tries afresh
            raise WorkerStartError(
                f"{_MAX_START_FAILURES} worker processes in a row failed to start ({why}); see their stderr above. "
                f"Is `{', '.join(self.modules)}` importable by {sys.executable}?"
            )

    def run(self, calls: list[tuple[str, tuple]]) -> list[Outcome]:
        """Run each `(job_name, args)` once; one Outcome per call, in order."""
        with self._lock:
            if self._closed:
                raise RuntimeError("DeadlinePool is closed")
            outcomes: list[Outcome | None] = [None] * len(calls)
            pending = deque(range(len(calls)))
            self._top_up()
            while pending or any(w.call is not None for w in self._workers):
                for worker in list(self._workers):
                    if pending and worker.ready and worker.call is None:
                        index = pending.popleft()
                        try:
                            _write_all(worker.fd_in, _frame((index, *calls[index])))
                        except OSError:  # it died while idle: the call never started, so it is not its fault
                            pending.appendleft(index)
                            self._retire(worker)
                            continue
                        worker.call, worker.sent_at = index, time.monotonic()
                self._wait_and_collect(outcomes)
            return outcomes  # type: ignore[return-value]  # every index was filled before the loop ended

    def _wait_and_collect(self, outcomes: list[Outcome | None]) -> None:
        """Wait for the next message, deadline or start-up limit; record outcomes; kill what overran."""
        wake_at = [w.sent_at + self.deadline_s for w in self._workers if w.call is not None]
        wake_at += [w.started_at + _STARTUP_TIMEOUT_S for w in self._workers if not w.ready]
        timeout = max(0.0, min(wake_at) - time.monotonic()) if wake_at else None
        for key, _ in self._selector.select(timeout):
            self._receive(key.data, outcomes)

        now = time.monotonic()  # messages that arrived count, even if they are read after the deadline
        for worker in list(self._workers):
            if worker.call is not None and now - worker.sent_at > self.deadline_s:
                outcomes[worker.call] = Outcome("timeout", None, now - worker.sent_at)
                self._retire(worker)
            elif not worker.ready and now - worker.started_at > _STARTUP_TIMEOUT_S:
                self._failed_start(worker, f"not ready after {_STARTUP_TIMEOUT_S:.0f} s")

    def _receive(self, worker: _Worker, outcomes: list[Outcome | None]) -> None:
        if worker not in self._workers:
            return  # retired earlier in this same round of events
        messages, eof = worker.read_messages()
        for message in messages:
            if message[0] == "ready":
                worker.ready = True
                self._start_failures = 0
                continue
            index, status, value = message
            outcomes[index] = Outcome(status, value, time.monotonic() - worker.sent_at)
            worker.call = None
        if eof:
            if not worker.ready:
                self._failed_start(worker, f"exit code {worker.proc.wait()}")
                return
            if worker.call is not None:
                outcomes[worker.call] = Outcome("crash", None, time.monotonic() - worker.sent_at)
            self._retire(worker)

    def wait_ready(self) -> None:
        """Block until every worker has finished starting (imports and warm-up)."""
        with self._lock:
            self._top_up()
            while not all(w.ready for w in self._workers):
                self._wait_and_collect([])

    def pids(self) -> list[int]:
        """Process ids of the current workers."""
        return [w.proc.pid for w in self._workers]

    def close(self) -> None:
        with self._lock:
            self._closed = True
            for worker in self._workers:
                self._selector.unregister(worker.fd_out)
            self._finalizer()  # shuts the workers down, once
            self._selector.close()


# ------------------------------------------------------------------------------------------------ worker side


def _read_exact(fd: int, size: int) -> bytes | None:
    data = bytearray()
    while len(data) < size:
        chunk = os.read(fd, size - len(data))
        if not chunk:
            return None
        data += chunk
    return bytes(data)


def _exit_when_orphaned(parent_pid: int) -> None:
    # A worker stuck in a hang never sees EOF on stdin; if the trainer dies, it must not linger.
    while True:
        time.sleep(1.0)
        if os.getppid() != parent_pid:
            os._exit(0)


# Jobs every worker answers, so that tests can provoke a hang and a crash, and see what a worker imported.
_TEST_JOBS: dict[str, Callable[..., Any]] = {
    "_sleep": lambda seconds, value=True: time.sleep(seconds) or value,
    "_crash": lambda code=1: os._exit(code),
    "_modules": lambda: sorted(sys.modules),
}


def worker_main(modules: Sequence[str]) -> None:
    """Entry point of a worker process: import the job modules, then answer calls from stdin until EOF."""
    fd_in, fd_out = os.dup(0), os.dup(1)
    os.dup2(2, 1)  # what the job code prints goes to stderr, never into the result channel
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    threading.Thread(target=_exit_when_orphaned, args=(os.getppid(),), daemon=True).start()

    jobs: dict[str, Callable[..., Any]] = {}
    for module in modules:
        job_module = importlib.import_module(module)
        if hasattr(job_module, "warm_up"):
            job_module.warm_up()  # first-use costs are paid before the first deadline starts
        jobs.update(getattr(job_module, "WORKER_JOBS", {}))
    jobs.update(_TEST_JOBS)
    _write_all(fd_out, _frame(("ready", os.getpid())))
    while True:
        header = _read_exact(fd_in, _HEADER.size)
        payload = None if header is None else _read_exact(fd_in, _HEADER.unpack(header)[0])
        if payload is None:
            return  # the parent closed the pipe: shut down
        index, name, args = pickle.loads(payload)
        try:
            reply = (index, "ok", jobs[name](*args))
        except Exception as error:  # reported to the parent, which counts and logs it
            reply = (index, "error", f"{name}: {type(error).__name__}: {str(error)[:300]}")
        _write_all(fd_out, _frame(reply))
