"""Every GRPO variant beyond CANOE's, side by side with CANOE's own piece of each kind; `canoe.train_step` picks
them by the config's values, and with the defaults every one is off (D15). Each one's paper and what it did on our
runs: docs/loss-options.md.

- advantage rules (`ADVANTAGE_RULES`, the config's `advantage_rule`): CANOE's, or GDPO's decoupled one; Dr. GRPO's
  `advantage_std = "none"` is an argument of `grpo_loss.group_advantages`;
- the loss's pieces handed to `grpo_loss.grpo_loss` (`AGGREGATIONS`, `RATIO_LEVELS`, `SURROGATE_WEIGHTS`): DAPO's
  token-mean, Dr. GRPO's constant normaliser, GSPO's sequence ratio, truncated importance sampling; DAPO's
  clip-higher and PPO's μ passes per rollout are plain numbers (`Variants.create` gathers them for `canoe.update`);
- DAPO's masks (`kept_sequences`) and dynamic sampling (`dynamic_sampling`).

A new rule or piece is one function with its kind's signature (written above each registry) and one registry line.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import Tensor

from grpo_loss import group_advantages, seq_mean_token_mean, token_log_ratio, unit_weight, zero_variance_groups
from plumbing.runtime import all_reduce_values


# --- Advantage rules: (rewards (N,), scores (N, R), weights (R,), G, eps, std) -> advantages (N,)
#   rewards is the weighted sum scores @ weights; eps and std are the config's advantage_eps and advantage_std.


def canoe_advantages(rewards: Tensor, scores: Tensor, weights: Tensor, group_size: int, eps: float,
                     std: str) -> Tensor:
    """CANOE's rule: the group-relative advantages of the weighted sum of the rewards (grpo_loss.py's equations)."""
    return group_advantages(rewards, group_size, eps=eps, std=std)  # (N,)


def decoupled_advantages(rewards: Tensor, scores: Tensor, weights: Tensor, group_size: int, eps: float = 1e-4,
                         std: str = "unbiased") -> Tensor:
    """GDPO's decoupled normalisation (TRL's `multi_objective_aggregation = "normalize_then_sum"`): each reward is
    normalised inside its group first, then weighted and summed, so that a rarely varying reward (accuracy early on)
    does not drown in the others' noise:

        A_{i,k} = group_advantages(r_{·,k})_i              one advantage per reward k (0 where r_k is constant)
        S_i     = Σ_k w_k A_{i,k}
        A_i     = (S_i - mean(S)) / (std(S) + eps)         over this rank's N sequences, TRL's over every rank's (D20)

    >>> decoupled_advantages(None, torch.tensor([[1.0, 0.0], [0.0, 0.0], [1.0, 1.0], [1.0, 0.0]]),
    ...                      torch.tensor([1.0, 1.0]), group_size=2, eps=0.0, std="biased")
    tensor([ 1., -1.,  1., -1.])
    """
    if scores.dim() != 2 or weights.shape != scores.shape[1:]:
        raise ValueError(f"scores must be (N, R) and weights (R,), got {tuple(scores.shape)} and "
                         f"{tuple(weights.shape)}")
    values = scores.to(torch.float32)
    each = torch.stack([group_advantages(values[:, k], group_size, eps, std) for k in range(values.shape[1])],
                       dim=1)  # (N, R)
    summed = each @ weights.to(each)  # (N,)
    if bool(summed.amax() == summed.amin()):
        return torch.zeros_like(summed)
    spread = summed.std(correction=1 if std == "unbiased" else 0) if std != "none" else summed.new_tensor(1.0)
    return (summed - summed.mean()) / (spread + eps)  # (N,)


ADVANTAGE_RULES: dict[str, Callable[..., Tensor]] = {
    "sum_then_normalize": canoe_advantages,  # CANOE
    "normalize_then_sum": decoupled_advantages,  # GDPO
}


# --- The loss's pieces: grpo_loss.grpo_loss is CANOE's loss and calls one piece of each kind, CANOE's by default;
# `Variants` hands it the ones the config names. Every tensor is in the loss's working dtype (float32, or float64
# for float64 inputs); `mask` (N, T) is 1.0 at the trained tokens and 0.0 elsewhere.
#
# Aggregations: (per_token (N, T), mask (N, T), sequences, tokens, max_tokens) -> loss ()
#   per_token is each token's loss ℓ, 0 outside the mask; sequences and tokens are the whole batch's counts (the
#   config's max_completion_tokens is max_tokens). The loss must be a sum over this call's sequences divided by
#   such batch-wide constants, so that the micro-batches' losses add up to the batch's (grpo_loss's contract).
# Ratio levels: (log_ratio (N, T), mask (N, T)) -> log_ratio (N, T)
#   log ρ per token, logp - logp_old at the trained tokens and 0 elsewhere, in and out.
# Surrogate weights: (old (N, T), vllm (N, T) or None, mask (N, T), cap) -> (w (N, T), capped (N, T) bool)
#   a constant weight per token that the clipped surrogate is multiplied by (the KL term is not), from π_old, the
#   sampler's log-probabilities and the config's importance_cap; capped marks the trained tokens w was capped at.


def token_mean(per_token: Tensor, mask: Tensor, sequences: float, tokens: float | Tensor,
               max_tokens: int | None) -> Tensor:
    """DAPO: the mean over every trained token of the batch, so a long completion's tokens weigh as much as a
    short one's (in CANOE's mean of means each token of a long completion weighs less)."""
    return per_token.sum() / tokens


def seq_mean_token_sum_norm(per_token: Tensor, mask: Tensor, sequences: float, tokens: float | Tensor,
                            max_tokens: int | None) -> Tensor:
    """Dr. GRPO: the token losses summed and divided by a constant, sequences × L_max, so that neither a
    completion's length nor the batch's token count rescales a token's gradient."""
    if not (max_tokens or 0) > 0:
        raise ValueError(f"seq-mean-token-sum-norm needs max_completion_tokens > 0, got {max_tokens}")
    return per_token.sum() / (sequences * max_tokens)


AGGREGATIONS: dict[str, Callable[..., Tensor]] = {
    "seq-mean-token-mean": seq_mean_token_mean,  # CANOE (DeepSeekMath eq. 3)
    "token-mean": token_mean,  # DAPO
    "seq-mean-token-sum-norm": seq_mean_token_sum_norm,  # Dr. GRPO
}


def sequence_log_ratio(log_ratio: Tensor, mask: Tensor) -> Tensor:
    """GSPO: one ratio per sequence, the mean log-ratio of its trained tokens (the geometric mean of their ratios)
    for every one of them, so a single token cannot move its sequence's ratio alone."""
    mean = log_ratio.sum(dim=1, keepdim=True) / mask.sum(dim=1, keepdim=True).clamp(min=1)  # (N, 1)
    return torch.where(mask != 0, mean, 0.0)  # (N, T)


RATIO_LEVELS: dict[str, Callable[..., Tensor]] = {
    "token": token_log_ratio,  # CANOE (PPO's)
    "sequence": sequence_log_ratio,  # GSPO
}


def truncated_importance(old: Tensor, vllm: Tensor | None, mask: Tensor, cap: float) -> tuple[Tensor, Tensor]:
    """Truncated importance sampling: w = min(π_old / π_sampler, C) per token, a constant. vLLM samples with
    kernels of its own, so its probabilities differ from the trainer's π_old; w corrects the surrogate for it."""
    if not cap > 0 or vllm is None:
        raise ValueError(f"truncated importance sampling needs importance_cap > 0 and vllm_logprobs, got {cap}")
    raw = torch.exp(torch.where(mask != 0, old - vllm.detach().to(old.dtype), 0.0))  # (N, T)
    return raw.clamp(max=cap), (mask != 0) & (raw > cap)  # (N, T), (N, T)


SURROGATE_WEIGHTS: dict[str, Callable[..., tuple[Tensor, Tensor]]] = {
    "none": unit_weight,  # CANOE: w = 1 (the config's importance_cap = 0)
    "truncated_importance": truncated_importance,  # importance_cap > 0 (Yao et al. 2025)
}


# --- DAPO's masks: which sequences enter the loss -----------------------------------------------------------------


def kept_sequences(advantages: Tensor, completions: list, group_size: int, mask_truncated: bool = False,
                   skip_zero_variance_groups: bool = False) -> Tensor:
    """`(N,)` bool: which sequences enter the loss, all of them unless a DAPO mask is on (arXiv 2503.14476).
    `mask_truncated` drops a completion cut off by the token limit (its reward judges an unfinished text);
    `skip_zero_variance_groups` drops every sequence of a group whose `advantages` `(N,)` are all equal (only the KL
    would train). The dropped ones leave the mask and the loss's denominators.

    >>> from types import SimpleNamespace
    >>> done = [SimpleNamespace(finish_reason=reason) for reason in ("stop", "stop", "length", "stop")]
    >>> kept_sequences(torch.tensor([0.0, 0.0, 1.0, -1.0]), done, 2, mask_truncated=True,
    ...                skip_zero_variance_groups=True)
    tensor([False, False, False,  True])
    """
    if advantages.shape != (len(completions),) or len(completions) % group_size:
        raise ValueError(f"advantages must be (N,) for the N = {len(completions)} completions, a multiple of "
                         f"G = {group_size}; got {tuple(advantages.shape)}")
    kept = torch.ones(len(completions), dtype=torch.bool, device=advantages.device)  # (N,)
    if mask_truncated:
        kept &= torch.tensor([c.finish_reason != "length" for c in completions], device=advantages.device)
    if skip_zero_variance_groups:
        kept &= ~zero_variance_groups(advantages, group_size).repeat_interleave(group_size)  # (N,)
    return kept


# --- DAPO's dynamic sampling: groups that teach nothing are replaced by groups of newly drawn prompts -------------


def refills(zero_variance: Tensor, varied: Tensor) -> list[tuple[int, int]]:
    """(slot, source) pairs: the i-th zero-variance group of the batch (`zero_variance`, (B,) bool) is replaced by
    the i-th varied group of a new draw (`varied`, (B,) bool), as far as the varied groups go.

    >>> refills(torch.tensor([True, False, True]), torch.tensor([False, True, True]))
    [(0, 1), (2, 2)]
    """
    return list(zip(zero_variance.nonzero().flatten().tolist(), varied.nonzero().flatten().tolist()))


def flat_groups(scores: Tensor, cfg) -> Tensor:
    """`(B,)` bool: the groups whose advantages, as `canoe.train_step` computes them from `scores` `(N, R)` with the
    config's rule, are all equal: they teach nothing but the KL."""
    weights, G = cfg.reward_weights, cfg.num_generations  # (R,)
    rule = ADVANTAGE_RULES[cfg.advantage_rule]
    return zero_variance_groups(rule(scores @ weights, scores, weights, G, cfg.advantage_eps, cfg.advantage_std), G)


def dynamic_sampling(run, batch, rollout: Callable):
    """`batch` (rollout.Rollout, drawn by `rollout(run, 0)`) refilled: while some rank holds a group whose advantages
    are all equal (`flat_groups`) and fewer than the config's `dynamic_sampling_draws` extra draws were made, every
    rank draws its next B prompts (`rollout(run, draw)`), samples and scores them, and each such group is replaced,
    in order, by a new group whose advantages vary (`refills`). Groups still without variance after the last draw
    stay. The ranks draw together, so their samplers stay in step (and a checkpoint resumes them). Logs
    `rollout/extra_draws`, `rollout/replaced_groups`.
    """
    extra = replaced = 0
    for draw in range(1, run.cfg.dynamic_sampling_draws + 1):
        holes = flat_groups(batch.scores, run.cfg)  # (B,)
        (anyone,) = all_reduce_values([float(holes.any())], op=dist.ReduceOp.MAX)
        if not anyone:
            break
        extra += 1
        fresh = rollout(run, draw)
        pairs = refills(holes, ~flat_groups(fresh.scores, run.cfg))
        batch = batch.refilled(fresh, pairs)
        replaced += len(pairs)
    return dataclasses.replace(batch, metrics={"rollout/extra_draws": extra, "rollout/replaced_groups": replaced})


# --- The loss's options, as canoe.update reads them ----------------------------------------------------------------


@dataclass(frozen=True)
class Variants:
    """What `canoe.update` reads from the run: μ, and grpo_loss.grpo_loss's keyword options with the config's ε, β
    and its pieces resolved from the registries above (CANOE's by default)."""

    num_iterations: int  # μ
    loss: dict  # grpo_loss.grpo_loss's keyword options

    @classmethod
    def create(cls, cfg) -> Variants:
        weight = "truncated_importance" if cfg.importance_cap > 0 else "none"
        loss = {"clip_eps_low": cfg.clip_eps_low, "clip_eps_high": cfg.clip_eps_high, "beta": cfg.beta,
                "max_completion_tokens": cfg.max_completion_tokens, "importance_cap": cfg.importance_cap,
                "aggregation": AGGREGATIONS[cfg.aggregation], "ratio_level": RATIO_LEVELS[cfg.ratio_level],
                "surrogate_weight": SURROGATE_WEIGHTS[weight]}
        return cls(cfg.num_iterations, loss)
