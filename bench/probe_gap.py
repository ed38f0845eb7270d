"""How far vLLM's and the trainer's log-probabilities of the push probe lie apart with the same weights, by dtype:
the floor under the probe check's tolerance (config.SYNC_TOLERANCE).

    python bench/probe_gap.py MODEL_DIR DTYPE [PROMPTS]   # e.g. models/Qwen2.5-Coder-0.5B-Instruct bfloat16 50

Loads the model into a vLLM engine as training does (rollout.make_engine) and into transformers in the same dtype,
builds a probe from each of the first PROMPTS (default 50) training prompts of data/synth/train.jsonl under
config.toml's prompt (weight_sync.make_probe: training uses the first prompt's), and prints one JSON line: over the
probes, the largest per-probe max |Δ|, its 95th percentile and median, the same of the per-probe trimmed maximum
that weight_sync.check_sync holds to the tolerance, and the mean |Δ| over every token. No push happens: both hold
the checkpoint's weights, so the gap is the two sets of kernels alone.
"""

from __future__ import annotations

import json
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from plumbing import runtime  # noqa: E402,I001  (first: thread count and vLLM's in-process mode)
import torch  # noqa: E402
from transformers import AutoModelForCausalLM, AutoTokenizer  # noqa: E402

import data  # noqa: E402
import grpo_loss  # noqa: E402
from training import packing  # noqa: E402
import rollout  # noqa: E402
from plumbing import weight_sync  # noqa: E402


def main(model_dir: str, dtype: str, prompts: int = 50) -> None:
    runtime.single_process_defaults()
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    default = tomllib.loads((ROOT / "config.toml").read_text())
    probes = []
    for row in data.load_jsonl(ROOT / "data" / "synth" / "train.jsonl")[:prompts]:
        text = data.render_prompt(tokenizer, row["problem"], system_prompt=default["system_prompt"],
                                  response_prefix=default["response_prefix"])
        probes.append(weight_sync.make_probe(tokenizer, tokenizer(text, add_special_tokens=False)["input_ids"]))
    llm = rollout.make_engine(model_dir, dtype=dtype, seed=0, max_model_len=1024, gpu_memory_utilization=0.5,
                              enable_sleep_mode=False)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=getattr(torch, dtype)).eval()
    worst, trimmed, gaps = [], [], []
    for prompt, completion in probes:
        vllm = weight_sync.vllm_token_logprobs(llm, prompt, completion)
        with torch.no_grad():
            packed = packing.pack([(prompt, [completion])], torch.device("cpu"))
            trainer = grpo_loss.completion_logprobs(model, packed)[0]
        gap = (vllm - trainer.float()).abs()
        worst.append(float(gap.max()))
        trimmed.append(weight_sync.check_sync(vllm, trainer, float("inf"))["sync/push_trimmed_abs_diff"])
        gaps.append(gap)
    worst_t, trimmed_t = torch.tensor(worst), torch.tensor(trimmed)
    print(json.dumps({"model": Path(model_dir).name, "dtype": dtype, "probes": len(probes),
                      "tokens": len(probes[0][1]), "prompt_tokens": len(probes[0][0]),
                      "max_abs_diff": round(float(worst_t.max()), 6),
                      "p95_of_probe_max": round(float(worst_t.quantile(0.95)), 6),
                      "median_of_probe_max": round(float(worst_t.median()), 6),
                      "max_trimmed": round(float(trimmed_t.max()), 6),
                      "p95_of_probe_trimmed": round(float(trimmed_t.quantile(0.95)), 6),
                      "median_of_probe_trimmed": round(float(trimmed_t.median()), 6),
                      "mean_abs_diff": round(float(torch.cat(gaps).mean()), 6)}))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], *(int(n) for n in sys.argv[3:4]))
