"""LoRA for Dual-GRPO: the adapters (PEFT), the reference policy for free, and the adapter's checkpoint.

With `lora_rank = r > 0` every module named in `lora_target_modules` computes

    y = W·x + s·B·A·x        W frozen (the base), A: (r, in) and B: (out, r) trained, s = lora_alpha / r

(Hu et al., 2021, arXiv 2106.09685; PEFT's default scaling). The adapter layers are PEFT's own (`peft.LoraConfig`,
`get_peft_model`): A starts random, B at zero, so step 0's policy is exactly the base model. What this file adds
is the wiring a GRPO trainer needs around them:

- **Reference policy.** π_ref is the base model, which is the policy with its adapters disabled
  (`adapters_disabled`, PEFT's `disable_adapter`). No second copy of the model is loaded, and the k3 KL is
  computed against it exactly as against a frozen copy (canoe.reference_logprobs).
- **The push** into vLLM lives in weight_sync.py: W + s·B·A for every adapted module, or, on a GPU outside
  float32, the adapter apart (`weight_sync.policy_weights`, `weight_sync.AdapterPush`; config `lora_push`).
- **The optimizer** sees only A and B: PEFT sets `requires_grad = False` on every other parameter, and canoe.setup
  gives DeepSpeed the parameters that require a gradient.
- **Checkpoints** (checkpoint.py) hold the adapter in PEFT's format (`adapter/`: `adapter_config.json` and
  `adapter_model.safetensors`, loadable with `PeftModel.from_pretrained(base, path)`) beside the merged policy
  folder that `--eval --model` and vLLM load.

The recipe's learning rate for LoRA is about ten times the full fine-tuning one: LoRA's best learning rate was
found to sit about 10× above full fine-tuning's, in supervised and RL training alike, with adapters on every
layer, the MLP included, which is this file's default (Schulman et al., "LoRA Without Regret", Thinking Machines,
2025). The CANOE paper trains every weight; LoRA is an option here (docs/DESIGN.md, "Deliberate differences").
"""

from __future__ import annotations

import contextlib

import deepspeed
import torch
from peft import LoraConfig, PeftModel, get_peft_model

# PEFT puts the wrapped model under these two attributes: "base_model.model.layers.0..." is "model.layers.0...".
PEFT_PREFIX = "base_model.model."


class LoraSetupError(ValueError):
    """The LoRA settings do not fit the model (e.g. a target module it does not have)."""


def wrap(model: torch.nn.Module, *, rank: int, alpha: float, dropout: float, target_modules: list[str],
         gradient_checkpointing: bool = False) -> PeftModel:
    """The model with LoRA adapters of `rank` on `target_modules`; only the adapters require a gradient."""
    config = LoraConfig(r=rank, lora_alpha=alpha, lora_dropout=dropout, target_modules=list(target_modules),
                        bias="none", task_type="CAUSAL_LM")
    try:
        wrapped = get_peft_model(model, config)
    except ValueError as error:  # PEFT names the target modules it did not find
        raise LoraSetupError(f"lora_target_modules = {list(target_modules)}: {error}") from None
    if gradient_checkpointing:
        # With every base weight frozen, the embedding output needs a gradient for the checkpointed layers'
        # backward to reach the adapters (transformers' remedy for frozen-base training).
        wrapped.enable_input_require_grads()
    return wrapped


def is_lora(model: torch.nn.Module) -> bool:
    """Whether `model` (the DeepSpeed engine's module) carries PEFT adapters."""
    return isinstance(model, PeftModel)


@contextlib.contextmanager
def adapters_disabled(model: torch.nn.Module):
    """Inside: the base model, i.e. π_ref (PEFT's `disable_adapter`). `model` may be the DeepSpeed engine around
    it; a plain model is left as it is."""
    model = getattr(model, "module", model)
    if not is_lora(model):
        yield
        return
    with model.disable_adapter():
        yield


def hf_name(name: str) -> str:
    """A parameter or module name of the PEFT-wrapped model under the base model's (Hugging Face's) name.

    >>> hf_name("base_model.model.model.layers.0.mlp.up_proj")
    'model.layers.0.mlp.up_proj'
    """
    return name.removeprefix(PEFT_PREFIX)


def adapter_state(model: PeftModel, zero_stage: int) -> dict[str, torch.Tensor]:
    """The adapter parameters (their full values, gathered under ZeRO-3) under the PEFT model's own names."""
    state = {}
    for name, param in model.named_parameters():
        if "lora_" in name:
            with gathered([param], zero_stage):
                state[name] = param.detach().to("cpu", copy=True)
    return state


def save_adapter(model: PeftModel, target, *, zero_stage: int, rank: int) -> None:
    """Write the adapter in PEFT's format (every rank gathers; rank 0 writes)."""
    state = adapter_state(model, zero_stage)
    if rank == 0:
        model.save_pretrained(str(target), state_dict=state)


def trainable_parameters(model: torch.nn.Module) -> int:
    return sum(p.ds_numel if hasattr(p, "ds_numel") else p.numel() for p in model.parameters() if p.requires_grad)


def gathered(params: list[torch.Tensor], zero_stage: int):
    """ZeRO-3: the full values of `params` inside the block; otherwise nothing to do."""
    if zero_stage < 3 or not params:
        return contextlib.nullcontext()
    return deepspeed.zero.GatheredParameters(params)
