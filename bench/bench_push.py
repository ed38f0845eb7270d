"""Where a weight push's seconds go: the parts of the driver's push (training/push.py) timed one by one on a real set-up.

    .venv/bin/python bench/bench_push.py [--config config.toml] [--pushes 6] [--dtype auto]

Sets the run up as `canoe.py` does (one rank, the config's model, LoRA or not), then, `--pushes` times: moves the
trainable weights a little (LoRA's B, or every parameter, by a random step of the size Adam's first step takes:
±lr per entry), and times each part of the push apart:

- `weights`: making the tensors that are sent (under LoRA the merge W + s·B·A of the adapted projections, with the
  update measurement outside float32; otherwise reading every parameter);
- `sums`: the trainer's weight sums of what is sent (outside float32 only, as in training);
- `reload`: vLLM loading them in place (with the re-pack of its CPU kernels where they are packed);
- `engine_sums`: the engine's weight sums of what was reloaded, read back through `collective_rpc` and checked
  (outside float32 only);
- `probe_trainer`, `probe_vllm`: the trainer's and vLLM's log-probabilities of the probe completion;
- `push_and_verify`: the whole push, `run.push(run.engine)`, as a training step logs it (`time/weight_push`).

Prints the median of each over the pushes, in seconds. Nothing is written but the run folder the set-up makes.
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default=str(ROOT / "config.toml"))
    parser.add_argument("--pushes", type=int, default=6)
    parser.add_argument("--dtype", default=None, help="override the config's dtype (auto, float32, bfloat16)")
    args = parser.parse_args()

    import dataclasses

    import torch

    import canoe
    from config import load_config
    from plumbing import lora, runtime, weight_sync
    import grpo_loss
    from training import packing

    cfg = load_config(args.config)
    cfg = dataclasses.replace(cfg, output_dir=str(ROOT / "runs" / "bench" / "push"), max_steps=args.pushes,
                              **({"dtype": args.dtype} if args.dtype else {}))
    with contextlib.redirect_stdout(sys.stderr):
        run = canoe.setup(cfg, resume=False)
    model = run.engine.module
    is_lora = lora.is_lora(model)
    trained = [p for p in model.parameters() if p.requires_grad and (not is_lora or "lora_B" in _name(model, p))]
    generator = torch.Generator().manual_seed(0)
    times: dict[str, list[float]] = {}

    def clock(part: str, function):
        start = time.perf_counter()
        result = function()
        times.setdefault(part, []).append(time.perf_counter() - start)
        return result

    for _ in range(args.pushes):
        with torch.no_grad():  # a step of Adam's size: ±lr on every trained entry
            for p in trained:
                p.add_(torch.randint(0, 2, p.shape, generator=generator).to(p.dtype).mul_(2).sub_(1) * cfg.learning_rate)
        if is_lora:
            weights = clock("weights", lambda: list(lora.policy_weights(model, cfg.zero_stage, run.push.merged,
                                                                        changed_only=run.push.merged is not None)))
        else:
            weights = clock("weights", lambda: list(weight_sync.iter_full_parameters(model, cfg.zero_stage)))
        partial = is_lora and run.push.merged is not None
        if run.push.checksums:
            sums = weight_sync.WeightSums(scope=frozenset(lora.hf_name(name) for name in lora.changed_modules(model))
                                          if partial else None)
            clock("sums", lambda: [sums.add_as_held(tensor, run.push.dtype, name) for name, tensor in weights])
        clock("reload", lambda: weight_sync.push_weights(run.llm, iter(weights), repack=False if partial else None,
                                                         partial=partial))
        if run.push.checksums:
            engine = clock("engine_sums", lambda: weight_sync.engine_weight_sums(run.llm, sums.scope))
            weight_sync.check_weight_sums(sums, engine)
        prompt, completion = run.push.probe

        def probe_trainer():
            run.engine.eval()
            with torch.no_grad():
                grpo_loss.completion_logprobs(run.engine, packing.pack([(prompt, [completion])], run.device))
            run.engine.train()

        clock("probe_trainer", probe_trainer)
        clock("probe_vllm", lambda: weight_sync.vllm_token_logprobs(run.llm, prompt, completion, None))
        clock("push_and_verify", lambda: run.push(run.engine))
    dtype = run.push.dtype
    print(f"push parts ({cfg.model}, {'LoRA' if is_lora else 'full'}, {str(dtype).removeprefix('torch.')}, "
          f"median of {args.pushes} pushes, seconds):")
    for part, seconds in times.items():
        print(f"  {part:16s} {statistics.median(seconds):7.3f}   ({', '.join(f'{s:.2f}' for s in seconds)})")
    run.grader.close()
    runtime.leave_process_group()


def _name(model, parameter) -> str:
    return next(name for name, p in model.named_parameters() if p is parameter)


if __name__ == "__main__":
    main()
