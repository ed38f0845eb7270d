"""How far vLLM's and the trainer's log-probabilities of the push probe lie apart with the same weights, by dtype:
the floor under the probe check's tolerance (config.SYNC_TOLERANCE).

    python bench/probe_gap.py MODEL_DIR DTYPE        # e.g. models/Qwen2.5-Coder-0.5B-Instruct bfloat16

Loads the model into a vLLM engine as training does (rollout.make_engine) and into transformers in the same dtype,
builds the probe from the first training prompt of data/synth/train.jsonl under config.toml's prompt
(weight_sync.make_probe), and prints one JSON line: the largest and the mean |Δ| over the probe's tokens. No
push happens: both hold the checkpoint's weights, so the gap is the two sets of kernels alone.
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
from training import packing  # noqa: E402
import rollout  # noqa: E402
from plumbing import weight_sync  # noqa: E402


def main(model_dir: str, dtype: str) -> None:
    runtime.single_process_defaults()
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    default = tomllib.loads((ROOT / "config.toml").read_text())
    row = data.load_jsonl(ROOT / "data" / "synth" / "train.jsonl")[0]
    text = data.render_prompt(tokenizer, row["problem"], system_prompt=default["system_prompt"],
                              response_prefix=default["response_prefix"])
    prompt, completion = weight_sync.make_probe(tokenizer, tokenizer(text, add_special_tokens=False)["input_ids"])
    llm = rollout.make_engine(model_dir, dtype=dtype, seed=0, max_model_len=1024, gpu_memory_utilization=0.5,
                              enable_sleep_mode=False)
    vllm = weight_sync.vllm_token_logprobs(llm, prompt, completion)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=getattr(torch, dtype)).eval()
    with torch.no_grad():
        trainer = packing.completion_logprobs(model, packing.pack([(prompt, [completion])], torch.device("cpu")))[0]
    gap = (vllm - trainer.float()).abs()
    print(json.dumps({"model": Path(model_dir).name, "dtype": dtype, "tokens": len(completion),
                      "max_abs_diff": round(float(gap.max()), 6), "mean_abs_diff": round(float(gap.mean()), 6)}))


if __name__ == "__main__":
    main(*sys.argv[1:3])
