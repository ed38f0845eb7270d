"""A LoRA policy's push into vLLM's packed CPU engine, run in a process of its own (vLLM runs in-process here).

    python tests/lora_push.py MODEL_DIR            # the merged push
    python tests/lora_push.py MODEL_DIR adapter    # the adapter push (lora.AdapterPush)

Creates the engine as training does (`rollout.make_engine`, packed kernels), wraps a copy of the model with LoRA
adapters (lora.py) and perturbs them (B random, so the adapters change the output), then pushes twice and runs
the probe check of training (`weight_sync.check_sync`) against the adapted model's log-probabilities after each:
first the weights without the merge (the base weights under their own names: the adapters left out, as a push
that skips the merge would do), then `lora.policy_weights` (W + s·B·A). Prints one JSON line.

With `adapter` the engine gets vLLM's LoRA support (`make_engine(lora_rank=...)`, as with `lora_push = "adapter"`)
and the adapter is pushed twice, with new values of B each time, through `lora.AdapterPush` (which checks that the
engine's LoRA slot holds it bit for bit, `lora.check_adapter`, and after both the first adapter must fail that
check); after each push the probe is run with and without the adapter's request: with it, vLLM must compute the
adapted model; without it, the base. This is vLLM's LoRA path on the CPU for real (the GPU path is held by
tests/test_push_check.py's stand-in only).
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
from pathlib import Path

os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")  # a fixed KV cache, as training sets it (tests/packed_push.py)

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from plumbing import runtime  # noqa: E402,I001  (first: thread count and vLLM's in-process mode)
import torch  # noqa: E402
from transformers import AutoModelForCausalLM  # noqa: E402

from plumbing import lora  # noqa: E402
import rollout  # noqa: E402
from plumbing import weight_sync  # noqa: E402
from config import LORA_TARGETS  # noqa: E402
from packed_push import check, kernels_read_a_copy, trainer_logprobs  # noqa: E402


RANK = 8


def perturb(model, generator: torch.Generator) -> None:
    """B starts at zero; a trained adapter has moved it."""
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "lora_B" in name:
                param.copy_(0.05 * torch.randn(param.shape, generator=generator))


def main(model_dir: str, mode: str) -> None:
    runtime.single_process_defaults()
    llm = rollout.make_engine(model_dir, dtype="float32", seed=0, max_model_len=256, gpu_memory_utilization=0.5,
                              enable_sleep_mode=False, lora_rank=RANK if mode == "adapter" else 0)
    model = lora.wrap(AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32), rank=RANK, alpha=16.0,
                      dropout=0.0, target_modules=LORA_TARGETS).eval()
    generator = torch.Generator().manual_seed(0)
    vocab = model.config.vocab_size
    prompt, completion = [(7 * i + 3) % vocab for i in range(24)], [(11 * i + 5) % vocab for i in range(16)]
    if mode == "adapter":
        pushes, states = [], []
        push = lora.AdapterPush(tempfile.mkdtemp())
        for _ in range(2):
            perturb(model, generator)
            expected = trainer_logprobs(model, prompt, completion)
            states.append(lora.adapter_state(model, 2))
            lora.push(llm, model, zero_stage=2, adapter=push)  # checks the engine's LoRA slot (lora.check_adapter)
            with_adapter = weight_sync.vllm_token_logprobs(llm, prompt, completion, push.request)
            without = weight_sync.vllm_token_logprobs(llm, prompt, completion)
            pushes.append({"gap": float((with_adapter - expected).abs().max()),
                           "base_gap": float((without - expected).abs().max()),
                           "id": push.request.lora_int_id, "held": sorted(llm.llm_engine.list_loras())})
        try:  # the first push's adapter is not what the slot holds now
            lora.check_adapter(llm, model, states[0], push.count)
            stale_caught = False
        except weight_sync.WeightSyncError:
            stale_caught = True
        lora.check_adapter(llm, model, states[1], push.count)  # and the second one is, still
        print("RESULT " + json.dumps({"pushes": pushes, "stale_caught": stale_caught}), flush=True)
        return
    perturb(model, generator)
    expected = trainer_logprobs(model, prompt, completion)
    unmerged = [(lora.hf_name(name).replace(".base_layer", ""), p.detach()) for name, p in model.named_parameters()
                if "lora_" not in name]
    weight_sync.push_weights(llm, iter(unmerged))
    without = check(llm, prompt, completion, expected)
    weight_sync.push_weights(llm, lora.policy_weights(model, zero_stage=2))
    merged = check(llm, prompt, completion, expected)
    packed = llm.collective_rpc(kernels_read_a_copy)[0]
    print("RESULT " + json.dumps({"unmerged": without, "merged": merged, "packed": packed,
                                  "packed_said": weight_sync.cpu_kernels_are_packed()}), flush=True)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2] if len(sys.argv) > 2 else "merged")
