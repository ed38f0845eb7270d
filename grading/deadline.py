"""Run small pure functions in persistent worker processes, each call under a hard wall-clock deadline.

Why this exists (docs/DESIGN.md, "Rewards"): math-verify can hang or take seconds on hostile LaTeX, and its own
timeout is `signal.alarm`, which only works in the main thread of the main interpreter. The trainer calls the
rewards from wherever it likes, so the deadline here works from any thread: the call runs in another process, and
a process that overruns is killed (SIGKILL reaches it even inside a long C-level big-integer power).

How:
- Workers are started with `subprocess.Popen([sys.executable, "-c", ...])`, i.e. fork+exec of a fresh interpreter.
  Nothing is ever forked from the trainer's torch/vLLM/DeepSpeed threads without an immediate exec. We do not use
  multiprocessing's spawn/forkserver contexts: both re-import the parent's `__main__` in the child, which for the
  trainer (`canoe.py`) would import torch into every worker. A worker imports only this file and the job modules
  (for the rewards: `grading.grader`, and `grading.r1_grader` where the R1-Zero reward asks for it; sympy and
  math-verify).
- Start-up (~1 s, mostly importing sympy) is paid once: workers persist across calls and are replaced only when
  one is killed or dies.
- Each worker gets one call at a time, so an overrun is attributable to exactly one call; its deadline runs from
  the moment the call is sent. Messages are length-prefixed pickles over the worker's stdin/stdout pipes; the
  worker moves its real stdout onto stderr first, so a stray print cannot corrupt the channel.

Outcomes are reported, never raised: "ok" (the value), "error" (the job raised; its message), "timeout" (killed
at the deadline), "crash" (the worker died during the call). Callers decide the fallback and count them.
Only an environment where workers cannot start at all raises (WorkerStartError), since every answer would be wrong.

Test hooks: every worker also answers the jobs "_sleep" (seconds, value), "_crash" (exit code) and "_modules"
(its `sys.modules`), so tests can provoke a hang and a crash, and check what a worker imported.
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
# The repository root, which a worker puts on its path: the job modules are named as packages ("grading.grader").
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_READ_CHUNK = 1 << 16
_MAX_START_FAILURES = 3  # consecutive workers dying before "ready" => the environment is broken, raise


class WorkerStartError(RuntimeError):
    """Worker processes keep dying before they are ready: the environment is broken, not the input."""


@dataclass(frozen=True)
class Outcome:
    """What became of one call: status is "ok", "error", "timeout" or "crash"."""

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
        code = (
            f"import sys; sys.path.insert(0, {ROOT!r}); "
            f"from grading import deadline; deadline.worker_main({modules!r})"
        )
        self.proc = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE)
        self.fd_out = self.proc.stdout.fileno()  # type: ignore[union-attr]  # parent reads results here
        self.fd_in = self.proc.stdin.fileno()  # type: ignore[union-attr]  # parent writes calls here
        os.set_blocking(self.fd_out, False)
        self.buffer = bytearray()
        self.ready = False
        self.started_at = time.monotonic()
        self.call: int | None = None  # index of the call in flight
        self.sent_at = 0.0

    def read_messages(self) -> tuple[list[Any], bool]:
        """Drain the pipe; return the complete messages and whether the worker has closed it (died)."""
        eof = False
        while True:
            try:
                chunk = os.read(self.fd_out, _READ_CHUNK)
            except BlockingIOError:
                break
            if not chunk:
                eof = True
                break
            self.buffer += chunk
        messages = []
        while len(self.buffer) >= _HEADER.size:
            (size,) = _HEADER.unpack_from(self.buffer)
            if len(self.buffer) < _HEADER.size + size:
                break
            messages.append(pickle.loads(bytes(self.buffer[_HEADER.size : _HEADER.size + size])))
            del self.buffer[: _HEADER.size + size]
        return messages, eof

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()
        for pipe in (self.proc.stdin, self.proc.stdout):
            try:
                pipe.close()  # type: ignore[union-attr]
            except OSError:
                pass  # the other end is gone already; nothing left to flush

    def close_gently(self, wait_s: float) -> None:
        """Ask the worker to exit (EOF on its stdin), kill it if it does not."""
        try:
            self.proc.stdin.close()  # type: ignore[union-attr]
        except OSError:
            pass  # broken pipe: the worker is already gone
        try:
            self.proc.wait(timeout=wait_s)
        except subprocess.TimeoutExpired:
            pass
        self.kill()


def _shutdown(workers: list[_Worker]) -> None:
    for worker in workers:
        worker.close_gently(wait_s=1.0)
    workers.clear()


class DeadlinePool:
    """A persistent pool of worker processes running `WORKER_JOBS[name](*args)` under a deadline.

    `modules` names the job module, or several: each worker imports them in order and merges their
    `WORKER_JOBS` dicts. A job module may define `warm_up()`, run once per worker before it reports ready.

    `run` may be called from any thread; calls from several threads are serialised.
    Differs from CANOE (docs/differences.md, D3): symbolic grading runs under a hard deadline in worker processes.
    """

    def __init__(self, modules: str | Sequence[str], workers: int = 2, deadline_s: float = 1.0,
                 startup_timeout_s: float = 120.0):
        if workers < 1:
            raise ValueError(f"workers must be >= 1, got {workers}")
        if deadline_s <= 0:
            raise ValueError(f"deadline_s must be > 0, got {deadline_s}")
        self.modules = (modules,) if isinstance(modules, str) else tuple(modules)
        self.deadline_s = deadline_s
        self.startup_timeout_s = startup_timeout_s
        self._size = workers
        self._lock = threading.Lock()
        self._selector = selectors.DefaultSelector()
        self._workers: list[_Worker] = []
        self._start_failures = 0
        self._closed = False
        # Kills the workers when the pool is garbage-collected or the interpreter exits without close().
        self._finalizer = weakref.finalize(self, _shutdown, self._workers)
        for _ in range(workers):
            self._start_worker()  # they import in parallel, in the background, while the caller goes on

    def _start_worker(self) -> None:
        worker = _Worker(self.modules)
        self._workers.append(worker)
        self._selector.register(worker.fd_out, selectors.EVENT_READ, worker)

    def _retire(self, worker: _Worker) -> None:
        """Kill a worker and start its replacement."""
        self._selector.unregister(worker.fd_out)
        self._workers.remove(worker)
        worker.kill()
        if not self._closed:
            self._start_worker()

    def _worker_died_before_ready(self, worker: _Worker, why: str) -> None:
        self._start_failures += 1
        logger.warning("grader worker pid %d failed to start (%s)", worker.proc.pid, why)
        if self._start_failures < _MAX_START_FAILURES:
            self._retire(worker)
            return
        self._selector.unregister(worker.fd_out)
        self._workers.remove(worker)
        worker.kill()
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
            return self._run(calls)

    def _run(self, calls: list[tuple[str, tuple]]) -> list[Outcome]:
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

    def _top_up(self) -> None:
        while len(self._workers) < self._size:  # after a WorkerStartError the pool may be short
            self._start_worker()

    def _wait_and_collect(self, outcomes: list[Outcome | None]) -> None:
        """Wait for the next message, deadline or start-up limit; record outcomes; kill what overran."""
        now = time.monotonic()
        wake_at = [w.sent_at + self.deadline_s for w in self._workers if w.call is not None]
        wake_at += [w.started_at + self.startup_timeout_s for w in self._workers if not w.ready]
        timeout = max(0.0, min(wake_at) - now) if wake_at else None
        for key, _ in self._selector.select(timeout):
            self._receive(key.data, outcomes)

        now = time.monotonic()  # messages that arrived count, even if we read them after the deadline
        for worker in list(self._workers):
            if worker.call is not None and now - worker.sent_at > self.deadline_s:
                outcomes[worker.call] = Outcome("timeout", None, now - worker.sent_at)
                self._retire(worker)
            elif not worker.ready and now - worker.started_at > self.startup_timeout_s:
                self._worker_died_before_ready(worker, f"not ready after {self.startup_timeout_s:.0f} s")

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
                self._worker_died_before_ready(worker, f"exit code {worker.proc.wait()}")
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
        """Process ids of the current workers (for tests and diagnostics)."""
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
    # A worker busy in a hang would never see EOF on stdin; if the trainer dies, do not linger.
    while True:
        time.sleep(1.0)
        if os.getppid() != parent_pid:
            os._exit(0)


def _test_sleep(seconds: float, value: Any = True) -> Any:
    time.sleep(seconds)
    return value


def _test_crash(code: int = 1) -> None:
    os._exit(code)


def _test_modules() -> list[str]:
    return sorted(sys.modules)


def worker_main(modules: Sequence[str]) -> None:
    """Entry point of a worker process: import the job modules, then answer calls from stdin until EOF."""
    fd_in, fd_out = os.dup(0), os.dup(1)
    os.dup2(2, 1)  # anything printed by the job code goes to stderr, never into the result channel
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    threading.Thread(target=_exit_when_orphaned, args=(os.getppid(),), daemon=True).start()

    jobs: dict[str, Callable[..., Any]] = {}
    for module in modules:
        job_module = importlib.import_module(module)
        if hasattr(job_module, "warm_up"):
            job_module.warm_up()  # first-use costs are paid before the first deadline starts
        jobs.update(getattr(job_module, "WORKER_JOBS", {}))
    jobs.update({"_sleep": _test_sleep, "_crash": _test_crash, "_modules": _test_modules})
    _write_all(fd_out, _frame(("ready", os.getpid())))
    while True:
        header = _read_exact(fd_in, _HEADER.size)
        if header is None:
            return  # parent closed the pipe: shut down
        payload = _read_exact(fd_in, _HEADER.unpack(header)[0])
        if payload is None:
            return
        index, name, args = pickle.loads(payload)
        try:
            reply = (index, "ok", jobs[name](*args))
        except Exception as error:  # reported to the parent, which counts and logs it
            reply = (index, "error", f"{name}: {type(error).__name__}: {str(error)[:300]}")
        _write_all(fd_out, _frame(reply))
