"""Where the learning signal is: per task type, how often a policy's samples are formatted and correct, and in how
many groups the accuracy reward varies (GRPO learns nothing from a group whose rewards are all equal).

    .venv/bin/python bench/pass_rates.py [--config config.toml] [--model DIR] [--data FILE] [--per-task 30]

Samples exactly as training does (the config's system prompt, response prefix, temperature, top_p, G and
completion length; vLLM with the run's seed), stage 1 only, on the first `--per-task` prompts of each task type
(the `task` field; "all" when there is none). Prints, per task type: prompts, the share of samples that
`format_reward` accepts, the share that `accuracy_reward` accepts, and the share of groups in which the accuracy
reward is not the same for all G samples ("accuracy signal"), as `signal/accuracy` is logged during training.
"""

from __future__ import annotations

import argparse
import sys
import warnings
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from plumbing import runtime  # noqa: E402,I001  (first: thread count and vLLM's in-process mode)

from transformers import AutoTokenizer  # noqa: E402

import data  # noqa: E402
import rollout  # noqa: E402
from config import load_config  # noqa: E402
from grading.grader import MathGrader  # noqa: E402
from rewards import accuracy_reward, format_reward  # noqa: E402


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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default=str(ROOT / "config.toml"))
    parser.add_argument("--model", help="policy folder (default: the config's model)")
    parser.add_argument("--data", help="JSONL in the project's format (default: the config's train_file)")
    parser.add_argument("--per-task", type=int, default=30, help="prompts per task type")
    args = parser.parse_args()
    cfg = load_config(args.config)
    model, path = args.model or cfg.model, args.data or cfg.train_file
    runtime.single_process_defaults()

    tokenizer = AutoTokenizer.from_pretrained(model)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", data.PromptOverflowWarning)
        rows, _ = data.prepare_prompts(tokenizer, first_per_task(data.load_dataset(path), args.per_task),
                                       cfg.max_prompt_tokens, "drop", **cfg.prompt_style())
    llm = rollout.make_engine(model, dtype=str(runtime.resolve_dtype(cfg.dtype)).removeprefix("torch."), seed=cfg.seed,
                              max_model_len=cfg.max_prompt_tokens + cfg.max_completion_tokens,
                              gpu_memory_utilization=cfg.vllm_gpu_memory_utilization, enable_sleep_mode=False,
                              cpu_kv_cache_gib=cfg.vllm_cpu_kv_cache_gib)
    G = cfg.num_generations
    completions = rollout.generate_stage1(llm, [r["prompt_ids"] for r in rows], num_generations=G,
                                          temperature=cfg.temperature, top_p=cfg.top_p,
                                          max_tokens=cfg.max_completion_tokens, seed=cfg.seed, step=0, rank=0)
    texts = [cfg.response_prefix + c.text for c in completions]
    messages = [[{"role": "assistant", "content": t}] for t in texts]
    grader = MathGrader(workers=cfg.reward_workers, deadline_s=cfg.reward_deadline_s)
    accuracy = accuracy_reward(messages, solution=[r["solution"] for r in rows for _ in range(G)], grader=grader)
    grader.close()
    table = pass_rates(rows, texts, accuracy, format_reward(messages), G)

    print(f"\n{model} on {path}: G = {G}, temperature {cfg.temperature}, {args.per_task} prompts per task type")
    print(f"{'task':<16}{'prompts':>8}{'format':>9}{'accuracy':>10}{'acc. signal':>13}")
    for name, row in table.items():
        print(f"{name:<16}{row['prompts']:>8}{row['format']:>9.3f}{row['accuracy']:>10.3f}{row['accuracy_signal']:>13.3f}")


if __name__ == "__main__":
    main()
