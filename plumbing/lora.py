"""LoRA for Dual-GRPO: the adapters (PEFT), the reference policy for free, the push into vLLM, and the checkpoint.

With `lora_rank = r > 0` every module named in `lora_target_modules` computes

    y = W·x + s·B·A·x        W frozen (the base), A: (r, in) and B: (out, r) trained, s = lora_alpha / r

(Hu et al., 2021, arXiv 2106.09685; PEFT's default scaling). The adapter layers are PEFT's own (`peft.LoraConfig`,
`get_peft_model`): A starts random, B at zero, so step 0's policy is exactly the base model. What this file adds
is the wiring a GRPO trainer needs around them:

- **Reference policy.** π_ref is the base model, which is the policy with its adapters disabled
  (`adapters_disabled`, PEFT's `disable_adapter`). No second copy of the model is loaded, and the k3 KL is
  computed against it exactly as against a frozen copy (canoe.reference_logprobs).
- **The push** into vLLM (`push`): the merged weights W + s·B·A of the adapted modules, built in new tensors so
  that the trainer's modules stay unmerged and W bit-identical for the whole run (`MergedPush`, `policy_weights`),
  or, on a GPU outside float32, the adapter itself, applied by vLLM's LoRA support (`AdapterPush`; config
  `lora_push`). The loading into the engine and the checks that it landed are weight_sync.py's.
- **The optimizer** sees only A and B: PEFT sets `requires_grad = False` on every other parameter, and canoe.setup
  gives DeepSpeed the parameters that require a gradient.
- **Checkpoints** (checkpoint.py) hold the adapter in PEFT's format (`adapter/`: `adapter_config.json` and
  `adapter_model.safetensors`, loadable with `PeftModel.from_pretrained(base, path)`) beside the merged policy
  folder that `--eval --model` and vLLM load.

The recipe's learning rate for LoRA is about ten times the full fine-tuning one: LoRA's best learning rate was
found to sit about 10× above full fine-tuning's, in supervised and RL training alike, with adapters on every
layer, the MLP included, which is this file's default (Schulman et al., "LoRA Without Regret", Thinking Machines,
2025). The CANOE paper trains every weight; LoRA is an option here (docs/differences.md, D17).
"""

from __future__ import annotations

from plumbing import runtime  # noqa: F401,I001  (first: it sets the thread count and vLLM's mode before torch loads)

import contextlib
import shutil
import time
import zlib
from collections.abc import Iterator
from pathlib import Path

import deepspeed
import torch
from peft import LoraConfig, PeftModel, get_peft_model
from peft.tuners.lora import LoraLayer

from plumbing import weight_sync

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


# --------------------------------------------------------------------------------------------------------------
# The push into vLLM: the merged weights W + s·B·A, or the base W and the adapter apart


class MergedPush:
    """A LoRA policy pushed to vLLM as merged weights W + s·B·A: only what changes, and how much of the update
    arrives.

    **What is pushed.** Under LoRA only the adapted projections change. The engine loaded the same W from the model
    folder at start (in the same dtype, cast the same way), so a push sends the projections of every module that
    holds an adapted one (`changed_only` in `policy_weights`) and nothing else: not the embedding, the norms or the
    head. All the projections of such a module go, adapted or not, because vLLM fuses q, k and v (and gate and up)
    into one parameter and rebuilds a fused parameter from what a reload sends: a layer loaded in part is
    materialised empty and the parts not sent are lost. The reload rebuilds the packed CPU kernel of each layer it
    loaded, so such a push needs no `repack_cpu_linear` (docs/library-notes.md, "The in-place reload"). After a
    level-2 sleep the engine has lost every weight and the whole model is pushed.

    **Rounding.** Outside float32 the merged weight is held in bfloat16 (8 bits of mantissa): Δ = s·B·A is added
    to W and rounded, as PEFT's merge does, so an entry of Δ below half a step of its W is lost (W + Δ == W). Early
    in a run that is most of Δ (B starts at 0), and vLLM samples a policy between the base and the trainer's; the
    metrics below say how much arrives, and the adapter push (`AdapterPush`) loses nothing.

    **Measured** outside float32, on a fixed sample of SAMPLE entries of every adapted weight (cheap; the whole
    tensor would cost several times the merge): `sync/lora_delta_cosine` (delivered against intended update, this
    push), `sync/lora_delta_error` = ||delivered − Δ|| / ||Δ|| this push, and `sync/lora_delta_bias` = ||Σ_s
    (delivered_s − Δ_s)|| / ||Σ_s Δ_s|| over the pushes so far, high while Δ is below half a step of W.
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
    """`{"weight": W + s·B·A, "bias": b}` of one adapted layer, as new tensors (the layer is not changed).

    The merge is built in new tensors; W is never merged in place.

    By default Δ = s·B·A is computed in float32 (`exact_delta`), rounded to W's dtype and added: PEFT's `merge()`
    rule (`get_delta_weight`, which upcasts the adapters on the CPU), bit for bit on the CPU, without its extra
    copies; on a GPU PEFT multiplies in bfloat16, which this does not. Adapters of embedding layers go through
    PEFT's own `get_delta_weight`. Outside float32, `merged_push` measures what arrives (under `name`). The caller
    gathers the layer's parameters first under ZeRO-3.
    """
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
    delta = torch.zeros(len(index), dtype=torch.float32, device=weight.device)
    for adapter in layer.active_adapters:
        if adapter in layer.lora_A:
            a, b = layer.lora_A[adapter].weight.float(), layer.lora_B[adapter].weight.float()  # (r, in), (out, r)
            if layer.fan_in_fan_out:
                rows, cols = cols, rows
            delta += (b[rows] * a[:, cols].T).sum(dim=1) * layer.scaling[adapter]
    return delta


@torch.no_grad()
def exact_delta(layer: LoraLayer) -> torch.Tensor:
    """Σ over the active adapters of s·B·A in float32 (PEFT's `get_delta_weight` rule for a linear layer, computed
    from the adapters' values upcast first, as PEFT does on the CPU), the update the merge should deliver."""
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
    """The modules a `changed_only` push sends: every adapted projection and every plain projection beside one in
    the same parent (vLLM fuses q, k and v, and gate and up, so they travel together; `MergedPush`)."""
    modules = dict(model.named_modules())
    adapted = {name for name, module in modules.items() if isinstance(module, LoraLayer)}
    holders = {name.rpartition(".")[0] for name in adapted}
    return adapted | {name for name, module in modules.items()
                      if isinstance(module, torch.nn.Linear) and name.rpartition(".")[0] in holders}


def policy_weights(model: torch.nn.Module, zero_stage: int, merged_push: MergedPush | None = None, *,
                   changed_only: bool = False) -> Iterator[tuple[str, torch.Tensor]]:
    """Yield (Hugging Face name, full tensor) of every weight of the policy, as vLLM and a model folder hold them.

    Every adapted module's merged weight W + s·B·A (`merged_weights`, measured by `merged_push` outside float32) and
    every other parameter as it is, under the base model's names; the adapters themselves are not yielded. With
    `changed_only` (a PEFT model) only what training changes and what vLLM fuses with it (`changed_modules`). Under
    ZeRO-3 one module at a time is gathered, and every rank must consume the iterator in step (a gather is a
    collective). A tied parameter is yielded once (weight_sync.iter_full_parameters). A fully trained model's
    weights: weight_sync.iter_full_parameters.
    """
    sent = changed_modules(model) if changed_only else None
    inside = None  # "NAME." of the last LoRA layer: named_modules lists a module's sub-modules right after it,
    # and those of a LoRA layer are inside its merge
    seen: set[int] = set()  # ids of the parameters yielded so far (a tied head is the embedding's parameter)
    for name, module in model.named_modules():
        if inside and name.startswith(inside):
            continue
        if isinstance(module, LoraLayer):
            inside = name + "."
            with gathered(list(module.parameters()), zero_stage):
                merged = merged_weights(module, merged_push, hf_name(name))
            yield from ((f"{hf_name(name)}.{key}", tensor) for key, tensor in merged.items())
            continue
        if sent is not None and name not in sent:
            continue
        yield from ((hf_name(f"{name}.{key}"), tensor) for key, tensor in weight_sync.own_full_parameters(module, zero_stage, seen))


def base_weights(model: PeftModel, zero_stage: int) -> Iterator[tuple[str, torch.Tensor]]:
    """Yield (Hugging Face name, full tensor) of every base weight W of a PEFT model, the adapters left out: what an
    engine that applies the adapter itself (`AdapterPush`) holds. Under ZeRO-3 one module at a time is gathered; a
    tied parameter is yielded once (`iter_full_parameters`).

    vLLM's in-place reload finds a LoRA-wrapped layer's weight under its plain name (docs/library-notes.md, "The
    in-place reload").
    """
    seen: set[int] = set()
    for module_name, module in model.named_modules():
        for key, tensor in weight_sync.own_full_parameters(module, zero_stage, seen):
            name = f"{module_name}.{key}" if module_name else key
            if "lora_" not in name:
                yield hf_name(name).replace(".base_layer.", "."), tensor


class AdapterPush:
    """The adapters themselves pushed into vLLM's LoRA support, so that no update is lost to rounding in W + s·B·A.

    vLLM computes W·x + s·B·(A·x) with the adapter apart from W (`LLM(enable_lora=True)`, rollout.make_engine), so an
    update too small to change a bfloat16 W reaches the samples exactly. Each push writes the adapter in PEFT's
    format into this rank's folder and loads it under a NEW id, because vLLM reads an id once and then reuses it;
    the engine keeps one adapter, so the new one evicts the old. The push then checks that the engine holds exactly
    the new id and that its LoRA slot holds the adapter bit for bit (`check_adapter`), and every request names it
    (`request`). The slots live with the weights, so a level-2 sleep discards them; the new id is loaded after the
    weights are woken (push.WeightPush's order). vLLM holds the adapter in the engine's dtype. Where vLLM does
    each of these: docs/library-notes.md, "The adapter push".
    """

    def __init__(self, folder):
        self.folder = Path(folder)
        self.count = 0
        self.request = None  # the LoRARequest of the adapter the engine holds
        self.seconds = 0.0  # the last push's write and load of the adapter (logged as time/adapter_push)
        self._base_sums: dict[torch.dtype, weight_sync.WeightSums] = {}

    def base_sums(self, model: PeftModel, zero_stage: int, dtype: torch.dtype) -> weight_sync.WeightSums:
        """The WeightSums of the base weights W as the engine holds them (cast to `dtype`). W is frozen, so they
        are computed once (every rank walks, a collective under ZeRO-3) and are what a push of W would add up."""
        if dtype not in self._base_sums:
            sums = weight_sync.WeightSums()
            for name, tensor in base_weights(model, zero_stage):
                sums.add_as_held(tensor, dtype, name)
            self._base_sums[dtype] = sums
        return self._base_sums[dtype]

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
            raise weight_sync.WeightSyncError(f"adapter push failed: vLLM holds the adapters {sorted(held)}, not only the new "
                                  f"{self.count}; the engine would not sample from the adapter being trained")
        check_adapter(llm, model, state, self.count)
        if self.request is not None:
            shutil.rmtree(self.request.lora_path, ignore_errors=True)
        self.request = request
        self.seconds = time.perf_counter() - start
        return self.seconds


def adapter_sums(model: PeftModel, state: dict[str, torch.Tensor], dtype: torch.dtype) -> weight_sync.WeightSums | None:
    """The WeightSums of the adapter `state` (`adapter_state`) as vLLM holds it once loaded: A cast to the engine's
    dtype; B cast, then multiplied by its layer's scaling in that dtype, as vLLM folds s into B (docs/library-notes.md,
    "The adapter push"). None when an adapter is not a linear layer's (an embedding's), which the check does not
    cover."""
    scalings = {hf_name(name): module.scaling for name, module in model.named_modules() if isinstance(module, LoraLayer)}
    sums = weight_sync.WeightSums()
    for name, tensor in state.items():
        module, _, rest = hf_name(name).partition(".lora_")  # "model.layers.0.self_attn.q_proj", "B.default.weight"
        if not rest.startswith(("A.", "B.")):
            return None
        held = tensor.to(dtype)
        scaling = scalings[module][rest.split(".")[1]]
        sums.add(held * scaling if rest.startswith("B.") and scaling != 1 else held, module)
    return sums


def _engine_adapter_sums_worker(worker, lora_id: int) -> weight_sync.WeightSums | None:
    """In the worker: the WeightSums of the LoRA slot that holds `lora_id`, every module's stacked A and B of that
    slot, each slice (q, k, v of qkv_proj) apart; None if no slot holds it (docs/library-notes.md, "The adapter
    push")."""
    manager = worker.model_runner.lora_manager._adapter_manager
    if lora_id not in manager.lora_index_to_id:
        return None
    slot = manager.lora_index_to_id.index(lora_id)
    sums = weight_sync.WeightSums()
    for name, module in manager.modules.items():
        for a, b in zip(module.lora_a_stacked, module.lora_b_stacked):
            sums.add(a[slot, 0], name)
            sums.add(b[slot, 0], name)
    return sums


def check_adapter(llm, model: PeftModel, state: dict[str, torch.Tensor], lora_id: int) -> None:
    """Raise WeightSyncError unless vLLM's LoRA slot of `lora_id` holds the adapter `state` bit for bit: the exact
    sums of `adapter_sums` against the slot's (`weight_sync.WeightSums`; the layer index comes from the module
    names, which vLLM keeps, so an adapter loaded into another layer's place is seen too). Rows of a packed module
    (q, k and v) are its slices on vLLM's side and separate layers on PEFT's, which sums allow."""
    expected = adapter_sums(model, state, llm.llm_engine.model_config.dtype)
    if expected is None:
        return
    held = llm.collective_rpc(_engine_adapter_sums_worker, kwargs={"lora_id": lora_id})[0]
    if held is None:
        raise weight_sync.WeightSyncError(f"adapter push failed: no LoRA slot of the engine holds the adapter {lora_id}")
    try:
        weight_sync.check_weight_sums(expected, held)
    except weight_sync.WeightSyncError as error:
        raise weight_sync.WeightSyncError(f"adapter push failed: the engine's LoRA slot does not hold the adapter "
                                          f"that was pushed ({error})") from None


def push(llm, model: PeftModel, zero_stage: int, *, adapter: AdapterPush | None = None, base: bool = True,
         merged_push: MergedPush | None = None, sums: weight_sync.WeightSums | None = None,
         dtype: torch.dtype | None = None) -> float:
    """A LoRA policy into the engine; returns seconds. `sums` adds up what the engine should now hold, cast
    to the engine's `dtype`, for `check_weight_sums`. `base` says the engine lost its weights (a level-2 sleep
    discards them) and needs all of them.
    Differs from CANOE (docs/differences.md, D17): vLLM receives new merged tensors or the adapter itself.

    Without `adapter`: `policy_weights`, the merged W + s·B·A, and, unless `base`, only what training changes (`MergedPush`); the frozen rest is
    what the engine loaded at start, and the sums' `scope` is what was sent (the engine's side sums the parameters
    it rebuilt from those modules). With `adapter`: the base weights W, exactly as the trainer holds them, where
    `base`, then the adapter (`AdapterPush`); W is frozen and the engine loaded the same W from the model folder at
    start, so without a sleep W is never pushed, and its sums come from `AdapterPush.base_sums`.
    """
    if adapter is None:
        partial = merged_push is not None and not base
        weights = policy_weights(model, zero_stage, merged_push, changed_only=partial)
        if sums is not None:
            weights = weight_sync.summed(weights, sums, dtype)
            if partial:  # the engine's sums are then taken over what this push reloaded
                sums.scope = frozenset(hf_name(name) for name in changed_modules(model))
        if partial:  # the reload re-packs what it loads; the embedding, whose tied head would need it, is never sent
            return weight_sync.push_weights(llm, weights, repack=False, partial=True)
        return weight_sync.push_weights(llm, weights)
    seconds = weight_sync.push_weights(llm, base_weights(model, zero_stage)) if base else 0.0
    if sums is not None:
        sums.add_sums(adapter.base_sums(model, zero_stage, dtype))
    return seconds + adapter.push(llm, model, zero_stage)
