"""The command line of canoe.py: training, and the commands that read the same config without training.

    deepspeed canoe.py --config config.toml [--resume] [--verbose]     # train (canoe.train)
    python canoe.py --config config.toml --eval [--model DIR] [--eval-file F] [--limit N]   # evaluation/evaluate.py
    python canoe.py --config config.toml --eval --suite confiqa --eval-file F [--predictions P]
    python canoe.py --config config.toml --plan-memory [--gpu-gib 80] [--world-size 8]     # plumbing/memory_plan.py
    python canoe.py --describe-config                                     # every config key, its meaning and default
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Sequence

import data
from config import ConfigError, describe_config, load_config
from evaluation import evaluate, suites
from plumbing import memory_plan


def main(argv: Sequence[str] | None, train: Callable[..., None]) -> None:
    """Parse `argv` and run what it asks: `train(cfg, resume=..., verbose=...)` (canoe.train) or a command that needs
    no trainer. A mistake in the user's input (config, data, model architecture) exits with its message."""
    parser = argparse.ArgumentParser(description="CANOE Dual-GRPO trainer",
                                     formatter_class=argparse.RawTextHelpFormatter)
    parser.add_argument("--config", default="config.toml", help="TOML config (see --describe-config)")
    parser.add_argument("--resume", action="store_true", help="continue from OUTPUT_DIR/checkpoints/latest")
    parser.add_argument("--eval", action="store_true", help="evaluate instead of training (see evaluate.py)")
    parser.add_argument("--model", help="with --eval: the model folder to evaluate (default: config's model)")
    parser.add_argument("--eval-file", help="with --eval: the data (default: config's eval_file), or the suite's file")
    parser.add_argument("--limit", type=int, default=0, help="with --eval: only the first N items")
    parser.add_argument("--suite", choices=suites.SUITES, help="with --eval: a paper benchmark (suites.py)")
    parser.add_argument("--predictions", help="with --eval --suite: score these outputs; no model is loaded")
    parser.add_argument("--sample", action="store_true", help="with --eval: the model's own sampling settings, seeded")
    parser.add_argument("--indent-system-prompt", action=argparse.BooleanOptionalAction,
                        help="with --eval: the official evaluation's indented system prompt (default: on with --suite)")
    parser.add_argument("--verbose", action="store_true",
                        help="training: vLLM's log on the terminal too (always in vllm.log)")
    parser.add_argument("--describe-config", action="store_true", help="print every config key and exit")
    parser.add_argument("--plan-memory", action="store_true",
                        help="print the config's memory plan per GPU (memory_plan.py) and exit; needs no GPU")
    parser.add_argument("--gpu-gib", type=float, default=80.0, help="with --plan-memory: memory of one GPU, GiB")
    parser.add_argument("--world-size", type=int, default=8, help="with --plan-memory: number of GPUs (ranks)")
    parser.add_argument("--local_rank", type=int, default=None, help=argparse.SUPPRESS)  # added by the launcher
    args = parser.parse_args(argv)
    if not args.eval and (args.suite or args.predictions or args.sample):
        parser.error("--suite, --predictions and --sample belong to --eval")
    if args.describe_config:
        print(describe_config())
        return
    try:
        cfg = load_config(args.config)
        if args.plan_memory:
            plan = memory_plan.plan_memory(cfg, memory_plan.architecture(cfg.model), world_size=args.world_size,
                                           total_bytes=args.gpu_gib * memory_plan.GIB, sleep=cfg.vllm_sleep)
            print(f"{args.config} on {args.world_size} GPUs of {args.gpu_gib:g} GiB:\n{plan.table()}")
        elif args.eval:
            evaluate.main(cfg, model=args.model, eval_file=args.eval_file, limit=args.limit, suite=args.suite,
                          predictions=args.predictions, sample=args.sample,
                          indent_system_prompt=args.indent_system_prompt)
        else:
            train(cfg, resume=args.resume, verbose=args.verbose)
    except (ConfigError, data.DataError, memory_plan.ArchitectureError) as error:  # the user's input, not a bug
        raise SystemExit(f"error: {error}") from None
