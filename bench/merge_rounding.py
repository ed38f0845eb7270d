"""How much of a LoRA update a bfloat16 merged push delivers: nearest rounding, stochastic rounding and error
feedback (lora.MergedPush, what the trainer uses) on one realistic projection.

    .venv/bin/python bench/merge_rounding.py [--size 896] [--rank 16]

The layer (`realistic_layer`) is one projection of the default run after Adam's first step: W ~ N(0, 0.02²) in
bfloat16 (Qwen2's initializer range), A as PEFT initialises it, B = ±2.5e-5 (lr 5e-5), α/r = 2. Two schedules:
- constant: the same Δ pushed K times; the error of the mean delivered update, ||mean_k d_k − Δ|| / ||Δ||;
- growing: B_t = t·B_1 for t = 1..24 (Adam moves every entry by about the learning rate each step, as over the
  default's 24 steps); the error of the summed delivered updates, ||Σ d_t − Σ Δ_t|| / ||Σ Δ_t||, and of the
  last push alone.
d = pushed − W. Stochastic rounding adds uniform noise below bfloat16's last bit of the float32 sum and truncates:
unbiased, E[round(x)] = x.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from plumbing import lora  # noqa: E402


def realistic_layer(size: int = 512, rank: int = 16):
    """One bfloat16 projection with its LoRA adapter after Adam's first step (see the module docstring)."""
    from peft import LoraConfig, get_peft_model

    base = torch.nn.Sequential(torch.nn.Linear(size, size, bias=False))
    torch.nn.init.normal_(base[0].weight, std=0.02, generator=torch.Generator().manual_seed(1))
    torch.manual_seed(3)  # PEFT's initialisation of A
    layer = get_peft_model(base, LoraConfig(r=rank, lora_alpha=2 * rank, target_modules=["0"])).base_model.model[0]
    layer.base_layer.to(torch.bfloat16)
    signs = torch.randint(0, 2, layer.lora_B["default"].weight.shape, generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        layer.lora_B["default"].weight.copy_((2.0 * signs - 1) * 2.5e-5)
    return layer


def stochastic_round(x: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    """float32 → bfloat16, rounded up with probability equal to the dropped fraction of a step."""
    noise = torch.randint(0, 1 << 16, x.shape, dtype=torch.int32, generator=generator)
    return ((x.view(torch.int32) + noise) & -65536).view(torch.float32).to(torch.bfloat16)


def relative_error(got: torch.Tensor, want: torch.Tensor) -> float:
    return float((got - want).norm() / want.norm())


def delivered_by(layer, rule: str, state: dict) -> torch.Tensor:
    """d = pushed − W for one push of the layer's current adapter under `rule`."""
    weight = layer.get_base_layer().weight
    if rule == "nearest":
        pushed = lora.merged_weights(layer)["weight"]
    elif rule == "stochastic":
        pushed = stochastic_round(weight.float() + lora.exact_delta(layer), state["generator"])
    else:
        pushed = lora.merged_weights(layer, state["feedback"], "w")["weight"]
    return pushed.float() - weight.float()


RULES = ("nearest", "stochastic", "feedback")


def fresh_state() -> dict:
    return {"generator": torch.Generator().manual_seed(0), "feedback": lora.MergedPush()}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--size", type=int, default=896, help="the projection's width (Qwen2.5-0.5B: 896)")
    parser.add_argument("--rank", type=int, default=16)
    args = parser.parse_args()
    layer = realistic_layer(args.size, args.rank)
    delta = lora.exact_delta(layer)
    step = layer.get_base_layer().weight.float().abs().mean() * 2.0**-7
    print(f"layer {args.size}x{args.size}, rank {args.rank}: mean |Δ| {float(delta.abs().mean()):.2e}, "
          f"mean bfloat16 step of W {float(step):.2e}")
    print("\nconstant Δ: error of the mean delivered update over K pushes")
    print(f"{'rule':<12}" + "".join(f"{f'K={k}':>9}" for k in (1, 4, 16, 64)))
    for rule in RULES:
        state, pushes = fresh_state(), []
        errors = []
        for k in range(1, 65):
            pushes.append(delivered_by(layer, rule, state))
            if k in (1, 4, 16, 64):
                errors.append(relative_error(torch.stack(pushes).mean(0), delta))
        print(f"{rule:<12}" + "".join(f"{e:>9.3f}" for e in errors))
    print("\ngrowing Δ (B_t = t·B_1, 24 pushes): error of the summed updates, and of the last push alone")
    first_b = layer.lora_B["default"].weight.detach().clone()
    for rule in RULES:
        state, total, intended = fresh_state(), 0, 0
        for t in range(1, 25):
            with torch.no_grad():
                layer.lora_B["default"].weight.copy_(first_b * t)
            last, want = delivered_by(layer, rule, state), lora.exact_delta(layer)
            total, intended = total + last, intended + want
        print(f"{rule:<12} summed {relative_error(total, intended):.3f}   last push {relative_error(last, want):.3f}")
    with torch.no_grad():
        layer.lora_B["default"].weight.copy_(first_b)


if __name__ == "__main__":
    main()
