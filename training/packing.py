"""Prompt-shared packing: each prompt goes through the model once, however many completions it has.

A GRPO group is one prompt with G completions. Instead of G padded copies of `prompt + completion`, a micro-batch
becomes one row, `prompt₁ c₁₁ … c₁G prompt₂ c₂₁ … c₂G …` of L = Σ prompt lengths + Σ completion lengths tokens,
with a `(1, 1, L, L)` attention mask that lets every completion see only its own prompt and its own earlier tokens,
and position ids that restart after the prompt for each completion. Every completion token thus gets the same hidden
state as in its own sequence, and the prompt's gradient is the sum over the G completions, as G copies would have
accumulated; no padding token is computed. The cost is a dense mask (all L² scores computed, most masked); a model
configured for flash-attention cannot take a 4D mask, so only `sdpa` and `eager` are accepted.
CANOE scores each prompt once per completion (docs/differences.md, D11). bench/bench_packing.py measures the gain.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Sequence

import torch


# One group: a prompt's token ids and the token ids of each of its completions.
Group = tuple[Sequence[int], Sequence[Sequence[int]]]

SUPPORTED_ATTENTION = ("sdpa", "eager")
# The attention mask's rows are allocated in multiples of 8 elements, the alignment torch's CUDA attention asks of
# a mask's strides (docs/library-notes.md, "The packed mask on CUDA").
MASK_ALIGNMENT = 8


@dataclass
class Packed:
    """A micro-batch packed into one row (shapes in the comments; n completions, L packed tokens)."""

    input_ids: torch.Tensor  # (1, L)
    position_ids: torch.Tensor  # (1, L)
    group: torch.Tensor  # (L,) the group (prompt) each token belongs to
    part: torch.Tensor  # (L,) 0 for a prompt token, i + 1 for a token of its group's i-th completion
    predictors: torch.Tensor  # (T,) position whose logits predict each completion token, T = Σ|c|
    targets: torch.Tensor  # (T,) the completion tokens, completion after completion
    completion_mask: torch.Tensor  # (n, C) float, 1 on each completion's tokens, C = longest completion

    @property
    def num_tokens(self) -> int:
        return self.input_ids.shape[1]

    @property
    def allowed(self) -> torch.Tensor:
        """`(L, L)` bool: query token q may attend to key token k. Built on each call, not stored: a step keeps all
        its micro-batches packed, and the memory plan counts one mask, the one in use (memory_plan.activation_bytes)."""
        index = torch.arange(self.num_tokens, device=self.group.device)  # (L,)
        return (
            (self.group[:, None] == self.group[None, :])
            & (index[None, :] <= index[:, None])
            & ((self.part[None, :] == 0) | (self.part[None, :] == self.part[:, None]))
        )  # (L, L)

    def attention_mask(self, model) -> torch.Tensor:
        """The additive `(1, 1, L, L)` mask of `allowed` for `model` (`attention_mask`)."""
        return attention_mask(model, self.allowed)


def pack(groups: Sequence[Group], device: torch.device | str = "cpu") -> Packed:
    """Pack groups (prompt, completions) into one row, completions in order; ValueError on an empty prompt.

    Token q may attend to key k when both are in the same group, k is not after q, and k is in the prompt or in
    q's own completion. A completion's first token is predicted by the prompt's last position, every later token by
    the position before it.
    """
    ids, positions, group_of, part_of = [], [], [], []  # per packed token
    predictors, targets, lengths = [], [], []  # per completion token (the first two), per completion
    for g, (prompt, completions) in enumerate(groups):
        if not prompt:
            raise ValueError(f"group {g}: empty prompt (a completion needs a position to be predicted from)")
        prompt_end = len(ids) + len(prompt) - 1  # packed index of the prompt's last token
        ids += prompt
        positions += range(len(prompt))
        group_of += [g] * len(prompt)
        part_of += [0] * len(prompt)
        for i, completion in enumerate(completions):
            start = len(ids)
            ids += completion
            positions += range(len(prompt), len(prompt) + len(completion))
            group_of += [g] * len(completion)
            part_of += [i + 1] * len(completion)
            if completion:
                predictors += [prompt_end, *range(start, start + len(completion) - 1)]
            targets += completion
            lengths.append(len(completion))

    lengths_t = torch.tensor(lengths)  # (n,)
    completion_mask = (torch.arange(max(1, max(lengths, default=1)))[None, :] < lengths_t[:, None]).float()  # (n, C)
    return Packed(
        input_ids=torch.tensor([ids], dtype=torch.long, device=device),
        position_ids=torch.tensor([positions], dtype=torch.long, device=device),
        group=torch.tensor(group_of, device=device),  # (L,); the (L, L) mask is built where it is used
        part=torch.tensor(part_of, device=device),
        predictors=torch.tensor(predictors, dtype=torch.long, device=device),
        targets=torch.tensor(targets, dtype=torch.long, device=device),
        completion_mask=completion_mask.to(device),
    )


def pack_micro_batch(prompts: Sequence[Sequence[int]], completions: Sequence[Sequence[int]],
                     device: torch.device | str = "cpu") -> Packed:
    """Pack completions given with the prompt of each (`prompts[i]` belongs to `completions[i]`): consecutive
    completions of an equal prompt share it, so a GRPO micro-batch becomes one group per prompt."""
    runs = itertools.groupby(zip(prompts, completions, strict=True), key=lambda pair: list(pair[0]))
    return pack([(prompt, [completion for _, completion in run]) for prompt, run in runs], device)


def attention_mask(model, allowed: torch.Tensor) -> torch.Tensor:
    """The additive `(1, 1, L, L)` mask for `allowed` in the model's dtype (0 where allowed, the dtype's minimum
    elsewhere), as transformers' `sdpa` and `eager` attention add it; ValueError for other attention."""
    # A DeepSpeed engine's own `.config` is DeepSpeed's config dict: read the wrapped model's.
    config = getattr(getattr(model, "module", model), "config", None)
    implementation = getattr(config, "_attn_implementation", "sdpa")
    if implementation not in SUPPORTED_ATTENTION:
        raise ValueError(f"packed sequences need a 4D attention mask, which attn_implementation={implementation!r} "
                         f"does not take; load the model with one of {SUPPORTED_ATTENTION}")
    dtype = next(model.parameters()).dtype
    L = allowed.shape[-1]
    # Rows padded to a multiple of MASK_ALIGNMENT and sliced back to L: CUDA's memory-efficient attention copies a
    # mask whose strides are not multiples of 8 into an aligned one, in every layer, and keeps it for backward.
    row = -(-L // MASK_ALIGNMENT) * MASK_ALIGNMENT
    mask = torch.zeros((L, row), dtype=dtype, device=allowed.device)[:, :L]  # (L, L), strides (row, 1)
    return mask.masked_fill_(~allowed, torch.finfo(dtype).min)[None, None]  # (1, 1, L, L)
