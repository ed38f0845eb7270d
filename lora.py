"""LoRA for Dual-GRPO: the adapters (PEFT), the merged weights vLLM samples from, and the reference policy for free.

With `lora_rank = r > 0` every module named in `lora_target_modules` computes

    y = W·x + s·B·A·x        W frozen (the base), A: (r, in) and B: (out, r) trained, s = lora_alpha / r

(Hu et al., 2021, arXiv 2106.09685; PEFT's default scaling). The adapter layers are PEFT's own (`peft.LoraConfig`,
`get_peft_model`): A starts random, B at zero, so step 0's policy is exactly the base model. What this file adds
is the wiring a GRPO trainer needs around them:

- **Reference policy.** π_ref is the base model, which is the policy with its adapters disabled
  (`adapters_disabled`, PEFT's `disable_adapter`). No second copy of the model is loaded, and the k3 KL is
  computed against it exactly as against a frozen copy (canoe.reference_logprobs).
- **The push.** vLLM holds plain weights, so it receives, every step, W + s·B·A for every adapted module
  (`policy_weights`, from PEFT's own `get_delta_weight`) and the other weights as they are, under their Hugging
  Face names. The sum is built in a new tensor: the trainer's modules stay unmerged. (Merging in place and
  unmerging after the push, as some trainers do, adds and subtracts s·B·A every step and leaves round-off in
  W; here W stays bit-identical for the whole run.) Under ZeRO-3 each module's weights are gathered on their own,
  as for full fine-tuning (rollout.own_full_parameters). That is the float32 push. Outside float32 the merged
  weight would lose every entry of s·B·A below half a step of W (`DeltaShare`), so there vLLM runs with its
  LoRA support and receives W and the adapter apart (`AdapterPush`, `push`; config `lora_push`).
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
import shutil
import time
from collections.abc import Iterator
from pathlib import Path

import deepspeed
import torch
from peft import LoraConfig, PeftModel, get_peft_model
from peft.tuners.lora import LoraLayer

import rollout
from rollout import WeightSyncError, iter_full_parameters, own_full_parameters

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


class DeltaShare:
    """How much of the adapters' update s·B·A survives in the merged weights W + s·B·A that vLLM receives.

    The merged weight is held in the weights' dtype. In bfloat16 (8 bits of mantissa) an entry of s·B·A smaller
    than half a bfloat16 step of its W rounds away: W + Δ == W. DeepSpeed casts every parameter to bfloat16,
    the adapters included (deepspeed/runtime/engine.py lines 2080-2088), and PEFT's `get_delta_weight` computes
    s·B·A in the adapters' dtype (peft/tuners/lora/layer.py lines 1044-1072; upcast to float32 only on the CPU,
    line 1058, and cast back, lines 1069-1070), so early in a LoRA run in bfloat16 (B starts at 0) a merged push
    would make vLLM sample nearly the base model while the trainer computes the adapters. `add` accumulates, over the adapted modules
    of one push, ||Δ||² and ||round(W + Δ) − W||² and ||round(W + Δ) − W − Δ||², with Δ in float32; `metrics`
    gives `sync/lora_delta_reached` = ||round(W + Δ) − W|| / ||Δ|| (about 1 when the update arrives, 0 when it
    is lost) and `sync/lora_delta_error` = ||round(W + Δ) − W − Δ|| / ||Δ|| (0 when it arrives exactly); 1 and 0
    when Δ = 0 (nothing to deliver). It is measured only where the merge rounds to fewer bits than float32
    (`merged_weights`): in float32, the CPU default, a merged entry is exact to ~1e-7 of W, and measuring costs
    about 5x the merge itself on the 2-core CPU (9 s a push for Qwen2.5-0.5B, measured), which would shorten the
    default run by several steps. Nothing measured (float32, or the adapter pushed apart): no metrics.
    """

    def __init__(self):
        self.measured = False
        self.delta = self.reached = self.error = 0.0  # sums of squares

    @torch.no_grad()
    def add(self, base: torch.Tensor, merged: torch.Tensor, delta: torch.Tensor) -> None:
        self.measured = True
        reached = merged.float() - base.float()
        self.delta += float(delta.float().square().sum())
        self.reached += float(reached.square().sum())
        self.error += float((reached - delta.float()).square().sum())

    def metrics(self) -> dict[str, float]:
        if not self.measured:
            return {}
        if self.delta == 0:
            return {"sync/lora_delta_reached": 1.0, "sync/lora_delta_error": 0.0}
        return {"sync/lora_delta_reached": (self.reached / self.delta) ** 0.5,
                "sync/lora_delta_error": (self.error / self.delta) ** 0.5}


def merged_weights(layer: LoraLayer, share: DeltaShare | None = None) -> dict[str, torch.Tensor]:
    """`{"weight": W + s·B·A, "bias": b}` of one adapted layer, as new tensors (the layer is not changed).

    The delta comes from PEFT's own `get_delta_weight` (the rule its `merge()` applies), summed over the active
    adapters. The caller gathers the layer's parameters first under ZeRO-3. `share` (optional) records, outside
    float32, how much of the delta the merged weight holds (`DeltaShare`); the delta it is compared with is s·B·A
    computed in float32 from the adapters' values.
    """
    base = layer.get_base_layer()
    weight = base.weight.detach().clone()
    deltas = []
    for adapter in layer.active_adapters:
        if adapter in layer.lora_A or adapter in getattr(layer, "lora_embedding_A", {}):
            deltas.append(layer.get_delta_weight(adapter).detach())
            weight += deltas[-1].to(weight.dtype)
    if share is not None and deltas and weight.dtype != torch.float32:  # float32 merges exactly (DeltaShare)
        share.add(base.weight.detach(), weight, exact_delta(layer))
    merged = {"weight": weight}
    if getattr(base, "bias", None) is not None:
        merged["bias"] = base.bias.detach().clone()
    return merged


@torch.no_grad()
def exact_delta(layer: LoraLayer) -> torch.Tensor:
    """Σ over the active adapters of s·B·A in float32 (PEFT's `get_delta_weight` rule for a linear layer, computed
    from the adapters' values upcast first, as PEFT does on the CPU), the update the merge should deliver."""
    delta = torch.zeros(layer.get_base_layer().weight.shape, dtype=torch.float32,
                        device=layer.get_base_layer().weight.device)
    for adapter in layer.active_adapters:
        if adapter in layer.lora_A:
            product = layer.lora_B[adapter].weight.float() @ layer.lora_A[adapter].weight.float()
            delta += (product.T if layer.fan_in_fan_out else product) * layer.scaling[adapter]
    return delta


def policy_weights(model: torch.nn.Module, zero_stage: int,
                   share: DeltaShare | None = None) -> Iterator[tuple[str, torch.Tensor]]:
    """Yield (Hugging Face name, full tensor) of every weight of the policy, as vLLM and a model folder hold them.

    A plain model: its parameters (rollout.iter_full_parameters). A PEFT model: every adapted module's merged
    weight W + s·B·A (`merged_weights`) and every other parameter as it is, under the base model's names; the
    adapters themselves are not yielded. Under ZeRO-3 one module at a time is gathered, and every rank must
    consume the iterator in step (a gather is a collective). `share` records how much of each adapted module's
    delta its merged weight holds (`DeltaShare`).
    """
    if not is_lora(model):
        yield from iter_full_parameters(model, zero_stage)
        return
    adapted: list[str] = []  # names of LoRA layers seen so far: their sub-modules are inside the merge
    for name, module in model.named_modules():
        if any(name.startswith(prefix + ".") for prefix in adapted):
            continue
        if isinstance(module, LoraLayer):
            adapted.append(name)
            with _gathered(list(module.parameters()), zero_stage):
                merged = merged_weights(module, share)
            yield from ((f"{hf_name(name)}.{key}", tensor) for key, tensor in merged.items())
            continue
        yield from ((hf_name(f"{name}.{key}"), tensor) for key, tensor in own_full_parameters(module, zero_stage))


def base_weights(model: PeftModel, zero_stage: int) -> Iterator[tuple[str, torch.Tensor]]:
    """Yield (Hugging Face name, full tensor) of every base weight W of a PEFT model, the adapters left out: what an
    engine that applies the adapter itself (`AdapterPush`) holds. Under ZeRO-3 one module at a time is gathered.

    vLLM's in-place reload finds a LoRA-wrapped layer's weight under its plain name (vllm/model_executor/
    model_loader/reload/inplace.py lines 21-29, `get_parameter_for_reload` steps into `base_layer`, and lines
    65-68 list the parameters with ".base_layer." removed when LoRA is on).
    """
    for module_name, module in model.named_modules():
        for key, tensor in own_full_parameters(module, zero_stage):
            name = f"{module_name}.{key}" if module_name else key
            if "lora_" not in name:
                yield hf_name(name).replace(".base_layer.", "."), tensor


class AdapterPush:
    """The adapters themselves pushed into vLLM's LoRA support, so that no update is lost to rounding in W + s·B·A.

    vLLM computes W·x + s·B·(A·x) with the adapter kept apart from W (`LLM(enable_lora=True)`, rollout.make_engine),
    so an update too small to change a bfloat16 W still reaches the samples (`DeltaShare` measures what a merged
    push would lose). Each push writes the adapter in PEFT's format into a folder of this rank's and loads it as
    a NEW adapter id: vLLM loads an id once and then only reuses it (vllm/lora/worker_manager.py lines 289-330,
    LRUCacheWorkerLoRAManager.add_adapter: an id already in the cache is not read again unless `load_inplace`,
    and `load_inplace` would re-read the folder at every scheduler step, since the adapters of a batch are
    applied with add_adapter on each model run, lines 274-287). The engine keeps one adapter (max_loras and
    max_cpu_loras 1, vllm/config/lora.py lines 35-44 and 120-121), so loading the new one evicts the previous one
    (worker_manager.py lines 311-315); the push checks that the engine holds exactly the new id and raises
    rollout.WeightSyncError otherwise. Every request then names it (`request`, passed as `lora_request` to
    `LLM.generate`). The LoRA slots are allocated while the model loads, in the "weights" memory pool
    (vllm/v1/worker/gpu_worker.py lines 587-594, the model runner's `load_lora_model`, gpu_model_runner.py line
    5067), so a level-2 sleep discards them with the weights; the new id is activated into its slot when it is
    added, after the weights are woken (canoe.push_and_verify's order), so the slot is rewritten then. With LoRA in vLLM the adapter's own values are held in the engine's dtype (lora_dtype "auto",
    vllm/config/lora.py lines 138-139): relative rounding of the adapter, not of W + s·B·A.
    """

    def __init__(self, folder):
        self.folder = Path(folder)
        self.count = 0
        self.request = None  # the LoRARequest of the adapter the engine holds

    def push(self, llm, model: PeftModel, zero_stage: int) -> float:
        """Write the current adapter, load it under a new id and drop the previous folder; returns seconds. Every
        rank calls it (the adapter's parameters are gathered under ZeRO-3), each writes its own folder."""
        from vllm.lora.request import LoRARequest

        start = time.perf_counter()
        state = adapter_state(model, zero_stage)
        self.count += 1
        path = self.folder / f"push-{self.count}"
        model.save_pretrained(str(path), state_dict=state)
        request = LoRARequest(f"policy-{self.count}", self.count, str(path))
        llm.llm_engine.add_lora(request)
        held = set(llm.llm_engine.list_loras())
        if held != {self.count}:
            raise WeightSyncError(f"adapter push failed: vLLM holds the adapters {sorted(held)}, not only the new "
                                  f"{self.count}; the engine would not sample from the adapter being trained")
        if self.request is not None:
            shutil.rmtree(self.request.lora_path, ignore_errors=True)
        self.request = request
        return time.perf_counter() - start


def push(llm, model: torch.nn.Module, zero_stage: int, *, adapter: AdapterPush | None = None,
         share: DeltaShare | None = None, sums=None, dtype: torch.dtype | None = None) -> float:
    """The trainer's weights into the engine; returns seconds. Without `adapter`: `policy_weights` (with LoRA the
    merged W + s·B·A, their delivered share recorded in `share`). With it: the base weights W, exactly as the
    trainer holds them, then the adapter (`AdapterPush`). `sums` (rollout.WeightSums) adds up what is pushed, cast
    to the engine's `dtype`, for rollout.check_weight_sums."""
    weights = base_weights(model, zero_stage) if adapter else policy_weights(model, zero_stage, share)
    seconds = rollout.push_weights(llm, rollout.summed(weights, sums, dtype) if sums is not None else weights)
    if adapter:
        seconds += adapter.push(llm, model, zero_stage)
    return seconds


def adapter_state(model: PeftModel, zero_stage: int) -> dict[str, torch.Tensor]:
    """The adapter parameters (their full values, gathered under ZeRO-3) under the PEFT model's own names."""
    state = {}
    for name, param in model.named_parameters():
        if "lora_" in name:
            with _gathered([param], zero_stage):
                state[name] = param.detach().to("cpu", copy=True)
    return state


def save_adapter(model: PeftModel, target, *, zero_stage: int, rank: int) -> None:
    """Write the adapter in PEFT's format (every rank gathers; rank 0 writes)."""
    state = adapter_state(model, zero_stage)
    if rank == 0:
        model.save_pretrained(str(target), state_dict=state)


def trainable_parameters(model: torch.nn.Module) -> int:
    return sum(p.ds_numel if hasattr(p, "ds_numel") else p.numel() for p in model.parameters() if p.requires_grad)


def _gathered(params: list[torch.Tensor], zero_stage: int):
    """ZeRO-3: the full values of `params` inside the block; otherwise nothing to do."""
    if zero_stage < 3 or not params:
        return contextlib.nullcontext()
    return deepspeed.zero.GatheredParameters(params)
