"""A weight push into vLLM's packed CPU engine, run in a process of its own (vLLM runs in-process here).

    python tests/packed_push.py MODEL_DIR [DTYPE]     # float32 (the default) or bfloat16

Creates the engine as training does (`rollout.make_engine`: vLLM's packed oneDNN/SGL kernels, weights kept),
perturbs a copy of the model, and pushes it twice: first without rebuilding the packed kernels, then with it
(what `weight_sync.push_weights` does by default on the CPU). After each push the probe check of training
(`weight_sync.check_sync`, at the dtype's tolerance) compares vLLM's log-probabilities of a fixed completion with
the perturbed model's. Prints one JSON line: the probe's trimmed and largest gap after each push, and whether the
check passed.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

# A fixed KV cache (GiB), as training sets it: without one, vLLM's CPU worker asks for gpu_memory_utilization × the
# host's memory to be free at start-up, which a busy machine may not have.
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from plumbing import runtime  # noqa: E402,I001  (first: thread count and vLLM's in-process mode)
import torch  # noqa: E402
from transformers import AutoModelForCausalLM  # noqa: E402

import rollout  # noqa: E402
from plumbing import weight_sync  # noqa: E402

from config import SYNC_TOLERANCE  # noqa: E402


def trainer_logprobs(model, prompt: list[int], completion: list[int]) -> torch.Tensor:
    """`(T,)` log π(completion_t | prompt, completion_<t) from the transformers model."""
    ids = torch.tensor([prompt + completion])  # (1, P + T)
    with torch.no_grad():
        logits = model(ids).logits[0, len(prompt) - 1 : -1].float()  # (T, V)
    return logits.log_softmax(-1).gather(-1, torch.tensor(completion)[:, None])[:, 0]  # (T,)


def kernels_read_a_copy(worker) -> bool:
    """Whether the engine's linear kernels compute from a copy of their weight, read from vLLM itself (on each worker,
    `collective_rpc`): given a zero weight, the first linear layer's kernel still gives x·Wᵀ, not 0."""
    layer = next(m for m in worker.model_runner.model.modules() if hasattr(m, "cpu_linear") and m.weight.numel())
    x = torch.ones(1, layer.weight.shape[1], dtype=layer.weight.dtype)  # (1, K)
    with torch.no_grad():
        return bool(layer.cpu_linear(x, torch.zeros_like(layer.weight), None).abs().sum() > 0)


def check(llm, prompt, completion, expected, tolerance: float = SYNC_TOLERANCE[torch.float32]) -> dict:
    vllm = weight_sync.vllm_token_logprobs(llm, prompt, completion)
    try:
        gaps = weight_sync.check_sync(vllm, expected, tolerance)
        return {"passed": True, "gap": gaps["sync/push_max_abs_diff"], "trimmed": gaps["sync/push_trimmed_abs_diff"]}
    except weight_sync.WeightSyncError as error:
        return {"passed": False, "gap": float((vllm - expected).abs().max()), "message": str(error)}


def main(model_dir: str, dtype_name: str = "float32") -> None:
    runtime.single_process_defaults()
    dtype = getattr(torch, dtype_name)
    llm = rollout.make_engine(model_dir, dtype=dtype_name, seed=0, max_model_len=256, gpu_memory_utilization=0.5,
                              enable_sleep_mode=False)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for param in model.parameters():  # a large update: every weight moves by ~2 % of a unit normal
            param.add_(0.02 * torch.randn(param.shape, generator=generator))
    model = model.to(dtype)
    vocab = model.config.vocab_size
    prompt, completion = [(7 * i + 3) % vocab for i in range(24)], [(11 * i + 5) % vocab for i in range(16)]
    expected = trainer_logprobs(model, prompt, completion)
    weights = [(name, p.detach()) for name, p in model.named_parameters()]
    tolerance = SYNC_TOLERANCE[dtype]
    without = check_after(llm, weights, prompt, completion, expected, tolerance, repack=False)
    with_repack = check_after(llm, weights, prompt, completion, expected, tolerance, repack=None)  # the default
    print("RESULT " + json.dumps({"without_repack": without, "with_repack": with_repack,
                                  "packed": llm.collective_rpc(kernels_read_a_copy)[0],
                                  "packed_said": weight_sync.cpu_kernels_are_packed()}), flush=True)


def check_after(llm, weights, prompt, completion, expected, tolerance, *, repack) -> dict:
    weight_sync.push_weights(llm, iter(weights), repack=repack)
    return check(llm, prompt, completion, expected, tolerance)


if __name__ == "__main__":
    main(*sys.argv[1:3])
