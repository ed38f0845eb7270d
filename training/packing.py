"""Prompt-shared packing: each prompt goes through the model once, however many completions it has.

A GRPO group is one prompt with G sampled completions. The plain way to score them pads G copies of
`prompt + completion` into a `(G, P + C)` batch, so the prompt — usually most of each row — is computed G times
and every completion is padded to the longest. Here a micro-batch becomes a single row instead:

    prompt₁ c₁₁ c₁₂ … c₁G  prompt₂ c₂₁ … c₂G …          (1, L) with L = Σ prompt lengths + Σ completion lengths

with a `(1, 1, L, L)` attention mask that lets every completion see its own prompt and its own earlier tokens,
nothing else, and position ids that restart after the prompt for each completion (each one sits at positions
P … P+|c|-1 exactly as in its own sequence). Every completion token therefore gets the same hidden state as in the
padded layout — the same function of the same inputs, only the prompt's work is shared — and the gradient to the
prompt positions is the sum over the G completions, exactly what G copies would have accumulated. No padding
token is ever computed.

A group shaped like the step benchmark's (a 210-token prompt, 7 completions of 40 to 128 tokens) is 705 tokens
instead of 2,366, and its forward and its forward + backward ran 2.6-2.7x faster on 2 CPU cores
(`bench/bench_packing.py`, figures in bench/RESULTS.md). The cost is a dense mask: attention scores are computed
for all L² pairs, most of them masked. That is cheap next to the linear layers while L is a few thousand tokens; a
model configured for flash-attention cannot take a 4D mask, so only the `sdpa` and `eager` implementations are
accepted.

Differs from CANOE (docs/differences.md, D11): each prompt is scored once per micro-batch, not once per completion.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch


# One group: a prompt's token ids and the token ids of each of its completions.
Group = tuple[Sequence[int], Sequence[Sequence[int]]]

SUPPORTED_ATTENTION = ("sdpa", "eager")
# The attention mask's rows are allocated in multiples of 8 elements (attention_mask), the alignment torch's CUDA
# attention asks of a mask's strides (docs/library-notes.md, "The packed mask on CUDA").
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
        """`(L, L)` bool: query token q may attend to key token k (same group, k not after q, and k in the prompt
        or in q's own completion). Built on each call, not stored: a step keeps all its micro-batches packed
        until it ends, and L² per micro-batch would hold gradient_accumulation_steps × L² bytes where the memory
        plan counts one mask, the one being used (memory_plan.activation_bytes)."""
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
    """Pack groups (prompt, completions) into one row; completions keep their order across groups.

    Each token carries a group index and a part: 0 for the prompt, i + 1 for the group's i-th completion. Token q
    may attend to key k when both are in the same group, k is not after q, and k is in the prompt or in q's own
    completion. The first token of each completion is predicted by the prompt's last position; every later token
    by the position before it.
    """
    ids: list[int] = []
    positions: list[int] = []
    group_of: list[int] = []
    part_of: list[int] = []
    predictors: list[int] = []
    targets: list[int] = []
    lengths: list[int] = []
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
    completions of an equal prompt share it, so a GRPO micro-batch (G completions per prompt, in order) becomes
    one group per prompt."""
    groups: list[tuple[Sequence[int], list[Sequence[int]]]] = []
    for prompt, completion in zip(prompts, completions, strict=True):
        if groups and list(groups[-1][0]) == list(prompt):
            groups[-1][1].append(completion)
        else:
            groups.append((prompt, [completion]))
    return pack(groups, device)


def attention_mask(model, allowed: torch.Tensor) -> torch.Tensor:
    """The additive `(1, 1, L, L)` mask for `allowed`, in the model's dtype (0 where allowed, the dtype's minimum
    elsewhere): the form both the `sdpa` and the `eager` attention of transformers add to the scores."""
    # A DeepSpeed engine wraps the model, and its own `.config` is DeepSpeed's config dict, which has no attention
    # setting: read the wrapped model's.
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
