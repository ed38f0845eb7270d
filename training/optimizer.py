"""How the policy is optimised: the DeepSpeed config (ZeRO stage, AdamW, clipping, precision), built from ours, and
the learning-rate schedule (linear warm-up, then cosine or constant; the paper's is lr 1e-6, cosine, 10 % warm-up).
"""

from __future__ import annotations

import math

import torch
from transformers import get_constant_schedule_with_warmup, get_cosine_schedule_with_warmup

from config import Config


def torch_adam_params() -> dict:
    """The optimizer parameters that make DeepSpeed build torch's fused AdamW (shipped compiled for CUDA and the
    CPU) instead of its FusedAdam, whose kernel needs nvcc at first use. Not for `offload_optimizer`, whose CPU Adam
    they would bypass (docs/library-notes.md, "Adam")."""
    return {"torch_adam": True, "fused": True}


def deepspeed_config(cfg: Config, world_size: int, dtype, *, train: bool) -> dict:
    """The DeepSpeed config of the policy (`train`) or of the frozen reference model, built from ours."""
    micro = cfg.sequences_per_micro_batch
    ds = {
        "train_micro_batch_size_per_gpu": micro,
        "gradient_accumulation_steps": cfg.gradient_accumulation_steps,
        "train_batch_size": micro * cfg.gradient_accumulation_steps * world_size,
        "zero_optimization": {"stage": cfg.zero_stage},
        # With LoRA in bfloat16 the frozen base stays in bfloat16 and the adapters, which PEFT made float32
        # (get_peft_model's autocast_adapter_dtype), train in float32: DeepSpeed's bf16 mode would cast them to
        # bfloat16; its float32 mode leaves every parameter as it is.
        "bf16": {"enabled": dtype == torch.bfloat16 and not cfg.lora_rank, "check_grad_overflow": True},
        "steps_per_print": 10**9,
        "wall_clock_breakdown": False,
    }
    if not train:  # the frozen reference model: ZeRO-3 partitioned like the policy, no optimizer
        ds["zero_optimization"] = {"stage": 3 if cfg.zero_stage == 3 else 0}
        return ds
    ds["gradient_clipping"] = cfg.max_grad_norm
    params = {"lr": cfg.learning_rate, "betas": list(cfg.adam_betas), "eps": 1e-8, "weight_decay": cfg.weight_decay}
    if not cfg.offload_optimizer:
        params |= torch_adam_params()
    ds["optimizer"] = {"type": "AdamW", "params": params}
    if cfg.offload_optimizer:
        ds["zero_optimization"]["offload_optimizer"] = {"device": "cpu", "pin_memory": torch.cuda.is_available()}
    return ds


def lr_schedule(cfg: Config, optimizer, total_steps: int) -> torch.optim.lr_scheduler.LambdaLR:
    """CANOE's schedule, as its Hugging Face trainer builds it: ⌈warmup_ratio · `total_steps`⌉ warm-up steps (training
    steps × num_iterations) at step / warmup, so the first update's rate is 0, then cosine to 0 or constant."""
    warmup = math.ceil(cfg.warmup_ratio * total_steps)
    if cfg.lr_scheduler == "constant":
        return get_constant_schedule_with_warmup(optimizer, warmup)
    return get_cosine_schedule_with_warmup(optimizer, warmup, total_steps)
