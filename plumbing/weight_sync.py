"""The weight sync: the trainer's weights into the colocated vLLM engine after every update, and the proof they landed.

In a push's order (training/push.py): every parameter under its Hugging Face name (`iter_full_parameters` over
`walk_modules`; a LoRA policy sends less, lora.py), vLLM's in-place reload (`push_weights`), then the checks: a
fixed probe's log-probabilities against the trainer's (`check_sync`) and, outside float32, the pushed weights'
exact sums against the engine's (`check_weight_sums`). On CUDA vLLM sleeps from the end of sampling until the push,
and the trainer's own memory peak is the one of that window (`training_peak`).
"""

from __future__ import annotations

from plumbing import runtime  # noqa: I001  (first: it sets the thread count and vLLM's mode before torch and vLLM load)

import contextlib
import logging
import re
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass

import deepspeed
import torch
from vllm import SamplingParams
from vllm.device_allocator import get_mem_allocator_instance
from vllm.inputs import TokensPrompt
from vllm.model_executor.layers import utils as vllm_layer_utils
from vllm.platforms import current_platform


class WeightSyncError(RuntimeError):
    """vLLM's weights do not match the trainer's after a push."""


def walk_modules(model: torch.nn.Module, zero_stage: int, *, only: Callable[[str], bool] | None = None,
                 whole: type | tuple[type, ...] = ()) -> Iterator[tuple[str, torch.nn.Module, list | None]]:
    """Yield (module name, module, own) in `named_modules` order, `own` the (name, full tensor) pairs of the
    parameters the module holds itself, less any an earlier module holds (a tied head), as vLLM holds them.

    Under ZeRO-3 each module's parameters are gathered and copied before the next module, so the model is never
    whole; a gather is a collective, so every rank must walk in step. `only(name)` false skips a module. A module
    of a `whole` type is yielded with `own` None while all its parameters are gathered; its children are skipped.
    """
    seen: set[int] = set()
    inside = None  # "NAME." of the last `whole` module: named_modules lists its sub-modules right after it
    for name, module in model.named_modules():
        if (inside and name.startswith(inside)) or (only is not None and not only(name)):
            continue
        if isinstance(module, whole):
            inside = name + "."
            with deepspeed.zero.GatheredParameters(list(module.parameters()), enabled=zero_stage >= 3):
                yield name, module, None
            continue
        own = [(key, p) for key, p in module.named_parameters(recurse=False) if id(p) not in seen]
        seen.update(id(p) for _, p in own)
        with deepspeed.zero.GatheredParameters([p for _, p in own], enabled=zero_stage >= 3):
            own = [(key, p.detach().clone() if zero_stage >= 3 else p.detach()) for key, p in own]
        yield name, module, own


def iter_full_parameters(model: torch.nn.Module, zero_stage: int, *,
                         only: Callable[[str], bool] | None = None) -> Iterator[tuple[str, torch.Tensor]]:
    """Yield (name, full tensor) for every parameter of `model` (`engine.module`), a shared one once; `only` and
    ZeRO-3's gathering as in `walk_modules`."""
    for module_name, _, own in walk_modules(model, zero_stage, only=only):
        for name, tensor in own:
            yield (f"{module_name}.{name}" if module_name else name), tensor


# vLLM's own dispatch, kept before keep_cpu_linear_weights replaces the module attribute.
VLLM_CPU_DISPATCH = vllm_layer_utils.dispatch_cpu_unquantized_gemm


def keep_cpu_linear_weights() -> None:
    """Make vLLM's CPU backend keep its linear weights as parameters (it packs a copy into its kernel and by default
    empties the parameter, which a reload would then fill unread); process-wide, before creating an engine."""
    if getattr(vllm_layer_utils.dispatch_cpu_unquantized_gemm, "packed", None):
        return

    def dispatch(layer: torch.nn.Module, remove_weight: bool) -> None:
        return VLLM_CPU_DISPATCH(layer, remove_weight=False)

    dispatch.packed = True  # the engine's kernels are packed copies: a push needs `repack_cpu_linear`
    vllm_layer_utils.dispatch_cpu_unquantized_gemm = dispatch


def repack_cpu_linear(worker) -> None:
    """Rebuild a CPU engine's packed linear kernels from its parameters (on each worker, `collective_rpc`)."""
    for module in worker.model_runner.model.modules():
        weight = getattr(module, "weight", None)
        if hasattr(module, "cpu_linear") and isinstance(weight, torch.Tensor) and weight.ndim == 2 and weight.numel():
            VLLM_CPU_DISPATCH(module, remove_weight=False)


def cpu_kernels_are_packed() -> bool:
    """Whether CPU engines created now use vLLM's packed kernels (and so need `repack_cpu_linear` after a push)."""
    return not torch.cuda.is_available() and getattr(vllm_layer_utils.dispatch_cpu_unquantized_gemm, "packed", True)


# What vLLM's in-place reload logs, at warning level, for every layer a partial push leaves out.
RELOAD_LOGGERS = [f"vllm.model_executor.model_loader.reload.{name}" for name in ("layerwise", "inplace")]
PARTIAL_RELOAD_MESSAGES = ("%s: Failed to load weights", "Following weights were not loaded from checkpoint: %s")


def _not_partial_reload(record: logging.LogRecord) -> bool:
    return record.msg not in PARTIAL_RELOAD_MESSAGES


def push_weights(llm, weights: Iterable[tuple[str, torch.Tensor]], *, repack: bool | None = None,
                 partial: bool = False) -> float:
    """Load `weights` (Hugging Face names) into the engine in place and drop its prefix cache; returns seconds.

    `repack` rebuilds the packed CPU kernels afterwards (None: where they are packed); the reload rebuilds those of
    the layers it loads but not a tied head's. `partial` (weights left out) silences the reload's warnings.
    """
    start = time.perf_counter()
    loggers = [logging.getLogger(name) for name in RELOAD_LOGGERS]
    for logger in loggers if partial else []:
        logger.addFilter(_not_partial_reload)
    try:
        llm.collective_rpc("reload_weights", kwargs={"weights_iterator": iter(weights)})
    finally:
        for logger in loggers:
            logger.removeFilter(_not_partial_reload)
    if cpu_kernels_are_packed() if repack is None else repack:
        llm.collective_rpc(repack_cpu_linear)
    llm.reset_prefix_cache()  # cached KV blocks were computed by the old weights
    return time.perf_counter() - start


PROBE_PROMPT_TOKENS = 16


def make_probe(tokenizer, prompt_ids: Sequence[int]) -> tuple[list[int], list[int]]:
    """(prompt, completion) ids whose log-probabilities vLLM and the trainer must agree on after a push: the last
    PROBE_PROMPT_TOKENS tokens of a training prompt (every weight acts on every token) and a fixed answer."""
    completion = ("<think>The passage answers the question directly.</think>\n<long_answer>According to the "
                  "passage, the answer is stated in its first sentence.</long_answer>\n<answer>")
    ids = tokenizer(completion, add_special_tokens=False)["input_ids"]
    return list(prompt_ids)[-PROBE_PROMPT_TOKENS:], list(ids)


def request_kwargs(lora_request) -> dict:
    """`LLM.generate`'s keyword for the adapter to apply (`AdapterPush.request`); none at all without one."""
    return {} if lora_request is None else {"lora_request": lora_request}


def vllm_token_logprobs(llm, prompt_ids: Sequence[int], completion_ids: Sequence[int],
                        lora_request=None) -> torch.Tensor:
    """vLLM's log-probabilities of `completion_ids` after `prompt_ids`, `(T,)` float32 (prompt logprobs)."""
    ids = list(prompt_ids) + list(completion_ids)
    params = SamplingParams(n=1, temperature=0.0, max_tokens=1, prompt_logprobs=0)
    prompts = [TokensPrompt(prompt_token_ids=ids)]
    output = llm.generate(prompts, params, use_tqdm=False, **request_kwargs(lora_request))[0]
    # prompt_logprobs[t] holds the logprob of ids[t] given ids[:t] (entry 0 is None).
    steps = output.prompt_logprobs[len(prompt_ids) :]
    return torch.tensor([step[token].logprob for step, token in zip(steps, completion_ids)], dtype=torch.float32)


# The probe sets aside its worst quarter of tokens: bfloat16 kernel rounding moves a few tokens by tenths of a nat,
# while stale kernels or an engine that does not read the pushed weights move most tokens.
PROBE_SET_ASIDE = 0.25


def check_sync(vllm_logprobs: torch.Tensor, trainer_logprobs: torch.Tensor, tolerance: float,
               sums: str = "were not compared") -> dict[str, float]:
    """Raise WeightSyncError unless vLLM's and the trainer's `(T,)` log-probabilities of the probe agree: every
    value finite, and the trimmed maximum |Δ| (the largest once the worst ⌊PROBE_SET_ASIDE · T⌋ tokens are set
    aside) within `tolerance`. `sums`, what the weight sums found, goes into the message. Returns
    `sync/push_trimmed_abs_diff` and `sync/push_max_abs_diff`."""
    assert vllm_logprobs.shape == trainer_logprobs.shape, (vllm_logprobs.shape, trainer_logprobs.shape)
    diff = (vllm_logprobs.float() - trainer_logprobs.float().cpu()).abs()  # (T,)
    aside = int(PROBE_SET_ASIDE * len(diff))
    ranked = diff.nan_to_num(nan=float("inf"))  # (T,), NaN as the worst
    ordered = ranked.sort(descending=True).values  # (T,)
    trimmed, worst = float(ordered[aside]), float(ordered[0])
    if not trimmed <= tolerance or not diff.isfinite().all():
        position = int(ranked.argmax())
        over = int((ordered > tolerance).sum())
        raise WeightSyncError(
            f"weight push failed verification: vLLM and the trainer disagree on the probe completion beyond "
            f"`sync_tolerance` = {tolerance:g} nats on {over} of its {len(diff)} tokens, where kernel rounding may "
            f"account for {aside}. Its trimmed maximum |Δ| (the largest after the worst {aside} set aside) is "
            f"{trimmed:.3g}, {trimmed - tolerance:.3g} over; the largest is {worst:.3g} at token {position} (vLLM "
            f"{float(vllm_logprobs[position]):.4f}, trainer {float(trainer_logprobs[position]):.4f}), the mean "
            f"{float(diff.mean()):.3g}. The weight sums {sums}. The engine is not generating from the weights being "
            f"trained; stopping. (If these gaps are the rounding of this machine's kernels, a `sync_tolerance` "
            f"above {trimmed:.3g} lets the run go on.)")
    return {"sync/push_trimmed_abs_diff": trimmed, "sync/push_max_abs_diff": worst}


_LAYER = re.compile(r"layers\.(\d+)\.")  # the decoder layer in a parameter's name, as the trainer and vLLM write it
# The signed integer type of each float type's width: a value is summed as the integer of its bits.
_BITS = {2: torch.int16, 4: torch.int32, 8: torch.int64}


@dataclass
class WeightSums:
    """Exact integer sums over the bits of a set of weight tensors: a checksum of a push that needs no name mapping.

    Each value counts as the signed integer of its bits, so the pushed tensors, cast to the engine's dtype, sum to
    what the engine holds exactly when every value landed. The sums are ones that vLLM's row-wise fusion (q, k, v
    into `qkv_proj`) and zero-padded embedding rows leave unchanged: `total` = Σ bits, and `placed` = Σ (1 + layer)
    · c_j · bits[i, j] over the matrices, c_j = 1 + j mod 97, `layer` the decoder layer in the name (else 0), which
    also sees a transposed matrix or two layers' matrices swapped. `scope`: the modules (Hugging Face names) a
    partial push covers (`engine_weight_sums` then sums only the engine's parameters built from them); None: all.
    """

    total: int = 0
    placed: int = 0
    scope: frozenset[str] | None = None

    @staticmethod
    def layer_of(name: str) -> int:
        """The decoder layer a parameter's name holds ("model.layers.3.mlp.down_proj.weight" → 3), else 0."""
        match = _LAYER.search(name)
        return int(match.group(1)) if match else 0

    @torch.no_grad()
    def add(self, tensor: torch.Tensor, name: str = "") -> None:
        bits = tensor.detach().contiguous().view(_BITS[tensor.element_size()])
        matrix = bits.reshape(-1, bits.shape[-1]) if bits.dim() >= 2 else bits.reshape(1, -1)
        if bits.element_size() == 2:  # int32 sums of 2^16 rows of int16 cannot overflow, and run ~10x faster
            columns = sum(block.sum(dim=0, dtype=torch.int32).long() for block in matrix.split(1 << 16))
        else:
            columns = matrix.sum(dim=0, dtype=torch.int64)  # (columns,), exact for 32-bit values below 2^32 rows
        self.total += int(columns.sum())
        if tensor.dim() >= 2:
            weights = 1 + torch.arange(matrix.shape[1], device=matrix.device) % 97  # c_j, int64
            # Σ_j c_j · columns_j in two int64 halves that cannot overflow: columns = high · 2^24 + low. A product
            # and a sum, not `@`: CUDA has no integer matmul.
            high = columns >> 24
            low = columns - (high << 24)
            dot = (int((high * weights).sum()) << 24) + int((low * weights).sum())
            self.placed += (1 + self.layer_of(name)) * dot

    def add_as_held(self, tensor: torch.Tensor, dtype: torch.dtype, name: str = "") -> None:
        """Add a pushed tensor as the engine will hold it: cast to the engine's `dtype`."""
        self.add(tensor.to(dtype), name)

    def add_sums(self, other: WeightSums) -> None:
        """Add the sums of another set of tensors, as if added tensor by tensor."""
        self.total += other.total
        self.placed += other.placed


def summed(weights: Iterable[tuple[str, torch.Tensor]], sums: WeightSums,
           dtype: torch.dtype) -> Iterator[tuple[str, torch.Tensor]]:
    """`weights` passed on unchanged, each added to `sums` as the engine will hold it (cast to its `dtype`)."""
    for name, tensor in weights:
        sums.add_as_held(tensor, dtype, name)
        yield name, tensor


def in_scope(name: str, scope: frozenset[str] | None, packed: dict[str, list[str]]) -> bool:
    """Whether the engine's parameter `name` is built from modules of `scope` (None: all) only: a fused module
    (`qkv_proj`) from its parts in the model's `packed_modules_mapping`, any other from itself."""
    if scope is None:
        return True
    parent, _, module = name.rpartition(".")[0].rpartition(".")
    return all(f"{parent}.{part}" in scope for part in packed.get(module, [module]))


def _engine_sums_worker(worker, scope: frozenset[str] | None = None) -> WeightSums:
    model = worker.model_runner.model
    packed = getattr(model, "packed_modules_mapping", {})
    sums = WeightSums(scope=scope)
    for name, param in model.named_parameters():
        if in_scope(name, scope, packed):
            sums.add(param, name)
    return sums


def engine_weight_sums(llm, scope: frozenset[str] | None = None) -> WeightSums:
    """The WeightSums of the engine's parameters built from the modules of `scope` (all with None); a shared
    parameter counts once, as in the trainer's walk."""
    return llm.collective_rpc(_engine_sums_worker, kwargs={"scope": scope})[0]


def check_weight_sums(pushed: WeightSums, engine: WeightSums) -> float:
    """Raise WeightSyncError unless the engine's weight sums are the pushed ones; returns 0.0 (the sums are exact).
    Blind to an engine that computes wrongly from the right weights (stale kernels): the probe covers that."""
    if (pushed.total, pushed.placed) != (engine.total, engine.placed):
        raise WeightSyncError(
            f"weight push failed verification: the engine's weights do not sum to what was pushed (the sum of their "
            f"bits {engine.total} vs {pushed.total}, placed {engine.placed} vs {pushed.placed}). Some pushed values "
            f"did not land; stopping.")
    return 0.0


def sleep_supported() -> bool:
    """vLLM can release its memory between rollouts only on CUDA/ROCm/XPU platforms (not on the CPU)."""
    return current_platform.is_sleep_mode_available()


def sleep_engine(llm, enabled: bool) -> None:
    """Give vLLM's memory to the trainer after sampling: sleep at level 2, which unmaps the weights and the KV cache
    (level 1 would copy every weight to the host and back for the push to overwrite), so every weight is pushed.
    `wake_weights`, the push and `wake_kv_cache` follow, so weights are only written into mapped memory. Here, asleep
    or not, the training phase's memory peak starts (`training_peak`)."""
    if enabled:
        llm.sleep(level=2)
    if cuda_memory_counted():
        torch.cuda.reset_peak_memory_stats()


def cuda_memory_counted() -> bool:
    """Whether torch's CUDA allocator counts this process's memory (tests stand one in)."""
    return torch.cuda.is_available()


def training_peak(asleep: bool) -> dict[str, float]:
    """`memory/peak_gib`, read before vLLM wakes: torch's peak allocation since `sleep_engine`, less what it still
    counts in a sleeping vLLM's pools (vLLM 0.32's CuMemAllocator keeps each MemPool it allocated from; a level-2
    sleep unmaps them all, their tensors live on); {} where nothing is counted."""
    if not cuda_memory_counted():
        return {}
    tags = get_mem_allocator_instance().allocator_and_pools.values() if asleep else []  # each [(pool, allocator)]
    unmapped = sum(s["allocated_size"] for tag in tags for pool, _ in tag for s in pool.snapshot(include_traces=False))
    return {"memory/peak_gib": (torch.cuda.max_memory_allocated() - unmapped) / 2**30}


def wake_weights(llm, enabled: bool) -> None:
    """Map vLLM's weight memory again (its contents are undefined after a level-2 sleep until the push)."""
    if enabled:
        llm.wake_up(tags=["weights"])


def wake_kv_cache(llm, enabled: bool) -> None:
    """Map the KV cache again; vLLM serves requests only once nothing sleeps."""
    if enabled:
        llm.wake_up(tags=["kv_cache"])
