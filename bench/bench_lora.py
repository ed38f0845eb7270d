"""Step time and peak memory of training runs, back to back: full fine-tuning against LoRA, one process tree each.

    python bench/bench_lora.py                      # SmolLM2 (recipes/smollm2-135m.toml) without and with LoRA,
                                                    # then the default (config.toml: Qwen2.5-Coder-0.5B, LoRA)
    python bench/bench_lora.py --steps 4 --only qwen-lora

Each run is `deepspeed canoe.py --config C` where C is its base config with `max_steps`, the output folder and
the run's own keys changed (same seed, same data, same steps). While it runs, the memory of its whole process tree
(the launcher, the training rank with its vLLM engine, the grading workers) is sampled every 0.5 s as the sum of
each process's proportional set size (PSS: a page shared by n processes counts 1/n in each, so the forked
grading workers are not counted twice). Printed per run: the seconds of the first step and the mean of the
others (from its metrics.jsonl), the peak memory and the mean reward. Nothing else should run meanwhile
(say what did beside the figures).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import threading
import time
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parent.parent
SMOLLM2 = ROOT / "recipes" / "smollm2-135m.toml"
# name: (base config, keys over it). LoRA's learning rate is 10x full fine-tuning's ("LoRA Without Regret"; lora.py).
RUNS = {
    "smollm2-full": (SMOLLM2, {}),
    "smollm2-lora": (SMOLLM2, {"lora_rank": 16, "lora_alpha": 32.0, "learning_rate": 3e-4}),
    "qwen-lora": (ROOT / "config.toml", {}),  # the default: Qwen2.5-Coder-0.5B-Instruct, LoRA rank 16, lr 5e-5
}


def tree_memory(root: psutil.Process) -> dict[int, float]:
    """Bytes per process: PSS (else RSS) of `root` and each of its descendants, by pid."""
    found = {}
    for process in [root, *root.children(recursive=True)]:
        try:
            info = process.memory_full_info()
            found[process.pid] = getattr(info, "pss", info.rss)
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            pass
    return found


def run(name: str, base: Path, keys: dict, steps: int, out: Path) -> dict:
    folder = out / name
    folder.mkdir(parents=True, exist_ok=True)
    settings = {"max_steps": steps, "max_minutes": 0.0, "output_dir": str(folder / "run"), "save_every": 0, **keys}
    lines = [f'base = "{base}"'] + [f"{k} = {json.dumps(v)}" for k, v in settings.items()]
    config = folder / "config.toml"
    config.write_text("\n".join(lines) + "\n")
    metrics = folder / "run" / "metrics.jsonl"
    metrics.unlink(missing_ok=True)
    command = [str(ROOT / ".venv" / "bin" / "deepspeed"), str(ROOT / "canoe.py"), "--config", str(config)]
    log = open(folder / "log.txt", "w")
    start = time.perf_counter()
    process = subprocess.Popen(command, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT)
    peak, done, trace = [0.0], threading.Event(), []

    def sample() -> None:
        root = psutil.Process(process.pid)
        while not done.is_set():
            per_process = tree_memory(root)
            total = sum(per_process.values())
            trace.append((round(time.perf_counter() - start, 1), round(total / 1e9, 3),
                          sorted((round(v / 1e9, 3) for v in per_process.values()), reverse=True)))
            peak[0] = max(peak[0], total)
            time.sleep(0.5)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    code = process.wait()
    done.set()
    sampler.join()
    (folder / "memory.json").write_text(json.dumps(trace))  # (seconds, GB in all, GB per process) every 0.5 s
    if code != 0:
        sys.exit(f"{name}: training failed ({code}); see {folder / 'log.txt'}")
    rows = [json.loads(line) for line in metrics.read_text().splitlines()]
    seconds = [r["time/step"] for r in rows]
    return {"name": name, "steps": len(rows), "first_step_s": seconds[0],
            "step_s": sum(seconds[1:]) / max(1, len(seconds) - 1), "peak_gb": peak[0] / 1e9,
            "wall_s": time.perf_counter() - start, "reward_mean": sum(r["reward/total"] for r in rows) / len(rows),
            "rewards": [round(r["reward/total"], 4) for r in rows]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--only", nargs="*", choices=sorted(RUNS), help="these runs only, in this order")
    parser.add_argument("--out", default="runs/bench-lora")
    args = parser.parse_args()
    results = []
    for name in args.only or RUNS:
        result = run(name, *RUNS[name], args.steps, ROOT / args.out)
        results.append(result)
        print(f"{name}: {result['steps']} steps, first step {result['first_step_s']:.1f} s, then "
              f"{result['step_s']:.1f} s per step, peak memory {result['peak_gb']:.2f} GB, "
              f"reward per step {result['rewards']}, wall {result['wall_s']:.0f} s", flush=True)
        if name == "qwen-lora":
            print(f"lora step: {result['step_s']:.1f} s, peak memory {result['peak_gb']:.1f} GB", flush=True)
    by_name = {r["name"]: r for r in results}
    if {"smollm2-full", "smollm2-lora"} <= by_name.keys():
        full, lora = by_name["smollm2-full"], by_name["smollm2-lora"]
        print(f"SmolLM2 LoRA / full: step time {lora['step_s'] / full['step_s']:.2f}x, "
              f"peak memory {lora['peak_gb'] / full['peak_gb']:.2f}x")
    (ROOT / args.out / "results.json").write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
