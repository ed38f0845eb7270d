"""A LoRA policy's push into vLLM's packed CPU engine, run in a process of its own (vLLM runs in-process here).

    python tests/lora_push.py MODEL_DIR

Creates the engine as training does (`rollout.make_engine`, packed kernels), wraps a copy of the model with LoRA
adapters (lora.py) and perturbs them (B random, so the adapters change the output), then pushes twice and runs
the probe check of training (`rollout.check_sync`) against the adapted model's log-probabilities after each:
first the weights without the merge (the base weights under their own names: the adapters left out, as a push
that skips the merge would do), then `lora.policy_weights` (W + s·B·A). Prints one JSON line.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")  # a fixed KV cache, as training sets it (tests/packed_push.py)

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import runtime  # noqa: E402,I001  (first: thread count and vLLM's in-process mode)
import torch  # noqa: E402
from transformers import AutoModelForCausalLM  # noqa: E402

import lora  # noqa: E402
import rollout  # noqa: E402
from config import LORA_TARGETS  # noqa: E402
from packed_push import check, trainer_logprobs  # noqa: E402


def main(model_dir: str) -> None:
    runtime.single_process_defaults()
    llm = rollout.make_engine(model_dir, dtype="float32", seed=0, max_model_len=256, gpu_memory_utilization=0.5,
                              enable_sleep_mode=False)
    model = lora.wrap(AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32), rank=8, alpha=16.0,
                      dropout=0.0, target_modules=LORA_TARGETS).eval()
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "lora_B" in name:  # B starts at zero; a trained adapter has moved it
                param.copy_(0.05 * torch.randn(param.shape, generator=generator))
    vocab = model.config.vocab_size
    prompt, completion = [(7 * i + 3) % vocab for i in range(24)], [(11 * i + 5) % vocab for i in range(16)]
    expected = trainer_logprobs(model, prompt, completion)
    unmerged = [(lora.hf_name(name).replace(".base_layer", ""), p.detach()) for name, p in model.named_parameters()
                if "lora_" not in name]
    rollout.push_weights(llm, iter(unmerged))
    without = check(llm, prompt, completion, expected)
    rollout.push_weights(llm, lora.policy_weights(model, zero_stage=2))
    merged = check(llm, prompt, completion, expected)
    print("RESULT " + json.dumps({"unmerged": without, "merged": merged, "packed": rollout.cpu_kernels_are_packed()}),
          flush=True)


if __name__ == "__main__":
    main(sys.argv[1])
