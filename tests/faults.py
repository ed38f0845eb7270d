"""canoe.py with one fault patched in, for the end-to-end tests (launched like canoe.py, under `deepspeed`).

    deepspeed tests/faults.py --fault nan_loss --config C.toml [canoe.py's arguments]

The faults replace a function of the driver or of checkpoint.py, so the training code itself carries no test
hooks:
- `nan_loss`: every micro-batch loss is NaN (a numerical blow-up);
- `corrupt_push`: the weight push loads twice the trained values (a push that lands wrong);
- `after_step_N`: the process dies right after the checkpoint of step N (a crash or a pre-emption);
- `mid_checkpoint_N`: it dies while checkpoint N is written, before it is made the latest;
- `avx2_machine`, `amx_machine`: the CPU reports the flags of an AVX2-only or of an AMX machine, so that `dtype = "auto"`
  resolves as it would there (runtime.cpu_flags);
- `reward_error_on_rank_R`: the format reward raises on rank R (a reward written with a bug);
- `save_error_on_rank_R`: writing the policy into a checkpoint raises on rank R (a full disk);
- `record_greedy`: no fault, a record: after the last step (its push done) the rollout engine's greedy completions
  of the first training prompts go to OUTPUT_DIR/greedy.json, what the run's sampler holds at its end;
- `record_prompts`: no fault, a record: every rank appends the problems of each step's batch to
  OUTPUT_DIR/prompts-rank-R.jsonl (samples.jsonl holds rank 0's alone).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import canoe  # noqa: E402
import rewards  # noqa: E402
import rollout  # noqa: E402
from plumbing import checkpoint  # noqa: E402
from plumbing import runtime  # noqa: E402
from plumbing import weight_sync  # noqa: E402

CRASH = 17  # the exit code of a simulated crash


def nan_loss() -> None:
    original = canoe.grpo_loss

    def patched(*args, **kwargs):
        loss, metrics = original(*args, **kwargs)
        return loss * float("nan"), metrics

    canoe.grpo_loss = patched


def corrupt_push() -> None:
    original = weight_sync.push_weights

    def patched(llm, weights, **kwargs):
        return original(llm, ((name, 2 * tensor) for name, tensor in weights), **kwargs)

    weight_sync.push_weights = patched


def crash_after_step(step: int) -> None:
    original = checkpoint.save_checkpoint

    def patched(output_dir, saved_step, **kwargs):
        path = original(output_dir, saved_step, **kwargs)
        if saved_step == step:
            os._exit(CRASH)
        return path

    checkpoint.save_checkpoint = patched


def crash_mid_checkpoint(step: int) -> None:
    original = checkpoint.publish

    def patched(staging, final, keep):
        if final.name == f"step-{step:06d}":
            os._exit(CRASH)
        original(staging, final, keep)

    checkpoint.publish = patched


def error_on_rank(rank: int, names: dict, name: str, error: Exception):
    """`names[name]` (a registry, or a module's `vars`) raises `error` on rank `rank`, the others run it as it is;
    the moment it raises goes to stderr as "fault raised at T" (time.time()), for a test to time how soon every rank
    stopped."""
    original = names[name]

    def patched(*args, **kwargs):
        if int(os.environ.get("RANK", "0")) == rank:
            print(f"fault raised at {time.time()}", file=sys.stderr, flush=True)
            raise error
        return original(*args, **kwargs)

    names[name] = patched


# /proc/cpuinfo flags of the two CPU kinds the project runs on (abridged to what runtime.choose_dtype reads).
CPU_FLAGS = {"avx2": {"fpu", "sse4_2", "avx", "avx2", "fma"},
             "amx": {"fpu", "sse4_2", "avx", "avx2", "fma", "avx512f", "avx512bw", "amx_tile", "amx_bf16"}}


def fake_cpu(kind: str) -> None:
    runtime.cpu_flags = lambda: set(CPU_FLAGS[kind])


def record_greedy(prompts: int = 3) -> None:
    original = canoe.train_step

    def patched(run):
        step = original(run)
        if run.step == run.total_steps:
            rows = run.rows[:prompts]
            completions = rollout._sample(run.llm, [r["prompt_ids"] for r in rows], 1, 0, temperature=0.0, top_p=1.0,
                                          max_tokens=run.cfg.max_completion_tokens,
                                          lora_request=run.push.lora_request, prefix=run.cfg.response_prefix)
            (run.out / "greedy.json").write_text(json.dumps([{"id": row.get("id"), "output": c.text, "tokens": c.token_ids}
                                                             for row, c in zip(rows, completions)]))
        return step

    canoe.train_step = patched


def record_prompts() -> None:
    original = canoe.train_step

    def patched(run):
        step = original(run)
        with open(run.out / f"prompts-rank-{run.rank}.jsonl", "a") as f:
            f.write(json.dumps({"step": run.step, "problems": [row["problem"] for row in step.rollout.rows]}) + "\n")
        return step

    canoe.train_step = patched


def install(fault: str) -> None:
    name, _, number = fault.rpartition("_") if fault[-1].isdigit() else (fault, "", "")
    faults = {"nan_loss": nan_loss, "corrupt_push": corrupt_push,
              "after_step": lambda: crash_after_step(int(number)),
              "mid_checkpoint": lambda: crash_mid_checkpoint(int(number)),
              "reward_error_on_rank": lambda: error_on_rank(int(number), rewards.REWARD_FUNCS, "format",
                                                            ValueError("a reward with a bug")),
              "save_error_on_rank": lambda: error_on_rank(int(number), vars(checkpoint), "save_policy",
                                                          OSError(28, "No space left on device")),
              "avx2_machine": lambda: fake_cpu("avx2"), "amx_machine": lambda: fake_cpu("amx"),
              "record_greedy": record_greedy, "record_prompts": record_prompts}
    if name not in faults:
        raise SystemExit(f"unknown fault {fault!r}; known: nan_loss, corrupt_push, after_step_N, mid_checkpoint_N, "
                         "reward_error_on_rank_R, save_error_on_rank_R, avx2_machine, amx_machine, record_greedy, "
                         "record_prompts")
    faults[name]()


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--fault", required=True)
    args, rest = parser.parse_known_args()
    install(args.fault)
    canoe.main(rest)
