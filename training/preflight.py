"""Set-up checks canoe.train runs before it spends minutes loading models: a run that cannot work stops at once,
saying why and what to do (paths, reward field names, memory, vLLM's start-up condition).
"""

from __future__ import annotations

import os
from pathlib import Path

import psutil
import torch

import data
from plumbing import memory_plan, runtime, weight_sync
from config import Config


def check_paths(cfg: Config, *, train: bool) -> None:
    """The model folder and the data file exist (else SystemExit, with the `make` target that makes them)."""
    model = Path(cfg.model)
    if not (model / "config.json").exists():
        hint = " (run `make setup`, which makes models/)" if "models/" in cfg.model else ""
        raise SystemExit(f"error: model path {cfg.model!r} is not a Hugging Face model folder{hint}")
    path = Path(cfg.train_file if train else cfg.eval_file)
    if not path.exists():
        hint = " (run `make data` or `python -m synthetic.synth --out data/synth`)" if "synth" in str(path) else ""
        raise SystemExit(f"error: data file {str(path)!r} does not exist{hint}")


# The keyword arguments rewards.score passes to every reward besides the dataset fields: a field of the
# same name would collide with them.
REWARD_KEYWORDS = ("completions", "completions_long_answer", "grader", "log_dir")


def check_reward_fields(rows: list[dict], path: str) -> None:
    """Refuse a dataset field whose name is one of the rewards' own keyword arguments (REWARD_KEYWORDS)."""
    clashes = sorted({key for row in rows for key in row if key in REWARD_KEYWORDS})
    if clashes:
        raise data.DataError(f"{path}: field {clashes[0]!r} has the name of a keyword the rewards receive from the "
                             f"trainer ({', '.join(REWARD_KEYWORDS)}); rename it in the data")


def host_bytes_needed(cfg: Config, num_parameters: int, trainable: int, dtype, world_size: int) -> float:
    """Host bytes one rank needs on the CPU before activations: weights in the training dtype for the policy, vLLM
    and (β > 0 without LoRA) the reference; a gradient per trainable parameter; float32 master weights and two Adam
    moments (12 bytes per trainable parameter, sharded by ZeRO); vLLM's KV cache."""
    width = torch.finfo(dtype).bits // 8
    copies = 2 + (1 if cfg.beta and not cfg.lora_rank else 0)  # policy, vLLM, reference
    return (num_parameters * width * copies + trainable * width + 12 * trainable / world_size
            + cfg.vllm_cpu_kv_cache_gib * 2**30)


def check_fits(cfg: Config, num_parameters: int, dtype, trainable: int | None = None) -> None:
    """SystemExit, with numbers, when the policy cannot be trained in this machine's memory: on a GPU by
    memory_plan.py's plan, on the CPU by `host_bytes_needed` against the node's available memory per rank."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if torch.cuda.is_available():
        plan = memory_plan.plan_memory(cfg, memory_plan.architecture(cfg.model), world_size=world,
                                       total_bytes=torch.cuda.get_device_properties(0).total_memory,
                                       sleep=cfg.vllm_sleep and weight_sync.sleep_supported())
        if plan.problems():
            raise SystemExit(f"error: this config does not fit on these GPUs (memory_plan.py):\n{plan.table()}")
        # the figure to hold `memory/peak_gib` against in the first steps (docs/gpus.md, "The first run on a GPU")
        runtime.print0(f"memory plan: peak while training {plan.training_peak / 2**30:.1f} GiB of "
                       f"{plan.total / 2**30:.1f} per GPU (--plan-memory shows its parts)")
        return
    need = host_bytes_needed(cfg, num_parameters, num_parameters if trainable is None else trainable, dtype, world)
    have = psutil.virtual_memory().available / runtime.ranks_on_this_node()  # a node's own, read at its own time
    if need > have:
        lora = "" if cfg.lora_rank else "lora_rank > 0 (LoRA), "
        raise SystemExit(
            f"error: the policy ({num_parameters / 1e9:.2f} B parameters) needs about {need / 2**30:.1f} GiB of "
            f"host memory per rank before activations, but {have / 2**30:.1f} GiB are available; use {lora}"
            f"zero_stage = 3, offload_optimizer = true, more GPUs or a smaller model")


def check_engine_can_start(cfg: Config) -> None:
    """SystemExit unless the GPU's free memory is at least total × gpu_memory_utilization, vLLM's start-up
    condition (docs/library-notes.md, "Start-up memory"), said in our words before vLLM says it in its own."""
    torch.cuda.empty_cache()  # blocks the trainer freed while loading count as used until released
    free, total = torch.cuda.mem_get_info()
    if free < cfg.vllm_gpu_memory_utilization * total:
        raise SystemExit(
            f"error: vLLM needs vllm_gpu_memory_utilization × {total / 2**30:.1f} GiB = "
            f"{cfg.vllm_gpu_memory_utilization * total / 2**30:.1f} GiB free to start, but the trainer left "
            f"{free / 2**30:.1f} GiB; `python canoe.py --config ... --plan-memory` shows the share that fits")
