"""Our side of bench/bench_step.py: the real training step of canoe.py, driven one step per stdin command.

Protocol (see bench_step.py): prints `READY` once set up; `step` → one optimizer step (stage 1, stage 2, rewards,
reference log-probs, forward/backward, optimizer, weight push and its verification) → one JSON line
`{"seconds": s, "phases": {...}}`; `quit` → `{"peak_rss_mib": x}` and exit. Everything else goes to stderr.

The batch: `--prompts` prompts per step in micro-batches of `--micro-prompts` prompts (2 = 14 sequences, as TRL's
side by default), `--generations` samples each, `--max-new-tokens`, β, learning rate, LoRA and dtype as given;
ZeRO-2, one rank.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import resource
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

PHASES = ("stage1", "stage2", "rewards", "ref_logprobs", "forward_backward", "optimizer", "weight_push")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=str(ROOT / "models" / "SmolLM2-135M-Instruct"))
    parser.add_argument("--data", required=True)
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument("--prompts", type=int, default=4)
    parser.add_argument("--generations", type=int, default=7)
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--beta", type=float, default=0.04)
    parser.add_argument("--lr", type=float, default=1e-6)
    parser.add_argument("--temperature", type=float, default=0.9)
    parser.add_argument("--micro-prompts", type=int, default=2, help="prompts per forward/backward micro-batch")
    parser.add_argument("--lora-rank", type=int, default=0, help="0: full fine-tuning")
    parser.add_argument("--lora-alpha", type=float, default=32.0)
    parser.add_argument("--dtype", default="float32")
    args = parser.parse_args()
    if args.prompts % args.micro_prompts:
        raise SystemExit("--prompts must be a multiple of --micro-prompts")

    import canoe
    from config import Config
    from plumbing import runtime

    per_micro = args.micro_prompts
    cfg = Config(
        model=args.model, train_file=args.data, output_dir=str(ROOT / "runs" / "bench" / "ours"), seed=args.seed,
        num_generations=args.generations, max_completion_tokens=args.max_new_tokens, temperature=args.temperature,
        prompts_per_device=per_micro, gradient_accumulation_steps=args.prompts // per_micro, beta=args.beta,
        learning_rate=args.lr, warmup_ratio=0.0, lr_scheduler="constant", max_steps=10**6, max_prompt_tokens=512,
        lora_rank=args.lora_rank, lora_alpha=args.lora_alpha, dtype=args.dtype,
    )
    protocol = sys.stdout
    with contextlib.redirect_stdout(sys.stderr):  # only protocol lines on stdout
        run = canoe.setup(cfg, resume=False)
    print("READY", file=protocol, flush=True)
    for line in sys.stdin:
        command = line.strip()
        if command == "step":
            start = time.perf_counter()
            with contextlib.redirect_stdout(sys.stderr):
                metrics = canoe.run_step(run)
            seconds = time.perf_counter() - start
            phases = {name: metrics.get(f"time/{name}", 0.0) for name in PHASES}
            print(json.dumps({"seconds": seconds, "phases": phases,
                              "reward_total": metrics["reward/total"]}), file=protocol, flush=True)
        elif command == "quit":
            peak_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
            print(json.dumps({"peak_rss_mib": peak_kib / 1024}), file=protocol, flush=True)
            run.grader.close()
            break
        elif command:
            print(json.dumps({"error": f"unknown command {command!r}"}), file=protocol, flush=True)
    runtime.leave_process_group()


if __name__ == "__main__":
    main()
