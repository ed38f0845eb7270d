"""The weight sync: the trainer's weights into the colocated vLLM engine after every update, and the proof they landed.

A GRPO trainer samples from the policy it trains, so after each optimizer step vLLM must hold the new weights. This
file is the whole path, in the order a step takes it:

1. **What is pushed** (`iter_full_parameters`, `policy_weights`, `base_weights`): every parameter under its Hugging
   Face name. Under ZeRO-3 each module's own parameters are gathered, copied and released before the next module,
   so the whole model is never gathered at once. With LoRA (lora.py) vLLM gets W + s·B·A, built in a new tensor
   (the trainer's modules stay unmerged, W bit-identical for the whole run), or, on a GPU outside float32, the
   adapter apart (`AdapterPush`; W only after a sleep discarded it). A merged push sends only the adapted modules'
   projections and, outside float32, measures how much of the update arrives; error feedback, on request, makes
   it arrive on average (`MergedPush`). A tied embedding and head go once.
2. **Loading** (`push_weights`, `push`): vLLM's in-place `reload_weights`, then, on the CPU, the packed linear
   kernels rebuilt from the new values (`keep_cpu_linear_weights`: without it the push lands in parameters that
   no kernel reads), then the prefix cache dropped.
3. **The checks**: vLLM's log-probabilities of a fixed probe completion against the trainer's (`check_sync`; a
   sync that silently fails is the most common bug in GRPO trainers), and outside float32, where the probe's
   tolerance must leave room for two sets of bfloat16 kernels, the sums of the pushed weights against the
   engine's (`check_weight_sums`: exact, blind to the kernels).
4. **Memory hand-over** on CUDA: vLLM sleeps at level 2 from the end of sampling until the push
   (`sleep_engine`), then wakes its weights, is pushed, and wakes its KV cache (`wake_weights`, `wake_kv_cache`).

canoe.push_and_verify calls these in that order. The original CANOE code (TRL's GRPOTrainer with a vLLM server)
trusted the sync; every push is verified here (docs/DESIGN.md, "Deliberate differences").
"""

from __future__ import annotations

import runtime  # noqa: I001  (first: it sets the thread count and vLLM's mode before torch and vLLM load)

import logging
import shutil
import time
import zlib
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import deepspeed
import torch
import torch.nn.functional as F
from peft import PeftModel
from peft.tuners.lora import LoraLayer
from vllm import SamplingParams
from vllm.inputs import TokensPrompt
from vllm.model_executor.layers import utils as vllm_layer_utils
from vllm.platforms import current_platform

import lora
from lora import hf_name, is_lora


# --------------------------------------------------------------------------------------------------------------
# The trainer's weights, as vLLM holds them


class WeightSyncError(RuntimeError):
    """vLLM's weights do not match the trainer's after a push."""


def iter_full_parameters(model: torch.nn.Module, zero_stage: int) -> Iterator[tuple[str, torch.Tensor]]:
    """Yield (name, full tensor) for every parameter of the (DeepSpeed-wrapped) `model.module`, a shared one once.

    ZeRO-2 keeps full parameters on every rank, so they are yielded as they are. ZeRO-3 partitions them: each
    module's own parameters are gathered, copied out and released before the next module is touched
    (`own_full_parameters`), so at most one module is ever whole (never the whole model). Every rank must consume
    the iterator in step, because a gather is a collective.

    A parameter held by two modules (a tied input embedding and output head: `tie_word_embeddings`, Qwen2.5 up to
    3B, Llama-3.2, SmolLM2) is yielded once, under its first name (`model.embed_tokens.weight`), on both paths:
    `named_parameters` skips repeats itself (torch/nn/modules/module.py, `_named_members` with remove_duplicate),
    and the module walk keeps the ids it has seen. vLLM makes the head the embedding's Parameter (qwen2.py line
    487, llama.py line 510, vllm/model_executor/models/) and loads a tied tensor under one name only (utils.py
    lines 255-259, `AutoWeightsLoader`), so the engine's `parameters()` hold it once too (`check_weight_sums`).
    """
    if zero_stage < 3:
        for name, param in model.named_parameters():
            yield name, param.detach()
        return
    seen: set[int] = set()
    for module_name, module in model.named_modules():
        for name, tensor in own_full_parameters(module, zero_stage, seen):
            yield (f"{module_name}.{name}" if module_name else name), tensor


def own_full_parameters(module: torch.nn.Module, zero_stage: int,
                        seen: set[int] | None = None) -> list[tuple[str, torch.Tensor]]:
    """(name, full tensor) for the parameters `module` holds itself (not its children's).

    ZeRO-2: the parameters as they are. ZeRO-3: gathered and copied, because vLLM may buffer tensors until a
    whole layer has arrived and the gathered storage is freed when the gather ends. A collective under ZeRO-3:
    every rank must call it for the same module. `seen` (ids of parameters already yielded by an earlier module,
    updated here) leaves out a parameter that another module shares, such as a tied output head.
    """
    own = list(module.named_parameters(recurse=False))
    if seen is not None:
        own = [(name, p) for name, p in own if id(p) not in seen]
        seen.update(id(p) for _, p in own)
    if zero_stage < 3 or not own:
        return [(name, p.detach()) for name, p in own]
    with deepspeed.zero.GatheredParameters([p for _, p in own]):
        return [(name, p.detach().clone()) for name, p in own]


# --------------------------------------------------------------------------------------------------------------
# LoRA: the merged weights W + s·B·A, or the base W for an engine that applies the adapter


class MergedPush:
    """A LoRA policy pushed to vLLM as merged weights W + s·B·A: only what changes, and how much of the update
    arrives.

    **What is pushed.** Under LoRA only the adapted projections change. The engine loaded the same W from the model
    folder at start (in the same dtype, cast the same way), so a push sends the projections of every module that
    holds an adapted one (`changed_only` in `policy_weights`) and nothing else: not the embedding, the norms or the
    head. All the projections of such a module go, adapted or not, because vLLM fuses q, k and v (and gate and up)
    into one parameter and rebuilds a fused parameter from what a reload sends (vllm/model_executor/model_loader/
    reload/layerwise.py, `finalize_layerwise_processing`: a layer loaded in part is materialised empty and the parts
    not sent are lost). The reload re-runs `process_weights_after_loading` on each layer it loaded, which on the
    CPU rebuilds that layer's packed kernel (layers/linear.py, `UnquantizedLinearMethod`), so such a push needs no
    `repack_cpu_linear`. After a level-2 sleep the engine has lost every weight and the whole model is pushed.

    **Rounding** (`rounding`, the config's `lora_merge_rounding`). Outside float32 the merged weight is held in
    bfloat16 (8 bits of mantissa). "nearest" adds Δ = s·B·A to W in bfloat16 at every push, as PEFT's merge does (Δ
    rounded, then the sum): an entry of Δ below half a step of its W is lost (W + Δ == W), which early in a run is
    most of Δ (B starts at 0), so vLLM samples a policy between the base and the trainer's. "feedback" adds the part
    of W + Δ that the last rounding left out, r (float32, per adapted weight), before the next rounding: pushed =
    round(W + Δ + r), r ← W + Δ + r − pushed. The rounding errors then no longer pile up: over pushes 1..t the
    delivered updates add up to Σ Δ_s − r_t, with |r_t| at most half a step per entry, so the mean delivered update
    converges to the intended one (tests/test_push_check.py; stochastic rounding, the other unbiased rounding,
    converges as 1/sqrt(K) where feedback does as 1/K: bench/merge_rounding.py). The price is a larger error at any
    one push (up to a whole step against half a step), which vLLM samples with: on the default it raised the probe's
    gap from at most 0.33 to 0.45 nats, near the 0.5 tolerance (bench/RESULTS.md), so "nearest" stays the default
    until the probe tolerance is set from a measured distribution. No random draw is made either way; a resumed run
    restarts r at 0 (it is not checkpointed). In float32 the merge is exact to ~1e-7 of W and is done by PEFT's
    `get_delta_weight`, with nothing measured.

    **Measured** outside float32, on a fixed sample of SAMPLE entries of every adapted weight (cheap; the whole
    tensor would cost several times the merge): `sync/lora_delta_cosine` (delivered against intended update, this
    push), `sync/lora_delta_error` = ||delivered − Δ|| / ||Δ|| this push, and `sync/lora_delta_bias` = ||Σ_s
    (delivered_s − Δ_s)|| / ||Σ_s Δ_s|| over the pushes so far, which feedback drives towards 0 and nearest
    rounding leaves high while Δ is below half a step.
    """

    SAMPLE = 512

    def __init__(self, rounding: str = "feedback"):
        if rounding not in ("nearest", "feedback"):
            raise ValueError(f"rounding must be 'nearest' or 'feedback', got {rounding!r}")
        self.rounding = rounding
        self.residual: dict[str, torch.Tensor] = {}
        self.index: dict[str, torch.Tensor] = {}
        self.bias: dict[str, torch.Tensor] = {}  # Σ over pushes of (delivered − Δ) on the sampled entries
        self.intended: dict[str, torch.Tensor] = {}  # Σ over pushes of Δ on the sampled entries
        self._rest: dict[torch.dtype, WeightSums] = {}
        self._push = [0.0, 0.0, 0.0, 0.0]  # this push: Σ d·Δ, Σ d², Σ Δ², Σ (d − Δ)²

    @torch.no_grad()
    def merge(self, name: str, weight: torch.Tensor, delta: torch.Tensor) -> torch.Tensor:
        """W + Δ in W's dtype, rounded as `rounding` says (feedback keeps the residual); `delta` is Δ in float32."""
        target = delta + self.residual.get(name, 0.0)  # float32
        target += weight
        merged = target.to(weight.dtype)
        if self.rounding == "feedback":
            self.residual[name] = target.sub_(merged)
        self.measure(name, weight, merged, lambda index: delta.reshape(-1)[index])
        return merged

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

    def rest_sums(self, model: PeftModel, zero_stage: int, dtype: torch.dtype) -> WeightSums:
        """The WeightSums of every weight a `changed_only` push leaves out, as the engine holds them: frozen, so
        computed once (every rank walks, a collective under ZeRO-3)."""
        if dtype not in self._rest:
            pushed = {hf_name(name) for name in changed_modules(model)}
            sums = WeightSums()
            for name, tensor in base_weights(model, zero_stage):  # W under the names policy_weights gives them
                if name.rpartition(".")[0] not in pushed:
                    sums.add_as_held(tensor, dtype)
            self._rest[dtype] = sums
        return self._rest[dtype]


def merged_weights(layer: LoraLayer, merged_push: MergedPush | None = None, name: str = "") -> dict[str, torch.Tensor]:
    """`{"weight": W + s·B·A, "bias": b}` of one adapted layer, as new tensors (the layer is not changed).

    By default the delta comes from PEFT's own `get_delta_weight` (the rule its `merge()` applies), summed over
    the active adapters, and is added in W's dtype. Outside float32, `merged_push` measures what arrives (under
    `name`) and, with feedback rounding, rounds Δ = s·B·A in float32 (`exact_delta`) with the residual instead
    (`MergedPush.merge`). The caller gathers the layer's parameters first under ZeRO-3.
    """
    base = layer.get_base_layer()
    measured = merged_push is not None and base.weight.dtype != torch.float32
    if measured and merged_push.rounding == "feedback":
        merged = {"weight": merged_push.merge(name, base.weight.detach(), exact_delta(layer))}
    else:
        weight = base.weight.detach().clone()
        for adapter in layer.active_adapters:
            if adapter in layer.lora_A or adapter in getattr(layer, "lora_embedding_A", {}):
                weight += layer.get_delta_weight(adapter).detach().to(weight.dtype)
        if measured:
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
    delta = torch.zeros(layer.get_base_layer().weight.shape, dtype=torch.float32,
                        device=layer.get_base_layer().weight.device)
    for adapter in layer.active_adapters:
        if adapter in layer.lora_A:
            product = layer.lora_B[adapter].weight.float() @ layer.lora_A[adapter].weight.float()
            delta += (product.T if layer.fan_in_fan_out else product) * layer.scaling[adapter]
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

    A plain model: its parameters (`iter_full_parameters`). A PEFT model: every adapted module's merged
    weight W + s·B·A (`merged_weights`, rounded by `merged_push` outside float32) and every other parameter as it
    is, under the base model's names; the adapters themselves are not yielded. With `changed_only` (a PEFT model)
    only what training changes and what vLLM fuses with it (`changed_modules`). Under ZeRO-3 one module at a time
    is gathered, and every rank must consume the iterator in step (a gather is a collective). A tied parameter is
    yielded once (`iter_full_parameters`).
    """
    if not is_lora(model):
        yield from iter_full_parameters(model, zero_stage)
        return
    sent = changed_modules(model) if changed_only else None
    adapted: list[str] = []  # names of LoRA layers seen so far: their sub-modules are inside the merge
    seen: set[int] = set()  # ids of the parameters yielded so far (a tied head is the embedding's parameter)
    for name, module in model.named_modules():
        if any(name.startswith(prefix + ".") for prefix in adapted):
            continue
        if isinstance(module, LoraLayer):
            adapted.append(name)
            with lora.gathered(list(module.parameters()), zero_stage):
                merged = merged_weights(module, merged_push, hf_name(name))
            yield from ((f"{hf_name(name)}.{key}", tensor) for key, tensor in merged.items())
            continue
        if sent is not None and name not in sent:
            continue
        yield from ((hf_name(f"{name}.{key}"), tensor) for key, tensor in own_full_parameters(module, zero_stage, seen))


def base_weights(model: PeftModel, zero_stage: int) -> Iterator[tuple[str, torch.Tensor]]:
    """Yield (Hugging Face name, full tensor) of every base weight W of a PEFT model, the adapters left out: what an
    engine that applies the adapter itself (`AdapterPush`) holds. Under ZeRO-3 one module at a time is gathered; a
    tied parameter is yielded once (`iter_full_parameters`).

    vLLM's in-place reload finds a LoRA-wrapped layer's weight under its plain name (vllm/model_executor/
    model_loader/reload/inplace.py lines 21-29, `get_parameter_for_reload` steps into `base_layer`, and lines
    65-68 list the parameters with ".base_layer." removed when LoRA is on).
    """
    seen: set[int] = set()
    for module_name, module in model.named_modules():
        for key, tensor in own_full_parameters(module, zero_stage, seen):
            name = f"{module_name}.{key}" if module_name else key
            if "lora_" not in name:
                yield hf_name(name).replace(".base_layer.", "."), tensor


# --------------------------------------------------------------------------------------------------------------
# Loading into the engine


# vLLM's own dispatch, kept before keep_cpu_linear_weights replaces the module attribute.
VLLM_CPU_DISPATCH = vllm_layer_utils.dispatch_cpu_unquantized_gemm


def keep_cpu_linear_weights(packed: bool = True) -> None:
    """Make vLLM's CPU backend keep its linear weights as ordinary parameters, so that a push can reach them.

    At load time vLLM's CPU backend hands every 2-D linear weight to `dispatch_cpu_unquantized_gemm`
    (vllm/model_executor/layers/utils.py, called from `UnquantizedLinearMethod.process_weights_after_loading` in
    layers/linear.py with `remove_weight=True`, and for the output embedding from vocab_parallel_embedding.py),
    which builds a packed oneDNN or SGL kernel from a *copy* of the weight and, by default, replaces the
    parameter by an empty tensor. `reload_weights` then loads new values that no kernel reads: the push
    "succeeds" and generation goes on from the old weights (measured here: 2.4 nats of disagreement after one
    perturbed push).

    - `packed=True` (what training uses): vLLM's own dispatch with `remove_weight=False`. The parameters keep
      their values, `reload_weights` writes into them, and `repack_cpu_linear` rebuilds the packed kernels from
      them after every push (`push_weights` does it). Decode runs at vLLM's packed speed (bench/RESULTS.md,
      "Decode step").
    - `packed=False`: every 2-D linear layer runs `torch.nn.functional.linear` on its parameter, so a push lands
      with nothing more to do, at 2-2.5x the decode time of the packed kernels on this CPU.

    Process-wide (it replaces the module attribute vLLM imports at load time); call it before creating an engine.
    """
    current = vllm_layer_utils.dispatch_cpu_unquantized_gemm
    if getattr(current, "packed", None) == packed:
        return

    def dispatch(layer: torch.nn.Module, remove_weight: bool) -> None:
        if packed or layer.weight.ndim != 2 or layer.weight.is_meta:
            return VLLM_CPU_DISPATCH(layer, remove_weight=False)
        layer.cpu_linear = lambda x, weight, bias: F.linear(x, weight, bias)

    dispatch.packed = packed
    vllm_layer_utils.dispatch_cpu_unquantized_gemm = dispatch


def _repack_worker(worker) -> int:
    """In the worker (this process): run vLLM's CPU dispatch again on every linear layer that has a packed
    kernel, so the kernel is rebuilt from the parameter's current values. Returns the number of layers."""
    count = 0
    for module in worker.model_runner.model.modules():
        weight = getattr(module, "weight", None)
        if hasattr(module, "cpu_linear") and isinstance(weight, torch.Tensor) and weight.ndim == 2 and weight.numel():
            VLLM_CPU_DISPATCH(module, remove_weight=False)
            count += 1
    return count


def repack_cpu_linear(llm) -> int:
    """Rebuild the CPU engine's packed linear kernels from its (just reloaded) parameters; returns the layer
    count. vLLM calls a function passed to `collective_rpc` with each worker (in-process here)."""
    return sum(llm.collective_rpc(_repack_worker))


def cpu_kernels_are_packed() -> bool:
    """Whether CPU engines created now use vLLM's packed kernels (and so need `repack_cpu_linear` after a push)."""
    return not torch.cuda.is_available() and getattr(vllm_layer_utils.dispatch_cpu_unquantized_gemm, "packed", True)


# What vLLM's in-place reload logs, at warning level, for every layer a push leaves out (model_loader/reload/
# layerwise.py, `finalize_layerwise_processing`, and inplace.py, `reload_weights`): expected of a partial push.
PARTIAL_RELOAD_MESSAGES = ("%s: Failed to load weights", "Following weights were not loaded from checkpoint: %s")


class _PartialReloadFilter(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return record.msg not in PARTIAL_RELOAD_MESSAGES


def push_weights(llm, weights: Iterable[tuple[str, torch.Tensor]], *, repack: bool | None = None,
                 partial: bool = False) -> float:
    """Load `weights` (Hugging Face names) into the engine in place and drop its prefix cache. Returns seconds.

    On the CPU with packed kernels, the kernels are rebuilt from the new parameters (`repack`; None means "when
    the engine's kernels are packed"). vLLM's reload rebuilds the kernel of each layer it loads, but not of a tied
    head whose embedding was loaded: after a whole-model push `repack=False` leaves the engine generating from
    the old head, and the push verification (`check_sync`) must then fail, which tests/test_rollout.py shows.
    `partial` (some weights left out, as `MergedPush` sends) silences the reload's warning for each of them.
    """
    start = time.perf_counter()
    loggers = [logging.getLogger(f"vllm.model_executor.model_loader.reload.{name}") for name in ("layerwise", "inplace")]
    quiet = _PartialReloadFilter()
    for logger in loggers if partial else []:
        logger.addFilter(quiet)
    try:
        llm.collective_rpc("reload_weights", kwargs={"weights_iterator": iter(weights)})
    finally:
        for logger in loggers:
            logger.removeFilter(quiet)
    if cpu_kernels_are_packed() if repack is None else repack:
        repack_cpu_linear(llm)
    # Cached KV blocks were computed by the old weights.
    llm.reset_prefix_cache()
    return time.perf_counter() - start


class AdapterPush:
    """The adapters themselves pushed into vLLM's LoRA support, so that no update is lost to rounding in W + s·B·A.

    vLLM computes W·x + s·B·(A·x) with the adapter kept apart from W (`LLM(enable_lora=True)`, rollout.make_engine),
    so an update too small to change a bfloat16 W reaches the samples exactly (a merged push delivers it only on
    average over pushes, `MergedPush`). Each push writes the adapter in PEFT's format into a folder of this rank's and loads it as
    a NEW adapter id: vLLM loads an id once and then only reuses it (vllm/lora/worker_manager.py lines 289-330,
    LRUCacheWorkerLoRAManager.add_adapter: an id already in the cache is not read again unless `load_inplace`,
    and `load_inplace` would re-read the folder at every scheduler step, since the adapters of a batch are
    applied with add_adapter on each model run, lines 274-287). The engine keeps one adapter (max_loras and
    max_cpu_loras 1, vllm/config/lora.py lines 35-44 and 120-121), so loading the new one evicts the previous one
    (worker_manager.py lines 311-315); the push checks that the engine holds exactly the new id and raises
    WeightSyncError otherwise. Every request then names it (`request`, passed as `lora_request` to
    `LLM.generate`). The LoRA slots are allocated while the model loads, in the "weights" memory pool
    (vllm/v1/worker/gpu_worker.py lines 587-594, the model runner's `load_lora_model`, gpu_model_runner.py line
    5067), so a level-2 sleep discards them with the weights; the new id is activated into its slot when it is
    added, after the weights are woken (canoe.push_and_verify's order), so the slot is rewritten then. With LoRA
    in vLLM the adapter's own values are held in the engine's dtype (lora_dtype "auto", vllm/config/lora.py lines
    138-139): relative rounding of the adapter, not of W + s·B·A.
    """

    def __init__(self, folder):
        self.folder = Path(folder)
        self.count = 0
        self.request = None  # the LoRARequest of the adapter the engine holds
        self.seconds = 0.0  # the last push's write and load of the adapter (canoe logs it as time/adapter_push)
        self._base_sums: dict[torch.dtype, WeightSums] = {}

    def base_sums(self, model: PeftModel, zero_stage: int, dtype: torch.dtype) -> WeightSums:
        """The WeightSums of the base weights W as the engine holds them (cast to `dtype`). W is frozen, so they
        are computed once (every rank walks, a collective under ZeRO-3) and are what a push of W would add up."""
        if dtype not in self._base_sums:
            sums = WeightSums()
            for _, tensor in base_weights(model, zero_stage):
                sums.add_as_held(tensor, dtype)
            self._base_sums[dtype] = sums
        return self._base_sums[dtype]

    def push(self, llm, model: PeftModel, zero_stage: int) -> float:
        """Write the current adapter, load it under a new id and drop the previous folder; returns seconds. Every
        rank calls it (the adapter's parameters are gathered under ZeRO-3), each writes its own folder."""
        from vllm.lora.request import LoRARequest

        start = time.perf_counter()
        state = lora.adapter_state(model, zero_stage)
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
        self.seconds = time.perf_counter() - start
        return self.seconds


def request_kwargs(lora_request) -> dict:
    """`LLM.generate`'s keyword for the adapter to apply (`AdapterPush.request`); none at all without one."""
    return {} if lora_request is None else {"lora_request": lora_request}


def push(llm, model: torch.nn.Module, zero_stage: int, *, adapter: AdapterPush | None = None, base: bool = True,
         merged_push: MergedPush | None = None, sums: WeightSums | None = None,
         dtype: torch.dtype | None = None) -> float:
    """The trainer's weights into the engine; returns seconds. `sums` adds up what the engine should now hold, cast
    to the engine's `dtype`, for `check_weight_sums`. `base` says the engine lost its weights (a level-2 sleep
    discards them) and needs all of them.

    Without `adapter`: `policy_weights`. With LoRA (`merged_push`) the merged W + s·B·A, rounded with error
    feedback outside float32, and, unless `base`, only what training changes (`MergedPush`); the frozen rest is
    what the engine loaded at start, and its sums come from `MergedPush.rest_sums`. With `adapter`: the base
    weights W, exactly as the trainer holds them, where `base`, then the adapter (`AdapterPush`); W is frozen and
    the engine loaded the same W from the model folder at start, so without a sleep W is never pushed, and its sums
    come from `AdapterPush.base_sums`.
    """
    if adapter is None:
        partial = merged_push is not None and not base
        weights = policy_weights(model, zero_stage, merged_push, changed_only=partial)
        if sums is not None:
            weights = summed(weights, sums, dtype)
            if partial:
                sums.add_sums(merged_push.rest_sums(model, zero_stage, dtype))
        if partial:  # the reload re-packs what it loads; the embedding, whose tied head would need it, is never sent
            return push_weights(llm, weights, repack=False, partial=True)
        return push_weights(llm, weights)
    seconds = push_weights(llm, base_weights(model, zero_stage)) if base else 0.0
    if sums is not None:
        sums.add_sums(adapter.base_sums(model, zero_stage, dtype))
    return seconds + adapter.push(llm, model, zero_stage)


# --------------------------------------------------------------------------------------------------------------
# The checks: the probe's log-probabilities, and the weights' sums


PROBE_PROMPT_TOKENS = 48


def make_probe(tokenizer, prompt_ids: Sequence[int]) -> tuple[list[int], list[int]]:
    """A fixed prompt and completion whose log-probabilities vLLM and the trainer must agree on after a push.

    The prompt is the last PROBE_PROMPT_TOKENS tokens of a training prompt (the question and the assistant turn's
    opening): every weight acts on every token, so a short probe catches a push that did not land as well as a
    long one, and checking it costs ~0.45 s a step instead of ~0.9 s with the whole prompt (SmolLM2, 2 cores).
    """
    completion = ("<think>The passage answers the question directly.</think>\n<long_answer>According to the "
                  "passage, the answer is stated in its first sentence.</long_answer>\n<answer>")
    ids = tokenizer(completion, add_special_tokens=False)["input_ids"]
    return list(prompt_ids)[-PROBE_PROMPT_TOKENS:], list(ids)


def vllm_token_logprobs(llm, prompt_ids: Sequence[int], completion_ids: Sequence[int],
                        lora_request=None) -> torch.Tensor:
    """vLLM's log-probabilities of `completion_ids` after `prompt_ids`, `(T,)` float32 (prompt logprobs)."""
    ids = list(prompt_ids) + list(completion_ids)
    params = SamplingParams(n=1, temperature=0.0, max_tokens=1, prompt_logprobs=0)
    output = llm.generate([TokensPrompt(prompt_token_ids=ids)], params, use_tqdm=False, **request_kwargs(lora_request))[0]
    # prompt_logprobs[t] holds the logprob of ids[t] given ids[:t] (entry 0 is None).
    steps = output.prompt_logprobs[len(prompt_ids) :]
    return torch.tensor([step[token].logprob for step, token in zip(steps, completion_ids)], dtype=torch.float32)


def check_sync(vllm_logprobs: torch.Tensor, trainer_logprobs: torch.Tensor, tolerance: float) -> float:
    """Raise WeightSyncError unless the two `(T,)` log-probability vectors agree within `tolerance` (max |Δ|).

    Returns the max absolute difference (logged every step as `sync/push_max_abs_diff`).
    """
    assert vllm_logprobs.shape == trainer_logprobs.shape, (vllm_logprobs.shape, trainer_logprobs.shape)
    diff = (vllm_logprobs.float() - trainer_logprobs.float().cpu()).abs()
    worst = float(diff.max())
    if not worst <= tolerance:  # also catches NaN
        position = int(diff.argmax())
        raise WeightSyncError(
            f"weight push failed verification: vLLM and the trainer disagree on the probe completion by "
            f"{worst:.3g} nats at token {position} (vLLM {float(vllm_logprobs[position]):.4f}, trainer "
            f"{float(trainer_logprobs[position]):.4f}; tolerance {tolerance:g}, mean |diff| {float(diff.mean()):.3g}). "
            f"The engine is not generating from the weights being trained; stopping."
        )
    return worst


@dataclass
class WeightSums:
    """Σw, Σ|w| and Σw² in float64 over a set of weight tensors: a checksum of a push that needs no name mapping.

    vLLM holds some weights fused (q, k and v in one `qkv_proj`, gate and up in one `gate_up_proj`) and pads the
    vocabulary rows of the embedding with zeros at every load (vllm/model_executor/layers/vocab_parallel_embedding.py
    lines 519-520), so its parameters are not the pushed tensors one for one, but sums over them are the same:
    the sums over what the trainer pushed equal the sums over the engine's parameters exactly when every pushed
    value landed (up to float64 summation order, ~1e-15 relatively). Computed in chunks, so that no float64 copy
    of a whole tensor is made.
    """

    total: float = 0.0
    absolute: float = 0.0
    squares: float = 0.0

    CHUNK = 1 << 24

    @torch.no_grad()
    def add(self, tensor: torch.Tensor) -> None:
        for chunk in tensor.detach().reshape(-1).split(self.CHUNK):
            chunk = chunk.double()
            self.total += float(chunk.sum())
            self.absolute += float(chunk.abs().sum())
            self.squares += float(chunk.square().sum())

    def add_as_held(self, tensor: torch.Tensor, dtype: torch.dtype) -> None:
        """Add a pushed tensor as the engine will hold it: cast to the engine's `dtype`."""
        self.add(tensor.to(dtype))

    def add_sums(self, other: WeightSums) -> None:
        """Add the sums of another set of tensors (this set and that one, as if added tensor by tensor)."""
        self.total += other.total
        self.absolute += other.absolute
        self.squares += other.squares


# Relative disagreement of two WeightSums above which a push did not land (float64 summation in another order
# differs by ~1e-15; one step of a bf16 run changes the sums by far more, see check_weight_sums).
WEIGHT_SUMS_TOLERANCE = 1e-10


def summed(weights: Iterable[tuple[str, torch.Tensor]], sums: WeightSums,
           dtype: torch.dtype) -> Iterator[tuple[str, torch.Tensor]]:
    """`weights` passed on unchanged, each added to `sums` as the engine will hold it (cast to its `dtype`)."""
    for name, tensor in weights:
        sums.add_as_held(tensor, dtype)
        yield name, tensor


def _engine_sums_worker(worker) -> WeightSums:
    sums = WeightSums()
    for param in worker.model_runner.model.parameters():
        sums.add(param)
    return sums


def engine_weight_sums(llm) -> WeightSums:
    """The WeightSums of the engine's parameters (vLLM calls a function given to `collective_rpc` with its worker;
    one worker here, tensor parallel 1). Shared parameters count once, as in the trainer's `named_parameters`."""
    return llm.collective_rpc(_engine_sums_worker)[0]


def check_weight_sums(pushed: WeightSums, engine: WeightSums, tolerance: float = WEIGHT_SUMS_TOLERANCE) -> float:
    """Raise WeightSyncError unless the engine's weight sums are the pushed ones; returns the larger relative gap.

    What it detects: any pushed value that did not land as sent (a stale or partial push, a push into an engine
    whose memory was remapped, weights that vLLM changed after loading). Σw and Σw² both move unless the changes
    cancel in both, which a step's update does not do: in bfloat16 a weight that changes moves by one rounding step
    (2^-8 of its size), so a step that changes K of N weights of mean square w² moves Σw² by about
    2^-7 · sqrt(K) · w², a relative change of ~1e-8 for K = 1e6 of N = 8e9, far above the tolerance (1e-10) and
    far below what the probe can see. What it cannot detect: an engine that computes wrongly from the right
    weights (stale packed CPU kernels, an adapter applied wrongly) and weights vLLM holds that are not pushed; the
    probe (`check_sync`) covers the first within its tolerance. vLLM's LoRA slots are plain tensors, not
    parameters (vllm/lora/layers/base_linear.py line 133), so with the adapter pushed apart the sums cover W; the
    adapter is checked by its id (`AdapterPush`).
    """
    gap = max(abs(pushed.total - engine.total) / max(pushed.absolute, 1e-30),
              abs(pushed.squares - engine.squares) / max(pushed.squares, 1e-30))
    if not gap <= tolerance:
        raise WeightSyncError(
            f"weight push failed verification: the engine's weights do not sum to what was pushed (Σw {engine.total:.12g} "
            f"vs {pushed.total:.12g}, Σw² {engine.squares:.12g} vs {pushed.squares:.12g}; relative gap {gap:.3g}, "
            f"tolerance {tolerance:g}). Some pushed values did not land; stopping.")
    return gap


# --------------------------------------------------------------------------------------------------------------
# Memory hand-over between vLLM and the trainer


def sleep_supported() -> bool:
    """vLLM can release its memory between rollouts only on CUDA/ROCm/XPU platforms (not on the CPU)."""
    return current_platform.is_sleep_mode_available()


def sleep_engine(llm, enabled: bool) -> None:
    """Give vLLM's memory to the trainer after sampling: sleep at level 2, which unmaps the weights and the KV cache.

    The engine stays asleep through the update; `wake_weights`, the push and `wake_kv_cache` follow, in that order,
    so that weights are only ever written into mapped memory. Level 2 rather than 1: at level 1 vLLM copies every
    weight allocation to a host buffer at each sleep and copies it back at wake-up (vllm/device_allocator/cumem.py
    lines 265-276 and 352-360; vllm/device_allocator/sleep_mode_backend.py lines 127-137), about 15 GiB each way
    per rank and step for an 8B model in bfloat16, and what comes back is the pre-update copy that the push
    overwrites in full. At level 2 only the module buffers (rotary tables) are kept on the host and put back when
    the weights wake (vllm/v1/worker/gpu_worker.py lines 300-310 and 340-346); every parameter is pushed.
    """
    if enabled:
        llm.sleep(level=2)


def wake_weights(llm, enabled: bool) -> None:
    """Map vLLM's weight memory again (its contents are undefined after a level-2 sleep until the push)."""
    if enabled:
        llm.wake_up(tags=["weights"])


def wake_kv_cache(llm, enabled: bool) -> None:
    """Map the KV cache again; vLLM serves requests only once nothing sleeps (vllm/v1/engine/core.py 1012-1016)."""
    if enabled:
        llm.wake_up(tags=["kv_cache"])
