"""LoRA for Dual-GRPO: the adapters (PEFT), the reference policy for free, the push into vLLM, and the checkpoint.

Every module in `lora_target_modules` computes y = W·x + s·B·A·x, W frozen, A: (r, in) and B: (out, r) trained,
s = lora_alpha / r (PEFT's layers and scaling; B starts at zero, so step 0's policy is the base model). π_ref is the
policy with its adapters disabled (`adapters_disabled`): no second copy. A push sends vLLM the merged W + s·B·A in
new tensors (`MergedPush`) or the adapter itself (`AdapterPush`); docs/lora.md has the rest.
"""

from __future__ import annotations

from plumbing import runtime  # noqa: I001  (first: it sets the thread count and vLLM's mode before torch loads)

import contextlib
import shutil
import time
import zlib
from collections.abc import Iterator
from pathlib import Path

import torch
from peft import LoraConfig, PeftModel, get_peft_model
from peft.tuners.lora import LoraLayer
from vllm.lora.request import LoRARequest

from plumbing import weight_sync
from plumbing.weight_sync import WeightSums, WeightSyncError


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
    if gradient_checkpointing:  # W frozen: the checkpointed layers' backward needs a gradient at their input
        wrapped.enable_input_require_grads()
    return wrapped


def is_lora(model: torch.nn.Module) -> bool:
    """Whether `model` (the DeepSpeed engine's module) carries PEFT adapters."""
    return isinstance(model, PeftModel)


@contextlib.contextmanager
def adapters_disabled(model: torch.nn.Module):
    """Inside: the base model, i.e. π_ref (`model` may be the DeepSpeed engine; a plain model stays as it is)."""
    model = getattr(model, "module", model)
    with model.disable_adapter() if is_lora(model) else contextlib.nullcontext():
        yield


def hf_name(name: str) -> str:
    """A parameter or module name of the PEFT-wrapped model under the base model's (Hugging Face's) name."""
    return name.removeprefix("base_model.model.")  # PEFT wraps the model under these two attributes


def adapter_state(model: PeftModel, zero_stage: int) -> dict[str, torch.Tensor]:
    """The adapter parameters (full values, on the CPU) under the PEFT model's own names; every rank calls it."""
    adapters = weight_sync.iter_full_parameters(model, zero_stage, only=lambda name: "lora_" in name)
    return {name: tensor.to("cpu", copy=True) for name, tensor in adapters}


def trainable_parameters(model: torch.nn.Module) -> int:
    return sum(p.ds_numel if hasattr(p, "ds_numel") else p.numel() for p in model.parameters() if p.requires_grad)


class MergedPush:
    """A LoRA policy pushed as merged weights W + s·B·A (only the modules `changed_modules` names, unless a level-2
    sleep lost every weight), and how much of the update arrives: outside float32 the merged weight is rounded to
    W's dtype, losing every entry of Δ = s·B·A below half a step of W. `measure` follows a fixed sample of SAMPLE
    entries of every adapted weight for the `sync/lora_delta_*` metrics (docs/outputs.md).
    """

    SAMPLE = 512

    def __init__(self):
        self.index: dict[str, torch.Tensor] = {}
        self.bias: dict[str, torch.Tensor] = {}  # Σ over pushes of (delivered − Δ) on the sampled entries
        self.intended: dict[str, torch.Tensor] = {}  # Σ over pushes of Δ on the sampled entries
        self._push = [0.0, 0.0, 0.0, 0.0]  # this push: Σ d·Δ, Σ d², Σ Δ², Σ (d − Δ)²

    def measure(self, name: str, weight: torch.Tensor, merged: torch.Tensor, delta_at) -> None:
        """Add one adapted weight's push to the metrics: W, what was pushed, and `delta_at(index)`, Δ in float32
        at the given flat positions (the layer's fixed sample)."""
        if name not in self.index:
            generator = torch.Generator().manual_seed(zlib.crc32(name.encode()))
            size = (min(self.SAMPLE, weight.numel()),)
            self.index[name] = torch.randint(0, weight.numel(), size, generator=generator)
            self.bias[name] = torch.zeros(len(self.index[name]), dtype=torch.float64)
            self.intended[name] = torch.zeros(len(self.index[name]), dtype=torch.float64)
        i = self.index[name].to(weight.device)
        w, d = weight.reshape(-1)[i].double(), delta_at(i).double()
        delivered = merged.reshape(-1)[i].double() - w  # (SAMPLE,)
        self._push[0] += float(delivered @ d)
        self._push[1] += float(delivered @ delivered)
        self._push[2] += float(d @ d)
        self._push[3] += float((delivered - d).square().sum())
        self.bias[name] += (delivered - d).cpu()
        self.intended[name] += d.cpu()

    def metrics(self) -> dict[str, float]:
        """This push's sync/lora_delta_* (see the class); {} where nothing was merged outside float32."""
        dot, delivered, intended, error = self._push
        self._push = [0.0, 0.0, 0.0, 0.0]
        if not self.index:
            return {}
        bias = sum(float(b.square().sum()) for b in self.bias.values())
        total = sum(float(t.square().sum()) for t in self.intended.values())
        return {"sync/lora_delta_cosine": dot / (delivered * intended) ** 0.5 if delivered * intended > 0 else 1.0,
                "sync/lora_delta_error": (error / intended) ** 0.5 if intended > 0 else 0.0,
                "sync/lora_delta_bias": (bias / total) ** 0.5 if total > 0 else 0.0}


def merged_weights(layer: LoraLayer, merged_push: MergedPush | None = None, name: str = "") -> dict[str, torch.Tensor]:
    """`{"weight": W + s·B·A, "bias": b}` of one adapted layer (its parameters gathered), as new tensors: Δ in
    float32 (`exact_delta`) rounded to W's dtype and added, PEFT's `merge()` rule. Outside float32 `merged_push`
    measures what arrives, under `name`."""
    base = layer.get_base_layer()
    weight = torch.add(base.weight.detach(), exact_delta(layer).to(base.weight.dtype))  # a new tensor
    for adapter in layer.active_adapters:
        if adapter in getattr(layer, "lora_embedding_A", {}):
            weight += layer.get_delta_weight(adapter).detach().to(weight.dtype)
    if merged_push is not None and base.weight.dtype != torch.float32:
        merged_push.measure(name, base.weight.detach(), weight, lambda index: sampled_delta(layer, index))
    merged = {"weight": weight}
    if getattr(base, "bias", None) is not None:
        merged["bias"] = base.bias.detach().clone()
    return merged


@torch.no_grad()
def sampled_delta(layer: LoraLayer, index: torch.Tensor) -> torch.Tensor:
    """`exact_delta(layer)` at the flat positions `index` only, `(len(index),)` float32: no full-size product."""
    weight = layer.get_base_layer().weight
    rows, cols = index // weight.shape[1], index % weight.shape[1]
    if layer.fan_in_fan_out:  # W is stored transposed: entry (i, j) of W is entry (j, i) of B·A
        rows, cols = cols, rows
    delta = torch.zeros(len(index), dtype=torch.float32, device=weight.device)
    for adapter in layer.active_adapters:
        if adapter in layer.lora_A:
            a, b = layer.lora_A[adapter].weight.float(), layer.lora_B[adapter].weight.float()  # (r, in), (out, r)
            delta += (b[rows] * a[:, cols].T).sum(dim=1) * layer.scaling[adapter]
    return delta


@torch.no_grad()
def exact_delta(layer: LoraLayer) -> torch.Tensor:
    """Σ over the active adapters of s·B·A in float32, from the adapters upcast first (PEFT's `get_delta_weight`
    rule for a linear layer on the CPU): the update the merge should deliver."""
    delta = None
    for adapter in layer.active_adapters:
        if adapter in layer.lora_A:
            product = layer.lora_B[adapter].weight.float() @ layer.lora_A[adapter].weight.float()  # (out, in)
            product.mul_(layer.scaling[adapter])
            product = product.T if layer.fan_in_fan_out else product
            delta = product if delta is None else delta.add_(product)
    if delta is None:
        weight = layer.get_base_layer().weight
        return torch.zeros(weight.shape, dtype=torch.float32, device=weight.device)
    return delta


def changed_modules(model: PeftModel) -> set[str]:
    """The modules a `changed_only` push sends: every adapted projection and every plain one beside it, because
    vLLM fuses q, k and v (gate and up) and a fused parameter loaded in part loses the parts not sent."""
    modules = dict(model.named_modules())
    adapted = {name for name, module in modules.items() if isinstance(module, LoraLayer)}
    holders = {name.rpartition(".")[0] for name in adapted}
    return adapted | {name for name, module in modules.items()
                      if isinstance(module, torch.nn.Linear) and name.rpartition(".")[0] in holders}


def policy_weights(model: torch.nn.Module, zero_stage: int, merged_push: MergedPush | None = None, *,
                   changed_only: bool = False) -> Iterator[tuple[str, torch.Tensor]]:
    """Yield (Hugging Face name, full tensor) of every weight of the policy, as vLLM and a model folder hold them:
    each adapted module's merged W + s·B·A (`merged_weights`), every other parameter as it is, the adapters left
    out. With `changed_only` only what training changes and what vLLM fuses with it (`changed_modules`). Every rank
    must consume it in step (weight_sync.walk_modules)."""
    only = changed_modules(model).__contains__ if changed_only else None
    for name, module, own in weight_sync.walk_modules(model, zero_stage, only=only, whole=LoraLayer):
        if own is None:  # a LoRA layer, gathered whole
            merged = merged_weights(module, merged_push, hf_name(name))
            yield from ((f"{hf_name(name)}.{key}", tensor) for key, tensor in merged.items())
        else:
            yield from ((hf_name(f"{name}.{key}"), tensor) for key, tensor in own)


def base_weights(model: PeftModel, zero_stage: int) -> Iterator[tuple[str, torch.Tensor]]:
    """Yield (Hugging Face name, full tensor) of every base weight W of a PEFT model, the adapters left out: what an
    engine that applies the adapter itself holds. vLLM finds a LoRA-wrapped layer's weight under its plain name."""
    weights = weight_sync.iter_full_parameters(model, zero_stage, only=lambda name: "lora_" not in name)
    return ((hf_name(name).replace(".base_layer.", "."), tensor) for name, tensor in weights)


class AdapterPush:
    """The adapter itself pushed into vLLM's LoRA support, so that no update is lost to rounding in W + s·B·A.

    Each push loads the adapter in PEFT's format under a new id (vLLM reads an id once; it keeps one adapter, so
    the new one evicts the old). Every request names it (`request`).
    """

    def __init__(self, folder):
        self.folder = Path(folder)
        self.count = 0
        self.request = None  # the LoRARequest of the adapter the engine holds
        self.seconds = 0.0  # the last push's write and load of the adapter (logged as time/adapter_push)
        self._base_sums: dict[torch.dtype, WeightSums] = {}

    def base_sums(self, model: PeftModel, zero_stage: int, dtype: torch.dtype) -> WeightSums:
        """The WeightSums of W as the engine holds it (cast to `dtype`), computed once (W is frozen); every rank
        calls it."""
        if dtype not in self._base_sums:
            sums = WeightSums()
            for name, tensor in base_weights(model, zero_stage):
                sums.add_as_held(tensor, dtype, name)
            self._base_sums[dtype] = sums
        return self._base_sums[dtype]

    def push(self, llm, model: PeftModel, zero_stage: int) -> float:
        """Write the current adapter, load it under a new id, check that the engine holds it alone and bit for bit
        (`check_adapter`) and drop the previous folder; returns seconds. Every rank calls it."""
        start = time.perf_counter()
        state = adapter_state(model, zero_stage)
        self.count += 1
        path = self.folder / f"push-{self.count}"
        model.save_pretrained(str(path), state_dict=state)
        request = LoRARequest(f"policy-{self.count}", self.count, str(path))
        llm.llm_engine.add_lora(request)
        held = set(llm.llm_engine.list_loras())
        if held != {self.count}:
            raise WeightSyncError(f"adapter push failed: vLLM holds the adapters {sorted(held)}, not only the "
                                  f"new {self.count}; the engine would not sample from the adapter being trained")
        check_adapter(llm, model, state, self.count)
        if self.request is not None:
            shutil.rmtree(self.request.lora_path, ignore_errors=True)
        self.request = request
        self.seconds = time.perf_counter() - start
        return self.seconds


def adapter_sums(model: PeftModel, state: dict[str, torch.Tensor], dtype: torch.dtype) -> WeightSums | None:
    """The WeightSums of the adapter `state` as vLLM holds it: A cast to the engine's dtype, B cast and then
    multiplied by its layer's scaling in that dtype (vLLM folds s into B). None when an adapter is an embedding's,
    which the check does not cover."""
    scalings = {hf_name(name): module.scaling for name, module in model.named_modules()
                if isinstance(module, LoraLayer)}
    sums = WeightSums()
    for name, tensor in state.items():
        module, _, rest = hf_name(name).partition(".lora_")  # "model.layers.0.self_attn.q_proj", "B.default.weight"
        if not rest.startswith(("A.", "B.")):
            return None
        held = tensor.to(dtype)
        scaling = scalings[module][rest.split(".")[1]]
        sums.add(held * scaling if rest.startswith("B.") and scaling != 1 else held, module)
    return sums


def _engine_adapter_sums_worker(worker, lora_id: int) -> WeightSums | None:
    """The WeightSums of every module's A and B in the LoRA slot that holds `lora_id`; None if no slot does."""
    manager = worker.model_runner.lora_manager._adapter_manager
    if lora_id not in manager.lora_index_to_id:
        return None
    slot = manager.lora_index_to_id.index(lora_id)
    sums = WeightSums()
    for name, module in manager.modules.items():
        for a, b in zip(module.lora_a_stacked, module.lora_b_stacked):
            sums.add(a[slot, 0], name)
            sums.add(b[slot, 0], name)
    return sums


def check_adapter(llm, model: PeftModel, state: dict[str, torch.Tensor], lora_id: int) -> None:
    """Raise WeightSyncError unless vLLM's LoRA slot of `lora_id` holds the adapter `state` bit for bit (exact
    sums, `adapter_sums`; the layer index in the module names also catches an adapter in another layer's place)."""
    expected = adapter_sums(model, state, llm.llm_engine.model_config.dtype)
    if expected is None:
        return
    held = llm.collective_rpc(_engine_adapter_sums_worker, kwargs={"lora_id": lora_id})[0]
    if held is None:
        raise WeightSyncError(f"adapter push failed: no LoRA slot of the engine holds the adapter {lora_id}")
    try:
        weight_sync.check_weight_sums(expected, held)
    except WeightSyncError as error:
        raise WeightSyncError(f"adapter push failed: the engine's LoRA slot does not hold the adapter "
                              f"that was pushed ({error})") from None


def push(llm, model: PeftModel, zero_stage: int, *, adapter: AdapterPush | None = None, base: bool = True,
         merged_push: MergedPush | None = None, sums: WeightSums | None = None,
         dtype: torch.dtype | None = None) -> float:
    """A LoRA policy into the engine; returns seconds. `base`: the engine lost its weights (a level-2 sleep) and
    needs all of them. `sums` adds up what the engine should now hold, cast to its `dtype`.

    Differs from CANOE (docs/differences.md, D17): the trainer's modules are never merged; vLLM receives new
    merged tensors (`policy_weights`; unless `base` only what training changes, and the sums' `scope` is what was
    sent) or, with `adapter`, W where `base` and then the adapter (W's sums from `AdapterPush.base_sums`).
    """
    if adapter is None:
        partial = merged_push is not None and not base
        weights = policy_weights(model, zero_stage, merged_push, changed_only=partial)
        if sums is not None:
            weights = weight_sync.summed(weights, sums, dtype)
            if partial:  # the engine's sums are then taken over what this push reloaded
                sums.scope = frozenset(hf_name(name) for name in changed_modules(model))
        # A partial reload re-packs what it loads; the embedding, whose tied head would need it, is never sent.
        return weight_sync.push_weights(llm, weights, repack=False if partial else None, partial=partial)
    seconds = weight_sync.push_weights(llm, base_weights(model, zero_stage)) if base else 0.0
    if sums is not None:
        sums.add_sums(adapter.base_sums(model, zero_stage, dtype))
    return seconds + adapter.push(llm, model, zero_stage)
