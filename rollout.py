"""Rollouts for Dual-GRPO: vLLM's two sampling stages and the context substitution between them.

Stage 1 samples G completions per prompt. Stage 2 (CANOE's "dual" part) puts each stage-1 completion's
`<long_answer>` in place of its prompt's `<context>` block and samples ONE new completion from that, at the same
temperature; the influence reward asks whether it still answers. Stage-2 completions are scored, never trained on.
vLLM runs inside each training process (one engine per rank, tensor parallel 1): no server, no extra GPUs.
Sampling is seeded from the run seed, step, rank and stage (D8), so a resumed run draws what the uninterrupted
one would have: on CUDA per request, on the CPU by seeding torch's generator around each call (`seeds_per_request`).
"""

from __future__ import annotations

from plumbing import runtime  # noqa: I001  (first: it sets the thread count and vLLM's mode before torch and vLLM load)

import hashlib
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch
from vllm import LLM, SamplingParams
from vllm.inputs import TokensPrompt

from plumbing import weight_sync
from grading.tags import replace_content, tag_content


# --- Stage-2 prompt construction (pure) ---------------------------------------------------------------------------


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
    """Replace the content of the first `<context>…</context>` block of `problem` with `long_answer`
    (`tags.replace_content`, the block data.py checked); None when the problem has no context block.
    Differs from CANOE (docs/differences.md, D6): the long answer is inserted literally (no regex escapes, no
    backreference expansion).

    >>> substitute_context("<context>old</context>\\n\\nQ?", r"a.b \\1 c")
    '<context>a.b \\\\1 c</context>\\n\\nQ?'
    """
    return replace_content(problem, "context", long_answer) if isinstance(problem, str) else None


# --- Sampling -----------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Completion:
    """One sampled completion: vLLM's text, token ids and the log-probability of each sampled token; none for
    stage 2's, which are scored, never trained on. Asking for none leaves the draw as it is: vLLM's sampler computes
    the processed log-probabilities it samples from either way, and gathers them only after sampling, for the
    requests that ask (vllm/v1/sample/sampler.py, `Sampler.forward`)."""

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

    On CUDA vLLM draws an unseeded request's seed from numpy's global generator, seeded alike on every rank and
    not saved by `--resume`; on the CPU its V1 runner cannot use a seeded request's generator (it raises), so
    there `_sample` seeds torch's generator instead. Evidence: docs/library-notes.md, "Sampling seeds".
    """
    return torch.cuda.is_available()


def prompt_seed(seed: int, index: int) -> int:
    """The seed of the `index`-th prompt of a `generate` call whose draw is `seed` (`request_seed`): 62 bits, so
    that vLLM's seed + i of the i-th sample stays a signed 64-bit integer (its seeds are int64 arrays)."""
    return request_seed(seed, index) >> 1


def make_engine(model_path: str, *, dtype: str, seed: int, max_model_len: int, gpu_memory_utilization: float,
                enable_sleep_mode: bool, cpu_kv_cache_gib: float = 1.0, lora_rank: int = 0,
                trainer_seed: int | None = None):
    """One colocated vLLM engine for this training process (docs/library-notes.md, "vLLM", for each setting).

    Sleep mode sends the CUDA graphs to sleep too, since the memory plan counts that memory as the trainer's. On
    the CPU the KV cache gets `cpu_kv_cache_gib` (vLLM's CPU worker would take a share of the host's memory and
    refuse to start without it free). `lora_rank > 0` lets vLLM apply one LoRA adapter (lora.AdapterPush).
    `trainer_seed` reseeds torch after the start-up, which seeds it alike on every rank (LoRA dropout masks).
    Sampled tokens carry vLLM's processed log-probabilities, log-softmax of the logits after the temperature (and
    top-p), the distribution that drew them, which the trainer's π at the same temperature matches (D21); vLLM's
    default, raw ones are before the temperature. Prompt log-probabilities (the push's probe) are raw in either mode.
    """
    lora = {}
    if lora_rank:
        allowed = (1, 8, 16, 32, 64, 128, 256, 320, 512)
        lora = dict(enable_lora=True, max_loras=1, max_cpu_loras=1,
                    max_lora_rank=min((r for r in allowed if r >= lora_rank), default=lora_rank))
    if not torch.cuda.is_available():
        # Set, not defaulted: vLLM reads it when each engine starts, and a value left by an earlier engine of this
        # process, or inherited from its parent, would silently replace this engine's own size.
        os.environ["VLLM_CPU_KVCACHE_SPACE"] = str(max(1, round(cpu_kv_cache_gib)))
        weight_sync.keep_cpu_linear_weights()

    llm = LLM(model=model_path, dtype=dtype, seed=seed, max_model_len=max_model_len,
              gpu_memory_utilization=gpu_memory_utilization, enable_prefix_caching=True,
              distributed_executor_backend="external_launcher", tensor_parallel_size=1,
              enable_sleep_mode=enable_sleep_mode, sleep_mode_offload_cudagraph=enable_sleep_mode,
              enforce_eager=not torch.cuda.is_available(), logprobs_mode="processed_logprobs", **lora)
    if trainer_seed is not None:
        torch.manual_seed(trainer_seed)
    return llm


def _sample(llm, prompts: Sequence[Sequence[int]], n: int, seed: int, *, temperature: float, top_p: float,
            max_tokens: int, lora_request=None, prefix: str = "", logprobs: bool = True) -> list[Completion]:
    """`n` samples per prompt, prompt-major: len(prompts)·n completions, drawn from `seed` alone (on CUDA each
    prompt's request carries `prompt_seed`, on the CPU torch's generator is seeded for the call and the trainer's
    stream restored after it). `lora_request` names the adapter the engine applies (plumbing/lora.py,
    `AdapterPush`), None for plain weights; `prefix` (the response prefix, which ends the prompt) is put back in
    front of each text, since the rewards judge the whole answer. `logprobs=False`: none asked for (`Completion`).
    """
    settings = dict(n=n, temperature=temperature, top_p=top_p, max_tokens=max_tokens, logprobs=0 if logprobs else None)
    if seeds_per_request():
        params = [SamplingParams(**settings, seed=prompt_seed(seed, index)) for index in range(len(prompts))]
    else:
        params = SamplingParams(**settings)
    devices = [torch.cuda.current_device()] if torch.cuda.is_available() else []
    with torch.random.fork_rng(devices=devices):
        torch.manual_seed(seed)
        outputs = llm.generate([TokensPrompt(prompt_token_ids=list(p)) for p in prompts], params, use_tqdm=False,
                               **weight_sync.request_kwargs(lora_request))
    completions = []
    for output in outputs:
        # vLLM may return the n samples of a request in any order; sort by index for a reproducible layout.
        for sample in sorted(output.outputs, key=lambda o: o.index):
            # With logprobs=0 vLLM returns, per position, a dict holding the sampled token's log-probability.
            logprobs = tuple(step[token].logprob for step, token in zip(sample.logprobs or (), sample.token_ids))
            completions.append(Completion(prefix + sample.text, tuple(sample.token_ids), logprobs,
                                          sample.finish_reason or "length"))
    return completions


def generate_stage1(llm, prompt_ids: Sequence[Sequence[int]], *, num_generations: int, temperature: float,
                    top_p: float, max_tokens: int, seed: int, step: int | str, rank: int, lora_request=None,
                    prefix: str = "") -> list[Completion]:
    """G samples per prompt. Returns N = B·G completions, grouped: prompt b owns indices b·G … b·G+G-1."""
    return _sample(llm, prompt_ids, num_generations, request_seed(seed, "stage1", step, rank),
                   temperature=temperature, top_p=top_p, max_tokens=max_tokens, lora_request=lora_request,
                   prefix=prefix)


@dataclass(frozen=True)
class Stage2:
    """Stage-2 results, parallel to the stage-1 completions (N entries each; None where not regenerated)."""

    problems: list[str | None]  # the substituted problem text that was sampled from
    completions: list[Completion | None]
    too_long: int  # usable long answers whose new prompt exceeded the engine's context length

    @classmethod
    def none(cls, n: int) -> Stage2:
        """No stage 2 (the config's `dual = false`): n entries, none regenerated."""
        return cls([None] * n, [None] * n, 0)


def generate_stage2(llm, problems: Sequence[str], completions: Sequence[Completion], *, group_size: int,
                    render: Callable[[str], list[int]], max_prompt_tokens: int, temperature: float, top_p: float,
                    max_tokens: int, seed: int, step: int | str, rank: int, lora_request=None,
                    prefix: str = "") -> Stage2:
    """One regeneration per stage-1 completion that has a long answer, whose prompt has a context block and whose
    new prompt, rendered by `render` into chat-template token ids, fits in `max_prompt_tokens`; the others get None
    (influence reward 0). Completion i belongs to problems[i // G] of the B dataset problems, G = `group_size`.
    """
    G = group_size
    assert len(completions) == len(problems) * G, (len(completions), len(problems), G)
    # the problem each completion's stage 2 samples from, the indices sampled, their prompts, the prompts too long
    new_problems, todo, prompts, too_long = [], [], [], 0
    for i, completion in enumerate(completions):
        long_answer = extract_long_answer(completion.text)
        problem = None if long_answer is None else substitute_context(problems[i // G], long_answer)
        if problem is not None:
            ids = render(problem)
            if len(ids) > max_prompt_tokens:
                too_long += 1
                problem = None
            else:
                todo.append(i)
                prompts.append(ids)
        new_problems.append(problem)
    sampled = _sample(llm, prompts, 1, request_seed(seed, "stage2", step, rank), temperature=temperature, top_p=top_p,
                      max_tokens=max_tokens, lora_request=lora_request, prefix=prefix, logprobs=False) if todo else []
    by_index = dict(zip(todo, sampled))
    return Stage2(new_problems, [by_index.get(i) for i in range(len(completions))], too_long)


@dataclass(frozen=True)
class Rollout:
    """A step's sampled and scored batch: B prompts, their N = B·G completions, the N stage-2 entries and the
    `(N, R)` scores of the configured rewards; `metrics` what the rollout logs beyond them."""

    rows: list[dict]
    completions: list[Completion]
    stage2: Stage2
    scores: torch.Tensor  # (N, R)
    metrics: dict[str, float] = field(default_factory=dict)

    def refilled(self, fresh: Rollout, pairs: list[tuple[int, int]]) -> Rollout:
        """This batch with group `slot` replaced by `fresh`'s group `source` for each (slot, source) pair
        (dynamic sampling, variants.py); stage 2's `too_long` counts both draws."""
        G = len(self.completions) // len(self.rows)
        rows, completions, scores = list(self.rows), list(self.completions), self.scores.clone()
        problems, stage2 = list(self.stage2.problems), list(self.stage2.completions)
        for slot, source in pairs:
            rows[slot] = fresh.rows[source]
            into, out_of = slice(slot * G, (slot + 1) * G), slice(source * G, (source + 1) * G)
            completions[into], scores[into] = fresh.completions[out_of], fresh.scores[out_of]
            problems[into], stage2[into] = fresh.stage2.problems[out_of], fresh.stage2.completions[out_of]
        too_long = self.stage2.too_long + fresh.stage2.too_long
        return Rollout(rows, completions, Stage2(problems, stage2, too_long), scores)
