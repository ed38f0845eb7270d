"""On a CUDA GPU: what one packed micro-batch's forward and backward allocate, against the memory plan's figure,
and what the attention mask's padded rows (`packing.attention_mask`) save.

    python bench/cuda_memory.py [--out FILE]     # needs a CUDA GPU, torch, transformers and peft; no vLLM

Part 1, the mask alone: one `scaled_dot_product_attention` call with a float mask of L = 1001 (rows as they are,
and padded to 1008) and of L = 1008, forward and backward, under torch's choice of kernel and with the
memory-efficient kernel forced: its peak allocation above its inputs, and the kernels the profiler saw.

Part 2, the trainer's activations: models of the architectures the memory plan knows (the default's
Qwen2.5-0.5B with 12 and 24 layers; Llama-3.1-8B with 2 and 4 of its layers and Qwen2.5-7B with 4, for which the
plan is then evaluated), random weights (memory does not depend on their values), a bfloat16 base with LoRA of
rank 16 on every projection as `plumbing/lora.py` wraps it, the adapters float32 as training keeps them (PEFT makes
them float32 and DeepSpeed's bf16 mode, which would cast them, is off with LoRA: training/optimizer.py), one
micro-batch of the run's shape with every completion at its longest and a prompt 3 tokens short of its limit
(so that L is not a multiple of 8). It measures `torch.cuda.max_memory_allocated()` above what was allocated
before the forward, through `grpo_loss.completion_logprobs`, a sum and `backward()`, against
`memory_plan.activation_bytes` of the same shape, and the strides the mask reached the attention with; last, the
Llama case without checkpointing under the memory-efficient kernel with a plain contiguous mask and with
packing's. One JSON line per measurement.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
from pathlib import Path
from types import SimpleNamespace

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from plumbing import memory_plan  # noqa: E402
import grpo_loss  # noqa: E402
from training import packing  # noqa: E402

MIB = 2**20
QWEN_05B = memory_plan.Architecture(hidden=896, layers=24, intermediate=4864, vocab=151936, heads=14, kv_heads=2,
                                    head_dim=64, qkv_bias=True, tied_embeddings=True)
PROJECTIONS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def plain_mask(model, allowed: torch.Tensor) -> torch.Tensor:
    """The mask as packing allocated it before rows were padded: contiguous, strides (L², L², L, 1)."""
    dtype = next(model.parameters()).dtype
    mask = torch.zeros(allowed.shape, dtype=dtype, device=allowed.device)
    return mask.masked_fill_(~allowed, torch.finfo(dtype).min)[None, None]


def sdpa_alone(L: int, padded: bool, backend: str) -> dict:
    """One attention call (8 heads of 128) with an additive mask, forward and backward; peak above the inputs.
    `backend`: "default" (torch's choice) or "efficient" (the memory-efficient kernel forced)."""
    q, k, v = (torch.randn(1, 8, L, 128, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
    row = -(-L // packing.MASK_ALIGNMENT) * packing.MASK_ALIGNMENT if padded else L
    allowed = torch.ones(L, L, device="cuda", dtype=torch.bool).tril()
    mask = torch.zeros(L, row, device="cuda", dtype=torch.bfloat16)[:, :L]
    mask = mask.masked_fill_(~allowed, torch.finfo(torch.bfloat16).min)[None, None]
    del allowed
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof, forced(backend):
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        out.sum().backward()
        torch.cuda.synchronize()
    peak = torch.cuda.max_memory_allocated() - before
    wanted = ("fmha", "flash", "attention", "cudnn", "pad", "copy")
    kernels = sorted({e.name[:60] for e in prof.events() if any(s in e.name.lower() for s in wanted)})
    return {"part": "sdpa", "backend": backend, "L": L, "row": row, "mask_strides": list(mask.stride()),
            "mask_MiB": round(L * L * 2 / MIB, 2), "peak_above_inputs_MiB": round(peak / MIB, 2), "kernels": kernels}


def forced(backend: str):
    from torch.nn.attention import SDPBackend, sdpa_kernel
    return contextlib.nullcontext() if backend == "default" else sdpa_kernel(SDPBackend.EFFICIENT_ATTENTION)


def hf_config(arch: memory_plan.Architecture, layers: int, positions: int):
    from transformers import LlamaConfig, Qwen2Config
    kind = Qwen2Config if arch.qkv_bias else LlamaConfig
    return kind(hidden_size=arch.hidden, intermediate_size=arch.intermediate, num_hidden_layers=layers,
                num_attention_heads=arch.heads, num_key_value_heads=arch.kv_heads, head_dim=arch.head_dim,
                vocab_size=arch.vocab, tie_word_embeddings=arch.tied_embeddings, max_position_embeddings=positions,
                use_cache=False)


def build(arch: memory_plan.Architecture, layers: int, positions: int, checkpointing: bool):
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM
    with torch.device("cuda"):
        model = AutoModelForCausalLM.from_config(hf_config(arch, layers, positions), dtype=torch.bfloat16,
                                                 attn_implementation="sdpa")
    if checkpointing:
        model.gradient_checkpointing_enable()
    model = get_peft_model(model, LoraConfig(r=16, lora_alpha=32, target_modules=PROJECTIONS, task_type="CAUSAL_LM"))
    if checkpointing:
        model.enable_input_require_grads()
    assert {p.dtype for p in model.parameters() if p.requires_grad} == {torch.float32}  # as training holds them
    return model


def micro_batch(prompts: int, prompt_tokens: int, generations: int, completion_tokens: int, vocab: int):
    generator = torch.Generator().manual_seed(0)
    groups = []
    for _ in range(prompts):
        prompt = torch.randint(vocab, (prompt_tokens,), generator=generator).tolist()
        groups.append((prompt, [torch.randint(vocab, (completion_tokens,), generator=generator).tolist()
                                for _ in range(generations)]))
    return packing.pack(groups, "cuda")


def activations(name, arch, layers, shape, checkpointing, mask, backend="default") -> dict:
    prompts, prompt_limit, generations, completion_tokens = shape
    prompt_tokens = prompt_limit - 3
    model = build(arch, layers, prompt_limit + completion_tokens + 8, checkpointing)
    packed = micro_batch(prompts, prompt_tokens, generations, completion_tokens, arch.vocab)
    seen = {}
    original_sdpa = F.scaled_dot_product_attention

    def recording_sdpa(*args, **kwargs):
        bias = kwargs.get("attn_mask")
        if bias is not None and "strides" not in seen:
            seen["strides"] = list(bias.stride())
        return original_sdpa(*args, **kwargs)

    original_mask = packing.attention_mask
    if mask == "plain":
        packing.attention_mask = plain_mask
    F.scaled_dot_product_attention = recording_sdpa
    try:
        torch.cuda.synchronize()
        before = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        with forced(backend):
            logprobs = grpo_loss.completion_logprobs(model, packed)
            logprobs.sum().backward()
        torch.cuda.synchronize()
        peak = torch.cuda.max_memory_allocated() - before
    finally:
        packing.attention_mask = original_mask
        F.scaled_dot_product_attention = original_sdpa
    cfg = SimpleNamespace(prompts_per_device=prompts, max_prompt_tokens=prompt_tokens, num_generations=generations,
                          max_completion_tokens=completion_tokens, gradient_checkpointing=checkpointing,
                          lora_rank=16, lora_target_modules=PROJECTIONS)
    planned = memory_plan.activation_bytes(cfg, memory_plan.Architecture(**{**arch.__dict__, "layers": layers}), 2)
    result = {"part": "activations", "model": name, "layers": layers, "L": packed.num_tokens,
              "checkpointing": checkpointing, "mask": mask, "backend": backend,
              "mask_strides_at_sdpa": seen.get("strides"),
              "measured_MiB": round(peak / MIB), "planned_MiB": round(sum(planned.values()) / MIB),
              "allocated_before_MiB": round(before / MIB),
              "planned_parts_MiB": {k.split(": ")[1]: round(v / MIB) for k, v in planned.items()}}
    del model, packed, logprobs
    torch.cuda.empty_cache()
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default="")
    parser.add_argument("--only", default="", help="run only the cases whose label contains this text")
    args = parser.parse_args()
    import transformers
    lines = [{"torch": torch.__version__, "transformers": transformers.__version__,
              "gpu": torch.cuda.get_device_name()}]
    for backend in ("default", "efficient") if not args.only else ():
        for L, padded in ((1001, False), (1001, True), (1008, False)):
            lines.append(sdpa_alone(L, padded, backend) | {"padded": padded})
            print(json.dumps(lines[-1]), flush=True)
    recipe = (2, 1024, 7, 1024)  # prompts_per_device, max_prompt_tokens, G, max_completion_tokens (recipes/)
    llama, qwen7 = (memory_plan.KNOWN_ARCHITECTURES[n] for n in ("Llama-3.1-8B-Instruct", "Qwen2.5-7B-Instruct"))
    cases = [("Qwen2.5-0.5B (the default)", QWEN_05B, layers, (1, 832, 7, 128), False, "packing", "default")
             for layers in (12, 24)]
    cases += [("Llama-3.1-8B-Instruct", llama, layers, recipe, checkpointing, "packing", "default")
              for checkpointing in (True, False) for layers in (2, 4)]
    cases += [("Qwen2.5-7B-Instruct", qwen7, 4, recipe, checkpointing, "packing", "default")
              for checkpointing in (True, False)]
    cases += [("Llama-3.1-8B-Instruct", llama, 4, recipe, False, mask, "efficient") for mask in ("plain", "packing")]
    cases += [("Llama-3.1-8B-Instruct, the recipe", llama, 32, recipe, True, "packing", "default")]  # every layer
    for name, arch, layers, shape, checkpointing, mask, backend in cases:
        if args.only not in f"{name} {layers} {checkpointing} {mask} {backend}":
            continue
        try:
            lines.append(activations(name, arch, layers, shape, checkpointing, mask, backend))
        except torch.OutOfMemoryError as error:
            lines.append({"model": name, "checkpointing": checkpointing, "mask": mask, "error": str(error)[:200]})
            torch.cuda.empty_cache()
        print(json.dumps(lines[-1]), flush=True)
    print(json.dumps(lines[0]), flush=True)
    if args.out:
        Path(args.out).write_text("".join(json.dumps(line) + "\n" for line in lines))


if __name__ == "__main__":
    main()
