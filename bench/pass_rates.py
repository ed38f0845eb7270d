"""Where the learning signal is: per task type, how often a policy's samples are formatted and correct, and in how
many groups the accuracy reward varies (GRPO learns nothing from a group whose rewards are all equal).

    .venv/bin/python bench/pass_rates.py [--config config.toml] [--model DIR] [--data FILE] [--per-task 30]

Samples exactly as training does (`sample_as_training`: training's own rollout of its first step, the config's
system prompt, response prefix, temperature, top_p, G and completion length; vLLM with the run's seed), stage 1
only, on the first `--per-task` prompts of each task type (the `task` field; "all" when there is none); the signal
check (bench/reward_signal.py) samples the same way. Prints, per task type: prompts, the share of samples that
`format_reward` accepts, the share that `accuracy_reward` accepts, and the share of groups in which the accuracy
reward is not the same for all G samples ("accuracy signal"), as `signal/accuracy` is logged during training.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import tempfile
import warnings
from collections import defaultdict
from pathlib import Path
from types import SimpleNamespace

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from plumbing import runtime  # noqa: E402,I001  (first: thread count and vLLM's in-process mode)

from transformers import AutoTokenizer  # noqa: E402

import data  # noqa: E402
import rollout  # noqa: E402
from config import load_config  # noqa: E402
from grading.grader import MathGrader  # noqa: E402


def first_per_task(rows: list[dict], per_task: int) -> list[dict]:
    """The first `per_task` rows of each task type, in file order."""
    taken: dict[str, int] = defaultdict(int)
    chosen = []
    for row in rows:
        task = row.get("task", "all")
        if taken[task] < per_task:
            taken[task] += 1
            chosen.append(row)
    return chosen


def pass_rates(rows: list[dict], texts: list[str], accuracy: list[float], formats: list[float], G: int) -> dict:
    """Per task type (and overall): prompts, format rate, accuracy rate, share of groups with an accuracy signal.
    `texts`, `accuracy` and `formats` hold G entries per row, prompt-major."""
    groups: dict[str, list[tuple[list[float], list[float]]]] = defaultdict(list)
    for b, row in enumerate(rows):
        item = (accuracy[b * G : (b + 1) * G], formats[b * G : (b + 1) * G])
        for name in (row.get("task", "all"), "overall"):
            groups[name].append(item)
    table = {}
    for name, items in sorted(groups.items(), key=lambda kv: (kv[0] == "overall", kv[0])):
        samples = len(items) * G
        table[name] = {
            "prompts": len(items),
            "format": sum(sum(f) for _, f in items) / samples,
            "accuracy": sum(sum(a) for a, _ in items) / samples,
            "accuracy_signal": sum(max(a) != min(a) for a, _ in items) / len(items),
        }
    return table


def training_prompts(cfg, tokenizer, path: str, per_task: int) -> list[dict]:
    """The first `per_task` rows of each task type of `path`, rendered as training renders them (a prompt longer
    than max_prompt_tokens dropped)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", data.PromptOverflowWarning)
        rows, _ = data.prepare_prompts(tokenizer, first_per_task(data.load_dataset(path), per_task),
                                       cfg.max_prompt_tokens, "drop", **cfg.prompt_style())
    return rows


def sample_as_training(cfg, model: str, tokenizer, rows: list[dict], log_dir: Path) -> rollout.Rollout:
    """Every row's G completions, its stage 2 where the config has one and the config's rewards of each: the
    trainer's own rollout of step 0 on rank 0 (canoe.rollout_batch, all rows as one batch), from an engine made as
    the trainer makes it (its seed, dtype, KV cache, a context for a prompt and two completions) of `model`."""
    import canoe

    runtime.single_process_defaults()
    llm = rollout.make_engine(model, dtype=str(runtime.resolve_dtype(cfg.dtype)).removeprefix("torch."), seed=cfg.seed,
                              max_model_len=cfg.max_prompt_tokens + 2 * cfg.max_completion_tokens,
                              gpu_memory_utilization=cfg.vllm_gpu_memory_utilization, enable_sleep_mode=False,
                              cpu_kv_cache_gib=cfg.vllm_cpu_kv_cache_gib, trainer_seed=cfg.seed)
    with MathGrader(workers=cfg.reward_workers, deadline_s=cfg.reward_deadline_s) as grader:
        run = SimpleNamespace(cfg=cfg, rows=rows, prompt_sampler=SimpleNamespace(next_batch=lambda: range(len(rows))),
                              step=0, rank=0, push=SimpleNamespace(lora_request=None), llm=llm, tokenizer=tokenizer,
                              grader=grader, out=log_dir, times={})
        return canoe.rollout_batch(run)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default=str(ROOT / "config.toml"))
    parser.add_argument("--model", help="policy folder (default: the config's model)")
    parser.add_argument("--data", help="JSONL in the project's format (default: the config's train_file)")
    parser.add_argument("--per-task", type=int, default=30, help="prompts per task type")
    args = parser.parse_args()
    cfg = load_config(args.config)
    model, path = args.model or cfg.model, args.data or cfg.train_file
    tokenizer = AutoTokenizer.from_pretrained(model)
    rows = training_prompts(cfg, tokenizer, path, args.per_task)
    stage1 = dataclasses.replace(cfg, rewards={"accuracy": 1.0, "format": 1.0}, dual=False)
    with tempfile.TemporaryDirectory() as log_dir:
        batch = sample_as_training(stage1, model, tokenizer, rows, Path(log_dir))
    G = cfg.num_generations
    accuracy, formats = batch.scores[:, 0].tolist(), batch.scores[:, 1].tolist()
    table = pass_rates(rows, [c.text for c in batch.completions], accuracy, formats, G)

    print(f"\n{model} on {path}: G = {G}, temperature {cfg.temperature}, {args.per_task} prompts per task type")
    print(f"{'task':<16}{'prompts':>8}{'format':>9}{'accuracy':>10}{'acc. signal':>13}")
    for name, row in table.items():
        print(f"{name:<16}{row['prompts']:>8}{row['format']:>9.3f}{row['accuracy']:>10.3f}{row['accuracy_signal']:>13.3f}")


if __name__ == "__main__":
    main()
