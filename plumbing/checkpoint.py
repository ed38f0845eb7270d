"""Atomic checkpoints: the policy in Hugging Face format, DeepSpeed's optimizer/scheduler state, RNG, data position.

Layout of `OUTPUT_DIR/checkpoints/`:

    step-000004/
        policy/              a Hugging Face model folder for transformers and vLLM (with LoRA: W + s·B·A merged)
        adapter/             with LoRA only: the adapter in PEFT's format, `PeftModel.from_pretrained(base, path)`
        deepspeed/state/     DeepSpeed's own files (weights, optimizer and LR scheduler state, per rank); with
                             LoRA without the frozen base weights (they are the config's `model`)
        trainer_state.json   step, data sampler state, counters
        rng/rank-K.pt        Python and torch CPU (and CUDA) RNG states of rank K
    latest                   the name of the newest complete checkpoint

A checkpoint is written into `step-N.tmp/`, renamed to `step-N/` once every rank has written, and only then
named by `latest` (replaced atomically): a crash mid-write leaves the previous checkpoint and `latest` untouched.
"""

from __future__ import annotations

import json
import os
import random
import shutil
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from plumbing import lora, weight_sync


def _barrier() -> None:
    if dist.is_initialized():
        dist.barrier()


def latest_checkpoint(output_dir: str | Path) -> Path | None:
    """The newest complete checkpoint of a run, or None."""
    pointer = Path(output_dir) / "checkpoints" / "latest"
    if not pointer.exists():
        return None
    path = pointer.parent / pointer.read_text().strip()
    if not (path / "trainer_state.json").exists():
        raise FileNotFoundError(f"{pointer} names {path.name}, which is not a complete checkpoint")
    return path


def save_policy(engine, tokenizer, zero_stage: int, target: Path, rank: int) -> None:
    """Write the policy as a Hugging Face model folder (rank 0 writes; every rank takes part in ZeRO-3 gathers).
    With LoRA: the merged weights, saved through the base model, and the adapter beside it (`adapter/`)."""
    model = engine.module
    weights = lora.policy_weights if lora.is_lora(model) else weight_sync.iter_full_parameters
    # No copy on the CPU: ZeRO-3's gathered tensors and LoRA's merged ones are copies already, and ZeRO-2's
    # parameters do not change while this writes.
    state = {name: tensor.detach().to("cpu") for name, tensor in weights(model, zero_stage) if rank == 0}
    if lora.is_lora(model):
        adapter = lora.adapter_state(model, zero_stage)
        if rank == 0:
            model.save_pretrained(str(target.parent / "adapter"), state_dict=adapter)
        model = model.get_base_model()
    if rank == 0:
        model.save_pretrained(target, state_dict=state)
        tokenizer.save_pretrained(target)


def save_checkpoint(output_dir: str | Path, step: int, *, engine, tokenizer, zero_stage: int, trainer_state: dict,
                    rank: int, keep: int) -> Path:
    """Write checkpoint `step` atomically (all ranks call this) and keep only the newest `keep` checkpoints."""
    root = Path(output_dir) / "checkpoints"
    final = root / f"step-{step:06d}"
    staging = root / f"step-{step:06d}.tmp"
    if rank == 0:
        shutil.rmtree(staging, ignore_errors=True)
        staging.mkdir(parents=True)
    _barrier()
    save_policy(engine, tokenizer, zero_stage, staging / "policy", rank)
    frozen_left_out = lora.is_lora(engine.module)
    engine.save_checkpoint(str(staging / "deepspeed"), tag="state", exclude_frozen_parameters=frozen_left_out)
    (staging / "rng").mkdir(exist_ok=True)
    torch.save(rng_state(), staging / "rng" / f"rank-{rank}.pt")
    if rank == 0:
        (staging / "trainer_state.json").write_text(json.dumps(trainer_state, indent=1))
    _barrier()
    if rank == 0:
        publish(staging, final, keep)
    _barrier()
    return final


def publish(staging: Path, final: Path, keep: int) -> None:
    """Make a fully written checkpoint the latest: rename it, move the pointer, drop the oldest ones (rank 0)."""
    root = final.parent
    shutil.rmtree(final, ignore_errors=True)
    os.replace(staging, final)
    pointer_tmp = root / "latest.tmp"
    pointer_tmp.write_text(final.name)
    os.replace(pointer_tmp, root / "latest")
    complete = sorted(p for p in root.glob("step-*") if p.is_dir() and not p.name.endswith(".tmp"))
    for old in complete[:-keep]:
        shutil.rmtree(old)
    for stale in root.glob("step-*.tmp"):
        shutil.rmtree(stale, ignore_errors=True)


def load_checkpoint(path: Path, *, engine, rank: int) -> dict:
    """Restore DeepSpeed state and this rank's RNG from `path`; returns the trainer state."""
    # With LoRA the checkpoint holds no frozen base weight: the ones loaded from the config's model stay.
    strict = not lora.is_lora(engine.module)
    loaded, _ = engine.load_checkpoint(str(path / "deepspeed"), tag="state", load_optimizer_states=True,
                                       load_lr_scheduler_states=True, load_module_strict=strict)
    if loaded is None:
        raise RuntimeError(f"DeepSpeed could not load the checkpoint in {path / 'deepspeed'}")
    rng_file = path / "rng" / f"rank-{rank}.pt"
    if rng_file.exists():
        set_rng_state(torch.load(rng_file, weights_only=False))
    return json.loads((path / "trainer_state.json").read_text())


def rng_state() -> dict[str, Any]:
    state = {"python": random.getstate(), "torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    random.setstate(state["python"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state(state["cuda"])
