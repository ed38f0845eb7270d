"""vLLM's log-probabilities of its own samples at a temperature, against the trainer's, in a process of its own.

    python tests/tempered_rollout.py MODEL_DIR [TEMPERATURE]

Samples a short rollout from the engine as training makes it (`rollout.make_engine`, float32) through
`rollout.generate_stage1`, then scores the sampled tokens with the transformers model through
`grpo_loss.completion_logprobs` on the packed micro-batch, once at the sampling temperature and once at τ = 1.
Prints one JSON line: for each, whether the probe check (`weight_sync.check_sync` at float32's tolerance) passes
on the rollout's tokens, and the largest gap; and whether the same rollout asked without log-probabilities (as
stage 2 asks) draws the same tokens.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")  # a fixed KV cache, as training sets it

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from plumbing import runtime  # noqa: E402,I001  (first: thread count and vLLM's in-process mode)
import torch  # noqa: E402
from transformers import AutoModelForCausalLM  # noqa: E402

import grpo_loss  # noqa: E402
import rollout  # noqa: E402
from config import SYNC_TOLERANCE  # noqa: E402
from plumbing import weight_sync  # noqa: E402
from training import packing  # noqa: E402


def main(model_dir: str, temperature: str = "0.7") -> None:
    runtime.single_process_defaults()
    tau = float(temperature)
    llm = rollout.make_engine(model_dir, dtype="float32", seed=0, max_model_len=256, gpu_memory_utilization=0.5,
                              enable_sleep_mode=False)
    prompts = [[(7 * i + 3) % 1000 + 100 for i in range(12)], [(11 * i + 5) % 1000 + 100 for i in range(9)]]
    completions = rollout.generate_stage1(llm, prompts, num_generations=2, temperature=tau, top_p=1.0, max_tokens=16,
                                          seed=0, step=0, rank=0)  # prompt-major: 2 prompts × 2 samples
    vllm = torch.tensor([lp for c in completions for lp in c.logprobs])  # (T,) the sampled tokens, in order
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    packed = packing.pack_micro_batch([prompts[i // 2] for i in range(4)], [c.token_ids for c in completions])
    result = {"tokens": len(vllm)}
    for name, scale in (("tempered", tau), ("unscaled", 1.0)):
        with torch.no_grad():
            trainer = grpo_loss.completion_logprobs(model, packed, scale)  # (4, C)
        trainer = trainer[packed.completion_mask.bool()]  # (T,) completion after completion
        try:
            weight_sync.check_sync(vllm, trainer, SYNC_TOLERANCE[torch.float32])
            passed = True
        except weight_sync.WeightSyncError:
            passed = False
        result[name] = {"passed": passed, "gap": float((vllm - trainer).abs().max())}
    # Stage 2 asks for no log-probabilities: the same draw, none returned.
    again = rollout._sample(llm, prompts, 2, rollout.request_seed(0, "stage1", 0, 0), temperature=tau, top_p=1.0,
                            max_tokens=16, logprobs=False)
    result["without_logprobs"] = {"same_tokens": [c.token_ids for c in again] == [c.token_ids for c in completions],
                                  "logprobs": sum(len(c.logprobs) for c in again)}
    print("RESULT " + json.dumps(result), flush=True)


if __name__ == "__main__":
    main(*sys.argv[1:3])
