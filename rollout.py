"""Rollouts for Dual-GRPO: vLLM sampling (stage 1 and stage 2) and the weight push from the trainer into vLLM.

Stage 1 samples G completions per prompt. Stage 2 (CANOE's "dual" part; docs/DESIGN.md, "Rollout") takes the
`<long_answer>` of each stage-1 completion, puts it in place of the prompt's `<context>` block and samples ONE
new completion from that prompt at the same temperature; the influence reward then asks whether the model can
still answer from the long answer alone. Stage-2 completions are scored, never trained on.

vLLM runs colocated inside each training process (`distributed_executor_backend="external_launcher"`, one
engine per rank, tensor parallel 1), so rollouts need no server and no extra GPUs. After every optimizer step the
trainer pushes its weights into the engine (`push_weights`) and `check_sync` proves the push worked by comparing
vLLM's log-probabilities of a fixed probe completion with the trainer's: a sync that silently fails is the most
common bug in GRPO trainers.

Sampling is seeded from the run seed, the step, the rank and the stage, so a resumed run draws exactly the
samples the uninterrupted run would have drawn: on CUDA every request carries its own seed, on the CPU torch's
generator is seeded right before each `generate` call (`seeds_per_request` says why the two differ).

Deliberate difference from the original CANOE code: the original builds the stage-2 prompt with
`re.sub(pattern, f"<context>{re.escape(long_answer)}</context>", ...)`, which leaves a backslash before every
space and dot of the long answer in the new context; `substitute_context` inserts the long answer literally.
"""

from __future__ import annotations

import runtime  # noqa: I001  (first: it sets the thread count and vLLM's mode before torch and vLLM load)

import hashlib
import os
import re
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass

import deepspeed
import torch
import torch.nn.functional as F
from vllm import LLM, SamplingParams
from vllm.inputs import TokensPrompt
from vllm.model_executor.layers import utils as vllm_layer_utils
from vllm.platforms import current_platform

from tags import tag_content

CONTEXT_BLOCK = re.compile(r"<context>.*?</context>", re.DOTALL)


# --------------------------------------------------------------------------------------------------------------
# Stage-2 prompt construction (pure)


def extract_long_answer(text: str | None) -> str | None:
    """First `<long_answer>(.*?)</long_answer>` of `text` (DOTALL), stripped; None if there is none or `text` is
    not a string (the rule of `tags.tag_content`, which the length reward reads too).

    >>> extract_long_answer("<think>t</think><long_answer> Lyon is the capital. </long_answer><answer>Lyon</answer>")
    'Lyon is the capital.'
    >>> extract_long_answer("no tags") is None
    True
    """
    return tag_content(text, "long_answer") if isinstance(text, str) else None


def substitute_context(problem: str | None, long_answer: str) -> str | None:
    """Replace the first `<context>…</context>` block of `problem` with `<context>{long_answer}</context>`.

    The long answer is inserted literally: no regex escapes (the original's `re.escape` bug, see the module
    docstring) and no backreference expansion. None when the problem has no context block.

    >>> substitute_context("<context>old</context>\\n\\nQ?", r"a.b \\1 c")
    '<context>a.b \\\\1 c</context>\\n\\nQ?'
    """
    if not isinstance(problem, str):
        return None
    match = CONTEXT_BLOCK.search(problem)
    if match is None:
        return None
    return problem[: match.start()] + f"<context>{long_answer}</context>" + problem[match.end() :]


# --------------------------------------------------------------------------------------------------------------
# Sampling


@dataclass(frozen=True)
class Completion:
    """One sampled completion: vLLM's text, token ids and the log-probability of each sampled token."""

    text: str
    token_ids: tuple[int, ...]
    logprobs: tuple[float, ...]
    finish_reason: str  # "stop" (EOS or a stop string) or "length" (hit max_tokens)


def request_seed(*parts: int | str) -> int:
    """A stable 63-bit seed from the run seed, stage, step and rank (Python's hash() is salted per run)."""
    digest = hashlib.blake2b("/".join(map(str, parts)).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") >> 1


def seeds_per_request() -> bool:
    """Whether each request carries its own seed (`SamplingParams.seed`): on CUDA, not on the CPU.

    On CUDA, vLLM 0.32's default (V2) model runner draws the seed of a request that has none from numpy's global
    generator (vllm/v1/worker/gpu/sample/states.py lines 54-58: `np.random.randint(...)`), which the worker seeds
    with the engine seed (vllm/utils/torch_utils.py lines 542-553, called from v1/worker/gpu_worker.py lines 522
    and 1062-1064) and a data-parallel index that is 0 for our engines (we start each with data parallel size 1,
    so vllm/config/parallel.py lines 978-989 never set a rank, line 1029): every rank would sample the same
    noise, and `--resume`, which saves torch's RNG, not numpy's, would not redraw the uninterrupted run's
    samples. A request with a seed samples from that seed and the token position alone (v1/worker/gpu/sample/gumbel.py, `gumbel_sample`
    with the per-request `seeds`; sampler.py lines 305-312 keep seeded requests off the unseeded fused sampler),
    and a request with n > 1 gives its i-th sample the seed + i (v1/engine/parallel_sampling.py lines 69-81).
    The V1 runner, which vLLM falls back to where V2 lacks a feature, gives a seeded request its own CUDA
    generator, which works as well.

    On the CPU vLLM runs the V1 runner (its Triton has no CPU backend, vllm/triton_utils/importing.py lines
    36-45, so vllm/config/vllm.py lines 724-728 choose V1), which gives a seeded request a torch CPU generator
    and moves it back 4 draws whenever a sampled token is discarded, as after a prefill split over two
    scheduler steps (v1/worker/gpu_model_runner.py lines 3499-3502, `gen.set_offset(gen.get_offset() - 4)`):
    a CPU generator has no offset, so that raises ("CPU Generator does not use offset"). There the unseeded
    requests sample from torch's global generator, which `_sample` seeds; the CPU run's samples are unchanged.
    """
    return torch.cuda.is_available()


def prompt_seed(seed: int, index: int) -> int:
    """The seed of the `index`-th prompt of a `generate` call whose draw is `seed` (`request_seed`): 62 bits, so
    that vLLM's seed + i of the i-th sample stays a signed 64-bit integer (its seeds are int64 arrays)."""
    return request_seed(seed, index) >> 1


def make_engine(
    model_path: str,
    *,
    dtype: str,
    seed: int,
    max_model_len: int,
    gpu_memory_utilization: float,
    enable_sleep_mode: bool,
    cpu_kv_cache_gib: float = 1.0,
    lora_rank: int = 0,
):
    """One colocated vLLM engine for this training process (tensor parallel 1, driven by our launcher).

    With sleep mode the CUDA graphs go to sleep too (`sleep_mode_offload_cudagraph`): by default vLLM 0.32 keeps
    them on the GPU while the engine sleeps (vllm/config/model.py line 380, default False), which the memory plan
    would count as free for training. With the option, graph capture allocates from the cuMem pool tagged
    "cudagraph" (vllm/config/vllm.py lines 688-700, `use_cumem_cudagraph_pool`, read by compilation/cudagraph_pool.py
    lines 38-40; device_allocator/cumem.py lines 437-450), which every sleep level copies to the host (device_allocator/sleep_mode_backend.py lines 131-137) and
    the first `wake_up`, whatever its tags, maps and copies back (cumem.py line 348: a tag other than "weights" and
    "kv_cache" always wakes), so our wake order (rollout.wake_weights, then wake_kv_cache) is unchanged.

    On the CPU the KV cache gets `cpu_kv_cache_gib` (VLLM_CPU_KVCACHE_SPACE, unless the environment already sets
    it): without it vLLM's CPU worker takes gpu_memory_utilization × the host's memory (measured: 10.7 of 23.5 GiB
    for a 0.5B model), and refuses to start when that much is not free.

    `lora_rank > 0` turns on vLLM's LoRA support for one adapter at a time (lora.AdapterPush), with the smallest
    `max_lora_rank` vLLM allows that holds the rank (vllm/config/lora.py line 26, `MaxLoRARanks`).
    """
    lora = {}
    if lora_rank:
        allowed = (1, 8, 16, 32, 64, 128, 256, 320, 512)
        lora = dict(enable_lora=True, max_loras=1, max_cpu_loras=1,
                    max_lora_rank=min((r for r in allowed if r >= lora_rank), default=lora_rank))
    if not torch.cuda.is_available():
        os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", str(max(1, round(cpu_kv_cache_gib))))
        keep_cpu_linear_weights()

    return LLM(
        model=model_path,
        dtype=dtype,
        seed=seed,
        max_model_len=max_model_len,
        gpu_memory_utilization=gpu_memory_utilization,
        distributed_executor_backend="external_launcher",
        tensor_parallel_size=1,
        enable_prefix_caching=True,
        enable_sleep_mode=enable_sleep_mode,
        sleep_mode_offload_cudagraph=enable_sleep_mode,
        enforce_eager=not torch.cuda.is_available(),
        **lora,
    )


def _sample(llm, prompts: Sequence[Sequence[int]], n: int, seed: int, *, temperature: float, top_p: float,
            max_tokens: int, lora_request=None) -> list[Completion]:
    """`n` samples per prompt, prompt-major: returns len(prompts)·n completions.

    The draw is a function of `seed` alone (`seeds_per_request`). On CUDA each prompt's request carries its own
    seed (`prompt_seed`). On the CPU vLLM samples in this process with this process's torch generator: seeding
    it right before the call does it (the trainer's own RNG stream is saved and restored around it).
    `lora_request` names the adapter the engine applies (lora.AdapterPush), None for plain weights.
    """
    settings = dict(n=n, temperature=temperature, top_p=top_p, max_tokens=max_tokens, logprobs=0)
    if seeds_per_request():
        params = [SamplingParams(**settings, seed=prompt_seed(seed, index)) for index in range(len(prompts))]
    else:
        params = SamplingParams(**settings)
    devices = [torch.cuda.current_device()] if torch.cuda.is_available() else []
    with torch.random.fork_rng(devices=devices):
        torch.manual_seed(seed)
        outputs = llm.generate([TokensPrompt(prompt_token_ids=list(p)) for p in prompts], params, use_tqdm=False,
                               **adapter(lora_request))
    completions = []
    for output in outputs:
        # vLLM may return the n samples of a request in any order; sort by index for a reproducible layout.
        for sample in sorted(output.outputs, key=lambda o: o.index):
            # With logprobs=0 vLLM returns, per position, a dict holding the sampled token's log-probability.
            logprobs = tuple(step[token].logprob for step, token in zip(sample.logprobs, sample.token_ids))
            completions.append(
                Completion(sample.text, tuple(sample.token_ids), logprobs, sample.finish_reason or "length")
            )
    return completions


def adapter(lora_request) -> dict:
    """`generate`'s keyword for the adapter to apply (lora.AdapterPush); none at all without one."""
    return {} if lora_request is None else {"lora_request": lora_request}


def generate_stage1(llm, prompt_ids: Sequence[Sequence[int]], *, num_generations: int, temperature: float,
                    top_p: float, max_tokens: int, seed: int, step: int, rank: int,
                    lora_request=None) -> list[Completion]:
    """G samples per prompt. Returns N = B·G completions, grouped: prompt b owns indices b·G … b·G+G-1."""
    return _sample(llm, prompt_ids, num_generations, request_seed(seed, "stage1", step, rank),
                   temperature=temperature, top_p=top_p, max_tokens=max_tokens, lora_request=lora_request)


@dataclass(frozen=True)
class Stage2:
    """Stage-2 results, parallel to the stage-1 completions (N entries each; None where not regenerated)."""

    problems: list[str | None]  # the substituted problem text that was sampled from
    completions: list[Completion | None]
    too_long: int  # usable long answers whose new prompt exceeded the engine's context length


def generate_stage2(llm, problems: Sequence[str], completions: Sequence[Completion], *, num_generations: int,
                    render: Callable[[str], list[int]], max_prompt_tokens: int, temperature: float, top_p: float,
                    max_tokens: int, seed: int, step: int, rank: int, lora_request=None) -> Stage2:
    """One regeneration per stage-1 completion that has a long answer and whose prompt has a context block.

    `problems` holds the B dataset problems; completion i belongs to problems[i // G]. `render` turns a problem
    into chat-template token ids. Completions without a usable long answer get None (influence reward 0).
    """
    G = num_generations
    assert len(completions) == len(problems) * G, (len(completions), len(problems), G)
    new_problems: list[str | None] = []
    for i, completion in enumerate(completions):
        long_answer = extract_long_answer(completion.text)
        new_problems.append(None if long_answer is None else substitute_context(problems[i // G], long_answer))

    todo, prompts, too_long = [], [], 0
    for i, problem in enumerate(new_problems):
        if problem is None:
            continue
        ids = render(problem)
        if len(ids) > max_prompt_tokens:
            too_long += 1
            new_problems[i] = None
            continue
        todo.append(i)
        prompts.append(ids)
    sampled = _sample(llm, prompts, 1, request_seed(seed, "stage2", step, rank), temperature=temperature,
                      top_p=top_p, max_tokens=max_tokens, lora_request=lora_request) if todo else []
    results: list[Completion | None] = [None] * len(completions)
    for i, completion in zip(todo, sampled):
        results[i] = completion
    return Stage2(new_problems, results, too_long)


# --------------------------------------------------------------------------------------------------------------
# Weight push and its verification


class WeightSyncError(RuntimeError):
    """vLLM's weights do not match the trainer's after a push."""


def iter_full_parameters(model: torch.nn.Module, zero_stage: int) -> Iterator[tuple[str, torch.Tensor]]:
    """Yield (name, full tensor) for every parameter of the (DeepSpeed-wrapped) `model.module`.

    ZeRO-2 keeps full parameters on every rank, so they are yielded as they are. ZeRO-3 partitions them: each
    module's own parameters are gathered, copied out and released before the next module is touched
    (`own_full_parameters`), so at most one module is ever whole (never the whole model). Every rank must consume
    the iterator in step, because a gather is a collective.
    """
    if zero_stage < 3:
        for name, param in model.named_parameters():
            yield name, param.detach()
        return
    for module_name, module in model.named_modules():
        for name, tensor in own_full_parameters(module, zero_stage):
            yield (f"{module_name}.{name}" if module_name else name), tensor


def own_full_parameters(module: torch.nn.Module, zero_stage: int) -> list[tuple[str, torch.Tensor]]:
    """(name, full tensor) for the parameters `module` holds itself (not its children's).

    ZeRO-2: the parameters as they are. ZeRO-3: gathered and copied, because vLLM may buffer tensors until a
    whole layer has arrived and the gathered storage is freed when the gather ends. A collective under ZeRO-3:
    every rank must call it for the same module.
    """
    own = list(module.named_parameters(recurse=False))
    if zero_stage < 3 or not own:
        return [(name, p.detach()) for name, p in own]
    with deepspeed.zero.GatheredParameters([p for _, p in own]):
        return [(name, p.detach().clone()) for name, p in own]


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


def push_weights(llm, weights: Iterable[tuple[str, torch.Tensor]], *, repack: bool | None = None) -> float:
    """Load `weights` (Hugging Face names) into the engine in place and drop its prefix cache. Returns seconds.

    On the CPU with packed kernels, the kernels are rebuilt from the new parameters (`repack`; None means "when
    the engine's kernels are packed"). `repack=False` there leaves the engine generating from the old weights:
    the push verification (`check_sync`) must then fail, which tests/test_rollout.py shows.
    """
    start = time.perf_counter()
    llm.collective_rpc("reload_weights", kwargs={"weights_iterator": iter(weights)})
    if cpu_kernels_are_packed() if repack is None else repack:
        repack_cpu_linear(llm)
    # Cached KV blocks were computed by the old weights.
    llm.reset_prefix_cache()
    return time.perf_counter() - start


def vllm_token_logprobs(llm, prompt_ids: Sequence[int], completion_ids: Sequence[int],
                        lora_request=None) -> torch.Tensor:
    """vLLM's log-probabilities of `completion_ids` after `prompt_ids`, `(T,)` float32 (prompt logprobs)."""
    ids = list(prompt_ids) + list(completion_ids)
    params = SamplingParams(n=1, temperature=0.0, max_tokens=1, prompt_logprobs=0)
    output = llm.generate([TokensPrompt(prompt_token_ids=ids)], params, use_tqdm=False, **adapter(lora_request))[0]
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


# Relative disagreement of two WeightSums above which a push did not land (float64 summation in another order
# differs by ~1e-15; one step of a bf16 run changes the sums by far more, see check_weight_sums).
WEIGHT_SUMS_TOLERANCE = 1e-10


def summed(weights: Iterable[tuple[str, torch.Tensor]], sums: WeightSums,
           dtype: torch.dtype) -> Iterator[tuple[str, torch.Tensor]]:
    """`weights` passed on unchanged, each added to `sums` as the engine will hold it (cast to its `dtype`)."""
    for name, tensor in weights:
        sums.add(tensor.to(dtype))
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
    adapter is checked by its id (lora.AdapterPush).
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
