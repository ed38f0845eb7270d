"""Run small pure functions in persistent worker processes, each call under a hard wall-clock deadline.

math-verify can hang on hostile LaTeX and its own timeout (`signal.alarm`) works only in the main thread, so each
call runs in a worker process that is killed (SIGKILL) when it overruns: the deadline holds from any thread. Workers
are fresh interpreters (`sys.executable -c`), neither forks of the trainer nor multiprocessing's spawn (which
re-imports the trainer's `__main__`, and torch), and import only this file and their job modules. They persist
across calls and take one call at a time, its deadline running from when it is sent; messages are pickles over
their stdin/stdout. Outcomes are reported, never raised; only workers that cannot start at all raise
WorkerStartError."""

from __future__ import annotations

import importlib
import logging
import os
import pickle
import selectors
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

# The repository root, put on a worker's path: job modules are named as packages ("grading.grader").
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
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


class _Worker:
    """One worker process as the parent sees it: calls go to its stdin, replies come from its stdout."""

    def __init__(self, modules: tuple[str, ...]) -> None:
        code = (f"import sys; sys.path.insert(0, {ROOT!r}); "
                f"from grading import deadline; deadline.worker_main({modules!r})")
        self.proc = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE)
        self.calls, self.replies = self.proc.stdin, self.proc.stdout
        self.ready = False
        self.call: int | None = None  # index of the call in flight
        self.sent_at = 0.0
        self.answer_by: float | None = time.monotonic() + _STARTUP_TIMEOUT_S  # for "ready", then for each call

    def stop(self, grace_s: float = 0.0) -> None:
        """Close its stdin (at EOF a worker exits), wait up to `grace_s` seconds, then kill it if it lives."""
        try:
            self.calls.close()  # type: ignore[union-attr]
        except OSError:
            pass  # broken pipe: the worker is gone already
        try:
            self.proc.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.replies.close()  # type: ignore[union-attr]


def _shutdown(workers: list[_Worker]) -> None:
    for worker in workers:
        worker.stop(grace_s=1.0)
    workers.clear()


class DeadlinePool:
    """A persistent pool of worker processes running `WORKER_JOBS[name](*args)` under a deadline.

    Each worker imports `modules` (one name or several) in order, merges their `WORKER_JOBS` dicts and makes each
    one's `WARM_UP` calls, `[(name, args), ...]`, if any. `run` may be called from any thread; calls are serialised.
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
        self._workers: list[_Worker] = []
        self._start_failures = 0
        self._closed = False
        # Kills the workers when the pool is garbage-collected or the interpreter exits without close().
        self._finalizer = weakref.finalize(self, _shutdown, self._workers)
        self._top_up()  # the workers import in the background while the caller goes on

    def _top_up(self) -> None:
        while len(self._workers) < self._size:  # after a WorkerStartError the pool may be short
            self._workers.append(_Worker(self.modules))

    def _retire(self, worker: _Worker, replace: bool = True) -> None:
        """Kill a worker and, unless told not to, start its replacement."""
        self._workers.remove(worker)
        worker.stop()
        if replace:
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
                            pickle.dump(calls[index], worker.calls)
                            worker.calls.flush()
                        except OSError:  # it died while idle: the call never started, so it is not its fault
                            pending.appendleft(index)
                            self._retire(worker)
                            continue
                        worker.call, worker.sent_at = index, time.monotonic()
                        worker.answer_by = worker.sent_at + self.deadline_s
                self._wait_and_collect(outcomes)
            return outcomes  # type: ignore[return-value]  # every index was filled before the loop ended

    def _wait_and_collect(self, outcomes: list[Outcome | None]) -> None:
        """Wait for the next message, deadline or start-up limit; record outcomes; kill what overran."""
        answer_by = [w.answer_by for w in self._workers if w.answer_by is not None]
        timeout = max(0.0, min(answer_by) - time.monotonic()) if answer_by else None
        with selectors.DefaultSelector() as selector:
            for worker in self._workers:
                selector.register(worker.replies, selectors.EVENT_READ, worker)
            readable = [key.data for key, _ in selector.select(timeout)]
        for worker in readable:
            self._receive(worker, outcomes)

        now = time.monotonic()  # messages that arrived count, even if they are read after the deadline
        for worker in [w for w in self._workers if w.answer_by is not None and now > w.answer_by]:
            if worker.ready:
                outcomes[worker.call] = Outcome("timeout", None, now - worker.sent_at)  # type: ignore[index]
                self._retire(worker)
            else:
                self._failed_start(worker, f"not ready after {_STARTUP_TIMEOUT_S:.0f} s")

    def _receive(self, worker: _Worker, outcomes: list[Outcome | None]) -> None:
        try:
            message = pickle.load(worker.replies)  # blocks until whole: a worker writes each message at once
        except (EOFError, OSError, pickle.UnpicklingError):  # the worker died
            if not worker.ready:
                return self._failed_start(worker, f"exit code {worker.proc.wait()}")
            if worker.call is not None:
                outcomes[worker.call] = Outcome("crash", None, time.monotonic() - worker.sent_at)
            return self._retire(worker)
        if worker.ready:  # a call's (status, value)
            outcomes[worker.call] = Outcome(*message, time.monotonic() - worker.sent_at)  # type: ignore[index]
        else:  # "ready"
            worker.ready = True
            self._start_failures = 0
        worker.call = worker.answer_by = None

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
            self._finalizer()  # shuts the workers down, once


# ------------------------------------------------------------------------------------------------ worker side


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
    calls, replies = os.fdopen(os.dup(0), "rb"), os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)  # what the job code prints goes to stderr, never into the result channel
    os.dup2(os.open(os.devnull, os.O_RDONLY), 0)
    threading.Thread(target=_exit_when_orphaned, args=(os.getppid(),), daemon=True).start()

    jobs: dict[str, Callable[..., Any]] = {}
    for module in modules:
        job_module = importlib.import_module(module)
        jobs.update(getattr(job_module, "WORKER_JOBS", {}))
        for name, args in getattr(job_module, "WARM_UP", ()):
            jobs[name](*args)  # first-use costs are paid before the first deadline starts
    jobs.update(_TEST_JOBS)
    pickle.dump("ready", replies)
    replies.flush()
    while True:
        try:
            name, args = pickle.load(calls)
        except EOFError:
            return  # the parent closed the pipe: shut down
        try:
            reply = ("ok", jobs[name](*args))
        except Exception as error:  # reported to the parent, which counts and logs it
            reply = ("error", f"{name}: {type(error).__name__}: {str(error)[:300]}")
        pickle.dump(reply, replies)
        replies.flush()
