"""Faithfulness evaluation: greedy answers on an evaluation set, scored by normalised exact match.

    python canoe.py --config config.toml --eval                                  # the config's model and eval_file
    python canoe.py --config config.toml --eval --model runs/default/checkpoints/step-000060/policy
    python canoe.py --config config.toml --eval --eval-file ConFiQA-QA.json     # ConFiQA-style JSON works too

Every item is answered once, greedily (temperature 0), with the same system prompt and response prefix as in
training. The score of an item is the normalised exact match (data.exact_match: case, punctuation, articles and
whitespace ignored, an answer with a negation word fails) between the `<answer>` span of the output and the
gold answer, as the ConFiQA evaluation does; the format rate is the share of outputs that rewards.format_reward
accepts. Results are printed per task type (the `task` field; "all" when the data has none) and written to
OUTPUT_DIR/eval/<model>-<data>.json, with every prediction in a JSONL beside it.
"""

from __future__ import annotations

import runtime  # noqa: I001  (first: it sets the thread count and vLLM's mode before torch and vLLM load)

import json
import os
from collections import defaultdict
from pathlib import Path

from transformers import AutoTokenizer
from vllm import SamplingParams
from vllm.inputs import TokensPrompt

import data
import rollout
from rewards import format_reward


def score(rows: list[dict], outputs: list[str]) -> dict:
    """EM and format rate per task type and overall; `outputs` are the full answer texts (prefix included)."""
    groups: dict[str, list[tuple[bool, float]]] = defaultdict(list)
    formats = format_reward([[{"role": "assistant", "content": text}] for text in outputs])
    for row, text, fmt in zip(rows, outputs, formats):
        correct = data.exact_match(data.answer_span(text), data.answer_span(row["solution"]))
        for group in (row.get("task", "all"), "overall"):
            groups[group].append((correct, fmt))
    return {group: {"n": len(items), "em": sum(c for c, _ in items) / len(items),
                    "format_rate": sum(f for _, f in items) / len(items)}
            for group, items in sorted(groups.items(), key=lambda kv: (kv[0] == "overall", kv[0]))}


def main(cfg, *, model: str | None, eval_file: str | None, limit: int = 0) -> dict:
    model = model or cfg.model
    eval_file = eval_file or cfg.eval_file
    if not (Path(model) / "config.json").exists():
        raise SystemExit(f"error: model path {model!r} is not a Hugging Face model folder")
    runtime.single_process_defaults()
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", str(max(1, round(cfg.vllm_cpu_kv_cache_gib))))

    tokenizer = AutoTokenizer.from_pretrained(model)
    rows = data.load_dataset(eval_file)[: limit or None]
    rows, report = data.prepare_prompts(tokenizer, rows, cfg.max_prompt_tokens, cfg.on_long_prompt, **cfg.prompt_style())
    print(f"eval data: {eval_file}: {report.summary()}")

    dtype = str(runtime.resolve_dtype(cfg.dtype)).removeprefix("torch.")
    llm = rollout.make_engine(model, dtype=dtype, seed=cfg.seed, max_model_len=cfg.max_prompt_tokens + cfg.max_completion_tokens,
                              gpu_memory_utilization=cfg.vllm_gpu_memory_utilization, enable_sleep_mode=False)
    greedy = SamplingParams(n=1, temperature=0.0, max_tokens=cfg.max_completion_tokens)
    results = llm.generate([TokensPrompt(prompt_token_ids=r["prompt_ids"]) for r in rows], greedy, use_tqdm=True)
    outputs = [cfg.response_prefix + r.outputs[0].text for r in results]
    scores = score(rows, outputs)

    print(f"\n{'task':<16}{'n':>6}{'EM':>8}{'format':>8}")
    for group, s in scores.items():
        print(f"{group:<16}{s['n']:>6}{s['em']:>8.3f}{s['format_rate']:>8.3f}")
    out = Path(cfg.output_dir) / "eval"
    out.mkdir(parents=True, exist_ok=True)
    name = f"{Path(model).name if Path(model).name != 'policy' else Path(model).parent.name}-{Path(eval_file).stem}"
    (out / f"{name}.json").write_text(json.dumps({"model": model, "eval_file": eval_file, "scores": scores}, indent=1))
    with open(out / f"{name}.predictions.jsonl", "w") as f:
        for row, text in zip(rows, outputs):
            f.write(json.dumps({"id": row.get("id"), "task": row.get("task"), "solution": row["solution"],
                                "output": text}) + "\n")
    print(f"written to {out / (name + '.json')}")
    return scores
