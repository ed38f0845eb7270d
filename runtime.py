"""The process around the trainer: environment before torch and vLLM load, the process group, rank-0 printing.

Import this module before torch or vLLM (canoe.py and evaluate.py import it first): two settings only act if
they are in the environment when those libraries start.
"""

from __future__ import annotations

import os

# vLLM in-process: rollouts run in the training process itself, no engine subprocess. Read when vLLM is imported.
os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
# Without OMP_NUM_THREADS vLLM cuts torch to ONE thread "for serving", which would also leave training on one
# core (measured on the 2-core machine: SmolLM2 forward+backward of 14 × 350 tokens takes 46 s on one thread,
# 26 s on two). Share the cores among the ranks instead.
os.environ.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // int(os.environ.get("LOCAL_WORLD_SIZE", "1")))))
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import deepspeed  # noqa: E402  (after the environment above)
import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402


def print0(*args: object) -> None:
    if int(os.environ.get("RANK", "0")) == 0:
        print(*args, flush=True)


def single_process_defaults() -> None:
    """The launcher's environment, for a plain `python canoe.py` (a world of one); the launcher's values win."""
    for key, value in (("RANK", "0"), ("LOCAL_RANK", "0"), ("WORLD_SIZE", "1"), ("MASTER_ADDR", "127.0.0.1")):
        os.environ.setdefault(key, value)
    os.environ.setdefault("MASTER_PORT", str(29500 + os.getpid() % 1000))


def init_distributed() -> tuple[int, int]:
    """Join the launcher's process group (a plain `python canoe.py` is a world of one); returns (rank, world)."""
    single_process_defaults()
    deepspeed.init_distributed()
    return dist.get_rank(), dist.get_world_size()


def resolve_dtype(name: str) -> torch.dtype:
    """`auto` is bfloat16 on a GPU that has it, float32 elsewhere (the CPU trains and samples in float32)."""
    if name == "auto":
        return torch.bfloat16 if torch.cuda.is_available() and torch.cuda.is_bf16_supported() else torch.float32
    return getattr(torch, name)


def mean_over_ranks(metrics: dict[str, float], keep: set[str]) -> dict[str, float]:
    """Average every metric over ranks, except those in `keep` (already global)."""
    names = sorted(k for k in metrics if k not in keep)
    values = torch.tensor([float(metrics[k]) for k in names], dtype=torch.float64)
    dist.all_reduce(values)
    return {**metrics, **{k: float(v) / dist.get_world_size() for k, v in zip(names, values)}}
