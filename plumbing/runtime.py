"""The process around the trainer: environment before torch and vLLM load, the process group, rank-0 printing,
the quiet console (vLLM's and DeepSpeed's logs to files in the output folder, `route_logs`).

Import this module before torch or vLLM (canoe.py and evaluate.py import it first): two settings only act if
they are in the environment when those libraries start.
"""

from __future__ import annotations

import _thread
import contextlib
import datetime
import logging
import os
import signal
import sys
import threading
import time
from collections.abc import Collection, Sequence
from pathlib import Path


def ranks_on_this_node() -> int:
    """The number of ranks this node runs: torchrun's LOCAL_WORLD_SIZE, or LOCAL_SIZE (DeepSpeed's launcher's); 1
    for a plain `python`."""
    return int(os.environ.get("LOCAL_WORLD_SIZE") or os.environ.get("LOCAL_SIZE") or "1")


# Read when vLLM is imported: vLLM in-process, rollouts run in the training process itself, no engine subprocess.
# Without OMP_NUM_THREADS vLLM cuts torch to one thread "for serving", which would leave training on one core too;
# the cores are shared among the ranks instead.
os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
os.environ.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // ranks_on_this_node())))
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import deepspeed  # noqa: E402  (after the environment above)
import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402


def print0(*args: object) -> None:
    if int(os.environ.get("RANK", "0")) == 0:
        print(*args, flush=True)


def single_process_defaults() -> None:
    """The launcher's environment, for a plain `python canoe.py` (a world of one); the launcher's values win."""
    for key, value in (("RANK", "0"), ("LOCAL_RANK", "0"), ("WORLD_SIZE", "1"), ("MASTER_ADDR", "127.0.0.1"),
                       ("MASTER_PORT", str(29500 + os.getpid() % 1000))):
        os.environ.setdefault(key, value)


def exit_on_sigterm():
    """SIGTERM (a scheduler's limit, the launcher passing on Ctrl-C) exits through `finally` and `with`, so lock
    files and temporary folders are removed; Python's default ends at once. Returns the handler it replaces."""
    return signal.signal(signal.SIGTERM, lambda signum, _: sys.exit(128 + signum))


def init_distributed(timeout_minutes: float | None = None) -> tuple[int, int]:
    """Join the launcher's process group (a plain `python canoe.py` is a world of one); returns (rank, world).

    `timeout_minutes` (`dist_timeout_minutes`) bounds every collective's wait; DeepSpeed's 10-minute default can
    end a run while the other ranks wait at `save_checkpoint`'s barrier for rank 0 to write `policy/`.
    """
    if dist.is_initialized():  # canoe.train joins before `stop_together`, canoe.setup again
        return dist.get_rank(), dist.get_world_size()
    single_process_defaults()
    timeout = {} if timeout_minutes is None else {"timeout": datetime.timedelta(minutes=timeout_minutes)}
    # While DeepSpeed starts: torch's first build of the shm op removes its lock, which would make later runs wait.
    default = exit_on_sigterm()
    deepspeed.init_distributed(**timeout)
    signal.signal(signal.SIGTERM, default)
    rank, world_size = dist.get_rank(), dist.get_world_size()
    unlink_shm_buffer(rank, world_size)
    return rank, world_size


def leave_process_group() -> None:
    """Leave the process group, and vLLM's groups within it, before this process exits: one that exits with a live
    group can abort in the group's C++ destructor ("terminate called without an active exception", SIGABRT).

    No barrier, but NCCL's shutdown may wait for the other ranks: call it on every rank on the normal path, never
    after another rank failed (`stop_together`'s path). vLLM's groups go first: its engine destroys them when it is
    collected or at exit, which raises on groups already destroyed with the world group; after this it finds none.
    """
    vllm_groups = sys.modules.get("vllm.distributed.parallel_state")
    if vllm_groups is not None:
        vllm_groups.destroy_model_parallel()
        vllm_groups.destroy_distributed_environment()  # its world group too: the one `init_distributed` joined
    if dist.is_initialized():
        dist.destroy_process_group()


def unlink_shm_buffer(rank: int, world_size: int) -> None:
    """Remove this rank's DeepSpeed all-reduce buffer (64 MiB, never removed by DeepSpeed) from /dev/shm once every
    rank has mapped it; DeepSpeed's own condition for a buffer decides, so every rank takes the same branch."""
    backend = deepspeed.comm.comm.cdb
    if getattr(backend, "shm_comm_op", None) is None or os.environ.get("LOCAL_SIZE") != str(world_size):
        return
    if world_size > 1:
        dist.barrier()
    addr, port = os.environ.get("MASTER_ADDR", ""), os.environ.get("MASTER_PORT", "")
    Path(f"/dev/shm/deepspeed_allreduce_buffer_{os.getuid()}_{addr}_{port}_{rank}").unlink(missing_ok=True)


# CPU instructions that compute in bfloat16 natively (Linux's names in /proc/cpuinfo). Without them torch and
# vLLM's CPU kernels emulate bfloat16 through float32 and it is no faster than float32.
BF16_CPU_FLAGS = ("avx512_bf16", "amx_bf16")


def choose_dtype(name: str, *, cuda: bool, cuda_bf16: bool, cpu_flags: Collection[str]) -> tuple[torch.dtype, str]:
    """The training and sampling dtype for the config's `dtype`, and why (a pure function of the hardware).

    >>> choose_dtype("auto", cuda=False, cuda_bf16=False, cpu_flags={"avx2", "avx512f"})[0]
    torch.float32
    >>> choose_dtype("auto", cuda=False, cuda_bf16=False, cpu_flags={"avx512f", "amx_bf16"})
    (torch.bfloat16, 'auto: the CPU has amx_bf16')
    """
    if name != "auto":
        return getattr(torch, name), "set in the config"
    if cuda:
        return (torch.bfloat16, "auto: the GPU has bfloat16") if cuda_bf16 else (torch.float32, "auto: the GPU has "
                                                                                  "no bfloat16")
    found = [flag for flag in BF16_CPU_FLAGS if flag in cpu_flags]
    if found:
        return torch.bfloat16, f"auto: the CPU has {' and '.join(found)}"
    return torch.float32, (f"auto: the CPU has neither {' nor '.join(BF16_CPU_FLAGS)}, so bfloat16 would be "
                           f"emulated, no faster than float32")


def cpu_flags() -> set[str]:
    """The CPU's feature flags from /proc/cpuinfo (Linux); empty where there is none."""
    try:
        with open("/proc/cpuinfo") as f:
            return {flag for line in f if line.startswith("flags") for flag in line.split(":", 1)[1].split()}
    except OSError:
        return set()


def resolve_dtype(name: str, *, say: bool = False) -> torch.dtype:
    """`choose_dtype` on this machine; with `say`, rank 0 prints the choice and its reason (once, at start-up)."""
    cuda = torch.cuda.is_available()
    dtype, why = choose_dtype(name, cuda=cuda, cuda_bf16=cuda and torch.cuda.is_bf16_supported(),
                              cpu_flags=set() if cuda else cpu_flags())
    if say:
        print0(f"dtype: {str(dtype).removeprefix('torch.')} ({why})")
    return dtype


def collective_device(group: dist.ProcessGroup | None = None) -> torch.device:
    """The device whose tensors the process group's backend takes (NCCL: "cuda" only; gloo: "cpu"), on which
    every collective of the trainer is built. No index: "cuda" is the current device, the rank's own GPU."""
    return torch.device(dist.distributed_c10d._get_object_coll_device(group))


def _on_collective_device(values: Sequence[float] | torch.Tensor) -> torch.Tensor:
    """A new float64 vector of `values` on `collective_device()` (a copy: collectives write into their tensor)."""
    if isinstance(values, torch.Tensor):
        vector = values.detach().reshape(-1).to(torch.float64)
    else:
        vector = torch.tensor([float(v) for v in values], dtype=torch.float64)
    return vector.to(collective_device(), copy=True)


def all_reduce_values(values: Sequence[float] | torch.Tensor, op: dist.ReduceOp = dist.ReduceOp.SUM) -> list[float]:
    """All-reduce a vector of numbers over the ranks with `op` (SUM, MIN, MAX, ...), on the group's device; returns
    the reduced values as Python floats, in order."""
    vector = _on_collective_device(values)
    dist.all_reduce(vector, op=op)
    return vector.cpu().tolist()


def broadcast_values(values: Sequence[float] | torch.Tensor, src: int = 0) -> list[float]:
    """Rank `src`'s vector of numbers, on every rank (broadcast on the group's device); returns Python floats."""
    vector = _on_collective_device(values)
    dist.broadcast(vector, src=src)
    return vector.cpu().tolist()


class RankFailed(SystemExit):
    """This rank stops because another rank failed (`stop_together` has printed which one and why)."""


STOP_KEY = "canoe/stop"  # in the process group's store: `STOP_KEY/rank-R` holds rank R's error, `/count` the failures
POLL_S = 0.5  # how often each rank looks for another's failure (one store round trip)
GRACE_S = 5.0  # how long a main thread may take to unwind before its process ends without clean-up


@contextlib.contextmanager
def stop_together():
    """Around set-up and the training loop: an exception on any rank stops every rank within seconds, each saying
    which rank failed and its error, instead of the others waiting in their next collective until the launcher or
    `dist_timeout_minutes` ends them. The failing rank writes its error into the process group's store; a thread on
    every other rank polls it, prints the error and interrupts its main thread (KeyboardInterrupt), which unwinds
    as `RankFailed`; a main thread held in a collective never unwinds, so its process ends `GRACE_S` later. Free
    while nothing fails: no collective, one store read per rank every `POLL_S`."""
    world = dist.get_world_size() if dist.is_initialized() else 1
    if world == 1:
        yield
        return
    store, rank = dist.distributed_c10d._get_default_store(), dist.get_rank()  # TCPStore: safe from two threads
    done, lock, seen = threading.Event(), threading.Lock(), []
    threading.Thread(target=_watch, args=(store, rank, world, done, lock, seen), daemon=True).start()
    try:
        yield
    except BaseException as error:
        with lock:  # the watcher has seen another rank's failure, or it never will
            done.set()
        if seen:  # whatever this rank raised since comes from that failure
            raise RankFailed(1) from None
        _report(store, rank, world, error)
        raise
    finally:
        done.set()


def _report(store, rank: int, world: int, error: BaseException) -> None:
    """Say, and tell every rank through the store, that this rank failed; then wait, `2 · GRACE_S` at most, until
    the others have read it (rank 0's store ends with its process)."""
    message = f"{type(error).__name__}: {error}"[:4000]
    print(f"error: rank {rank} of {world} failed; every rank stops. {message}", file=sys.stderr, flush=True)
    with contextlib.suppress(Exception):  # a store already gone: the original error goes on all the same
        store.set(f"{STOP_KEY}/rank-{rank}", message)
        store.add(f"{STOP_KEY}/count", 1)
        deadline = time.monotonic() + 2 * GRACE_S
        while (store.add(f"{STOP_KEY}/read", 0) < world - store.add(f"{STOP_KEY}/count", 0)
               and time.monotonic() < deadline):
            time.sleep(POLL_S / 5)


def _watch(store, rank: int, world: int, done: threading.Event, lock: threading.Lock, seen: list) -> None:
    """`stop_together`'s thread: until `done`, look for another rank's failure; on one, print it, count it read,
    interrupt the main thread, and end the process if it is still there `GRACE_S` later."""
    try:
        while not done.wait(POLL_S):
            with lock:
                if done.is_set():
                    return
                if store.add(f"{STOP_KEY}/count", 0):
                    seen.extend((r, store.get(f"{STOP_KEY}/rank-{r}").decode()) for r in range(world)
                                if store.check([f"{STOP_KEY}/rank-{r}"]))
                    break
        else:
            return
        for other, message in seen:
            print(f"error: rank {other} of {world} failed, so rank {rank} stops too. rank {other}: {message}",
                  file=sys.stderr, flush=True)
        store.add(f"{STOP_KEY}/read", 1)
    except Exception:  # the store is gone: rank 0's process has ended, and with it the run
        return
    _thread.interrupt_main()
    time.sleep(GRACE_S)
    os._exit(1)


def reduce_over_ranks(metrics: dict[str, float], *, keep: Collection[str] = (), sums: Collection[str] = (),
                      maxima: Collection[str] = ()) -> dict[str, float]:
    """Combine each rank's metrics into the run's: those in `keep` are already the same on every rank and stay as
    they are, those in `sums` (counts) are added up over ranks, those in `maxima` take the largest value of any
    rank, and every other metric (means, rates, shares) is averaged over ranks. Every rank must pass the same keys.
    """
    world = dist.get_world_size()
    added = sorted(k for k in metrics if k not in keep and k not in maxima)
    largest = sorted(k for k in metrics if k in maxima and k not in keep)
    combined = dict(metrics)
    for key, value in zip(added, all_reduce_values([metrics[k] for k in added])):
        combined[key] = value if key in sums else value / world
    if largest:  # the same keys on every rank, so every rank takes part or none does
        combined.update(zip(largest, all_reduce_values([metrics[k] for k in largest], op=dist.ReduceOp.MAX)))
    return combined


LOG_FILE_HANDLER = "canoe-log-file"  # the name of the handlers `route_logs` adds, so that a second call replaces them


def route_logs(out: Path, rank: int, *, verbose: bool = False) -> dict[str, Path]:
    """Send this rank's vLLM and DeepSpeed logs to files in `out` (made if missing); returns their paths.

    The terminal keeps the progress bar, rank 0's lines (`print0`), vLLM's errors and DeepSpeed's warnings. Files
    (`vllm.log`, `deepspeed.log`; `-rank-R` before `.log` on rank R > 0) are appended to. `verbose` leaves vLLM's
    terminal handler as it was. Call it before the engine is made: applying vLLM's logging config drops earlier
    handlers. The launcher's own "[INFO]" lines are out of reach: `deepspeed --log_level warning` quiets them.
    """
    from deepspeed.utils import logger as deepspeed_logger
    from vllm.config.logging import LoggingConfig
    from vllm.logger import DEFAULT_LOGGING_CONFIG, configure_logging_if_needed
    from vllm.logging_utils import NewLineFormatter

    out.mkdir(parents=True, exist_ok=True)
    config = LoggingConfig()
    configure_logging_if_needed(config)  # what the engine does at its start; it then leaves the handlers alone
    logger = logging.getLogger("vllm")
    plain = DEFAULT_LOGGING_CONFIG["formatters"]["vllm"]  # vLLM's text format, without the terminal's colours
    formatter = NewLineFormatter(plain["format"], plain["datefmt"], log_level=config.log_level)
    paths = {"vllm": _to_file(logger, out, "vllm", rank, logger.getEffectiveLevel(), formatter,
                              None if verbose else logging.ERROR)}
    formatter = next((h.formatter for h in deepspeed_logger.handlers if h.formatter is not None), logging.Formatter())
    paths["deepspeed"] = _to_file(deepspeed_logger, out, "deepspeed", rank, logging.INFO, formatter, logging.WARNING)
    deepspeed_logger.setLevel(min(deepspeed_logger.getEffectiveLevel(), logging.INFO))
    return paths


def is_terminal_handler(handler: logging.Handler) -> bool:
    """A stream handler other than a file's (a FileHandler is a StreamHandler too)."""
    return isinstance(handler, logging.StreamHandler) and not isinstance(handler, logging.FileHandler)


def _to_file(logger: logging.Logger, out: Path, name: str, rank: int, level: int, formatter: logging.Formatter,
             terminal: int | None) -> Path:
    """Add (or replace, on a second call) `route_logs`'s FileHandler on `logger`, writing at `level` to
    `out/NAME.log` on rank 0 and `out/NAME-rank-R.log` on rank R, and raise its terminal handlers to `terminal`
    (None: leave them); returns the file's path."""
    for handler in [h for h in logger.handlers if h.get_name() == LOG_FILE_HANDLER]:
        logger.removeHandler(handler)
        handler.close()
    path = out / (f"{name}.log" if rank == 0 else f"{name}-rank-{rank}.log")
    handler = logging.FileHandler(path, encoding="utf-8")
    handler.set_name(LOG_FILE_HANDLER)
    handler.setLevel(level)
    handler.setFormatter(formatter)
    logger.addHandler(handler)
    for handler in logger.handlers if terminal is not None else []:
        if is_terminal_handler(handler):
            handler.setLevel(max(handler.level, terminal))
    return path
