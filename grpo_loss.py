"""The GRPO objective of CANOE's Dual-GRPO: group-relative advantages, the clipped surrogate with a k3 KL penalty,
and the log-probabilities of sampled tokens: `plain_completion_logprobs` computes them one sequence at a time, to
read first; `completion_logprobs`, which training uses, packs each prompt with its G completions into one row and
never upcasts the whole logits tensor.

Pure tensor functions (the model's forward in the two log-probability functions aside). Shapes: B prompts, G samples per
prompt, N = B·G sequences, T completion positions, V vocabulary. The equations (DeepSeekMath, Shao et al. 2024,
Sec. 4.1, eq. 3-4), with the constants of the CANOE original (TRL's GRPOTrainer of early 2025):

    advantage   A_i     = (r_i - mean(r_group)) / (std(r_group) + eps)       eps = 1e-4, unbiased std
    ratio       ρ_{i,t} = exp(logp_{i,t} - logp_old_{i,t})
    surrogate   s_{i,t} = min(ρ_{i,t} A_i, clip(ρ_{i,t}, 1 - ε_low, 1 + ε_high) A_i)      ε_low = ε_high = 0.2
    KL (k3)     D_{i,t} = exp(ref_{i,t} - logp_{i,t}) - (ref_{i,t} - logp_{i,t}) - 1     β = 0.04
    token loss  ℓ_{i,t} = -(s_{i,t} - β D_{i,t})
    loss        L = (1/N) Σ_i (1/|o_i|) Σ_{t ∈ o_i} ℓ_{i,t}          "seq-mean-token-mean" (DeepSeekMath eq. 3)

where o_i is the set of trained positions of sequence i (its `mask`); k3 is Schulman's unbiased, non-negative
estimator of KL(π_θ ‖ π_ref) from samples of π_θ. `grpo_loss` is this loss; each option is a piece handed to it in
place of CANOE's (`seq_mean_token_mean`, `token_log_ratio`, `unit_weight`), the others registered in variants.py
with their papers. With μ = 1 the driver passes π_θ detached as π_old, so ρ ≡ 1 and the clip never acts.

Micro-batches: called once per micro-batch with `total_sequences` and `total_tokens` of the whole batch, the
SUM of the returned losses and of their gradients equals the loss of the whole batch in one call; the caller undoes
anything that rescales it on the way (DeepSpeed's division by the accumulation steps). The metrics are sums, counts
and extremes, so micro-batches and ranks combine exactly (`merge_metrics`, then `summarize_metrics`).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable

import torch
from torch import Tensor

ADVANTAGE_STDS = ("unbiased", "biased", "none")

# How each raw metric returned by `grpo_loss` combines across micro-batches and ranks: "sum" adds, "min"/"max"
# keep the extreme. Across ranks, all-reduce each key with the matching op (SUM, MIN, MAX).
METRIC_REDUCTIONS: dict[str, str] = {
    "tokens": "sum",  # number of trained (masked) tokens
    "kl_sum": "sum",  # Σ over trained tokens of the k3 KL estimate
    "clipped_tokens": "sum",  # trained tokens whose surrogate took the clipped branch (see grpo_loss)
    "ratio_sum": "sum",  # Σ over trained tokens of ρ
    "ratio_min": "min",  # min ρ over trained tokens (+inf when there are none)
    "ratio_max": "max",  # max ρ over trained tokens (-inf when there are none)
    "importance_sum": "sum",  # Σ over trained tokens of the importance weight w (1 when the correction is off)
    "importance_capped": "sum",  # trained tokens whose weight was capped at C
}


def group_advantages(rewards: Tensor, group_size: int, eps: float = 1e-4, std: str = "unbiased") -> Tensor:
    """Group-relative advantages (DeepSeekMath Sec. 4.1.2): A = (r - mean) / (std + eps) within each group of G.

    `rewards` `(N,)` holds each prompt's G = `group_size` samples consecutively. `std`: "unbiased" (G - 1, as the
    original), "biased" (G) or "none" (A = r - mean: Dr. GRPO). A group whose rewards are all equal gets exactly 0,
    not a rounding error over eps (D19). Returns a new `(N,)` float tensor.

    >>> group_advantages(torch.tensor([1.0, 1.0, 1.0, 0.0, 2.0, 4.0]), group_size=3, std="biased")
    tensor([ 0.0000,  0.0000,  0.0000, -1.2247,  0.0000,  1.2247])
    """
    if rewards.dim() != 1:
        raise ValueError(f"rewards must be 1-D (N,), got shape {tuple(rewards.shape)}")
    if group_size < 2:
        raise ValueError(f"group_size must be at least 2 to compare samples within a group, got {group_size}")
    if rewards.numel() % group_size != 0:
        raise ValueError(f"the number of rewards ({rewards.numel()}) is not a multiple of group_size ({group_size})")
    if std not in ADVANTAGE_STDS:
        raise ValueError(f"std must be one of {ADVANTAGE_STDS}, got {std!r}")
    values = rewards if rewards.is_floating_point() else rewards.to(torch.float32)
    grouped = values.reshape(-1, group_size)  # (B, G)
    mean = grouped.mean(dim=1, keepdim=True)  # (B, 1)
    if std == "none":
        advantages = grouped - mean  # (B, G)
    else:
        spread = grouped.std(dim=1, keepdim=True, correction=1 if std == "unbiased" else 0)  # (B, 1)
        advantages = (grouped - mean) / (spread + eps)  # (B, G)
    constant = zero_variance_groups(values, group_size)[:, None]  # (B, 1)
    advantages = torch.where(constant, torch.zeros_like(advantages), advantages)  # (B, G)
    return advantages.reshape(-1)  # (N,)


def zero_variance_groups(values: Tensor, group_size: int) -> Tensor:
    """`(B, ...)` bool: True for the groups whose G values (rewards, or advantages) are all equal. A group whose
    advantages are all equal teaches nothing but the KL term; DAPO's masks and dynamic sampling act on these.

    >>> zero_variance_groups(torch.tensor([1.0, 1.0, 0.0, 2.0]), group_size=2)
    tensor([ True, False])
    """
    grouped = values.reshape(-1, group_size, *values.shape[1:])  # (B, G, ...)
    return grouped.amax(dim=1) == grouped.amin(dim=1)  # (B, ...)


def seq_mean_token_mean(per_token: Tensor, mask: Tensor, sequences: float, tokens: float | Tensor,
                        max_tokens: int | None) -> Tensor:
    """CANOE's aggregation (DeepSeekMath eq. 3): each sequence's mean over its trained tokens, then the mean over
    the batch's `sequences` (the shared signature: variants.py)."""
    # An empty completion adds 0, not 0/0 = NaN (D13, with the explicit mask).
    per_sequence = per_token.sum(dim=1) / mask.sum(dim=1).clamp(min=1)  # (N,)
    return per_sequence.sum() / sequences


def token_log_ratio(log_ratio: Tensor, mask: Tensor) -> Tensor:
    """CANOE's ratio: one per token, log ρ_{i,t} = logp_{i,t} - logp_old_{i,t}, as given (signature: variants.py)."""
    return log_ratio  # (N, T)


def unit_weight(old: Tensor, vllm: Tensor | None, mask: Tensor, cap: float) -> tuple[Tensor, Tensor]:
    """CANOE's surrogate weight: w = 1 for every token, none capped (signature: variants.py)."""
    return torch.ones_like(old), torch.zeros_like(mask, dtype=torch.bool)  # (N, T), (N, T)


def grpo_loss(logprobs: Tensor, old_logprobs: Tensor, ref_logprobs: Tensor | None, advantages: Tensor, mask: Tensor,
              *, clip_eps_low: float = 0.2, clip_eps_high: float = 0.2, beta: float = 0.04,
              total_sequences: float | None = None, total_tokens: float | None = None,
              max_completion_tokens: int | None = None, vllm_logprobs: Tensor | None = None,
              importance_cap: float = 0.0, aggregation: Callable[..., Tensor] = seq_mean_token_mean,
              ratio_level: Callable[..., Tensor] = token_log_ratio,
              surrogate_weight: Callable[..., tuple[Tensor, Tensor]] = unit_weight,
              trace: dict | None = None) -> tuple[Tensor, dict[str, Tensor]]:
    """CANOE's clipped GRPO loss with a β-weighted k3 KL penalty (the module docstring's equations).

    `logprobs` `(N, T)`: log π_θ of the sampled tokens, the only input with a gradient; `old_logprobs` and
    `ref_logprobs` `(N, T)`: log π_old and log π_ref, constants (π_ref None only when β = 0; π_old an argument,
    D12). `advantages` `(N,)`. `mask` `(N, T)`: non-zero exactly at the trained positions, explicit rather than
    inferred from pad ids (D13); values outside it, even inf or NaN, never reach the loss, its gradient or the
    metrics. `total_sequences`, `total_tokens`: the whole batch's counts (default this call's). The pieces and
    `max_completion_tokens`, `vllm_logprobs`, `importance_cap` are variants.py's. Returns `(loss, metrics)`: the
    0-d loss in float32 (float64 for float64 inputs) and the keys of `METRIC_REDUCTIONS`, detached. `trace`, when a
    dict, receives the `(N, T)` values computed here, detached: ρ, where the clip binds, the KL and ℓ (the step's
    page shows them: training/explain.py).
    """
    _check_inputs(logprobs, old_logprobs, ref_logprobs, advantages, mask, vllm_logprobs, beta, total_sequences,
                  total_tokens, aggregation=aggregation, ratio_level=ratio_level, surrogate_weight=surrogate_weight)
    # Work in at least float32: ratios of bf16 log-probabilities would be too coarse.
    dtype = torch.promote_types(logprobs.dtype, torch.float32)
    logp = logprobs.to(dtype)  # (N, T)
    old = old_logprobs.detach().to(dtype)  # (N, T)
    A = advantages.detach().to(dtype)[:, None]  # (N, 1)
    trained = mask != 0  # (N, T) bool
    weight = trained.to(dtype)  # (N, T)

    # Outside the mask the log-ratio is set to 0 *before* exp: padding log-probabilities can be -inf or garbage,
    # and inf * 0 would turn into NaN in the loss and its gradient even though those positions are masked out.
    ratio = torch.exp(ratio_level(torch.where(trained, logp - old, 0.0), weight))  # (N, T)
    surrogate = torch.minimum(ratio * A, ratio.clamp(1 - clip_eps_low, 1 + clip_eps_high) * A)  # (N, T)
    importance, capped = surrogate_weight(old, vllm_logprobs, weight, importance_cap)  # (N, T) constant, bool
    kl = torch.zeros_like(logp)  # (N, T): without a reference model there is no KL
    if ref_logprobs is not None:
        ref_log_ratio = torch.where(trained, ref_logprobs.detach().to(dtype) - logp, 0.0)  # (N, T)
        kl = torch.exp(ref_log_ratio) - ref_log_ratio - 1  # (N, T), k3 estimator, >= 0
    per_token = torch.where(trained, -(importance * surrogate - beta * kl), 0.0)  # (N, T), the KL not weighted
    loss = aggregation(per_token, weight, len(logp) if total_sequences is None else total_sequences,
                       weight.sum().clamp(min=1) if total_tokens is None else total_tokens, max_completion_tokens)

    with torch.no_grad():
        clipped = trained & (((A > 0) & (ratio > 1 + clip_eps_high)) | ((A < 0) & (ratio < 1 - clip_eps_low)))
        metrics = {"tokens": weight.sum(), "kl_sum": (kl * weight).sum(),
                   "clipped_tokens": clipped.to(dtype).sum(), "ratio_sum": (ratio * weight).sum(),
                   "ratio_min": torch.where(trained, ratio, math.inf).amin(),
                   "ratio_max": torch.where(trained, ratio, -math.inf).amax(),
                   "importance_sum": (importance * weight).sum(), "importance_capped": capped.to(dtype).sum()}
        if trace is not None:
            trace |= {"ratio": ratio.detach(), "clipped": clipped, "kl": kl.detach(), "token_loss": per_token.detach()}
    return loss, metrics


def _check_inputs(logprobs, old_logprobs, ref_logprobs, advantages, mask, vllm_logprobs, beta, total_sequences,
                  total_tokens, **pieces) -> None:
    """grpo_loss's arguments, with an error that names the one that is wrong."""
    if logprobs.dim() != 2:
        raise ValueError(f"logprobs must be (N, T), got shape {tuple(logprobs.shape)}")
    N, T = logprobs.shape
    if N == 0 or T == 0:
        raise ValueError(f"empty batch: logprobs has shape {tuple(logprobs.shape)}")
    for name, tensor in (("old_logprobs", old_logprobs), ("ref_logprobs", ref_logprobs), ("mask", mask),
                         ("vllm_logprobs", vllm_logprobs)):
        if tensor is not None and tensor.shape != (N, T):
            raise ValueError(f"{name} must have the shape of logprobs {(N, T)}, got {tuple(tensor.shape)}")
    if advantages.shape != (N,):
        raise ValueError(f"advantages must be (N,) = {(N,)}, got {tuple(advantages.shape)}")
    if ref_logprobs is None and beta != 0:
        raise ValueError(f"ref_logprobs is required when beta != 0 (beta = {beta})")
    for name, total in (("total_sequences", total_sequences), ("total_tokens", total_tokens)):
        if total is not None and not total > 0:
            raise ValueError(f"{name} must be positive, got {total}")
    for name, piece in pieces.items():
        if not callable(piece):
            raise ValueError(f"{name} must be a function (a value of variants.py's registry; the config names it), "
                             f"got {piece!r}")


def merge_metrics(parts: Iterable[dict[str, Tensor]]) -> dict[str, Tensor]:
    """The metrics of several `grpo_loss` calls (micro-batches) combined by `METRIC_REDUCTIONS`, as new 0-d tensors."""
    parts = list(parts)
    combine = {"sum": torch.sum, "min": torch.amin, "max": torch.amax}
    return {key: combine[op](torch.stack([part[key].detach() for part in parts]))
            for key, op in METRIC_REDUCTIONS.items()}


def summarize_metrics(totals: dict[str, Tensor]) -> dict[str, float]:
    """The logged values of merged metrics (`METRIC_REDUCTIONS` says what each sums): the means over the step's
    trained tokens, and ρ's extremes; all 0.0, rather than NaN or ±inf, when no token was trained."""
    tokens = float(totals["tokens"])
    if tokens == 0:
        return dict.fromkeys(("loss/kl", "loss/clip_frac", "loss/ratio_mean", "loss/ratio_min", "loss/ratio_max",
                              "loss/importance_mean", "loss/importance_capped_frac"), 0.0)
    return {
        "loss/kl": float(totals["kl_sum"]) / tokens,
        "loss/clip_frac": float(totals["clipped_tokens"]) / tokens,
        "loss/ratio_mean": float(totals["ratio_sum"]) / tokens,
        "loss/ratio_min": float(totals["ratio_min"]),
        "loss/ratio_max": float(totals["ratio_max"]),
        "loss/importance_mean": float(totals["importance_sum"]) / tokens,
        "loss/importance_capped_frac": float(totals["importance_capped"]) / tokens,
    }


def plain_completion_logprobs(model, prompts: list[list[int]], completions: list[list[int]],
                              temperature: float = 1.0) -> Tensor:
    """log π of every completion token, the plain way, to read before the packed path (`completion_logprobs`): each
    prompt + completion through the model alone, π = softmax(logits / `temperature`) in float64 (the reference: float32
    `log_softmax` on an AVX2-only CPU is 1e-4 off), gathered at the sampled tokens. Returns `(n, C)` float32, 0 on
    padding, as `completion_logprobs` does; the tests hold the two equal in values and gradients. Training uses the
    packed path: each prompt runs once for its G completions, and the `(T, V)` logits are never upcast whole."""
    if not all(prompts):
        raise ValueError("empty prompt: a completion needs a position to be predicted from")
    device = next(model.parameters()).device
    C = max(1, max(map(len, completions), default=1))
    rows = []
    for prompt, completion in zip(prompts, completions, strict=True):
        ids = torch.tensor([[*prompt, *completion]], device=device)  # (1, P + c)
        logits = model(input_ids=ids, use_cache=False).logits[0, len(prompt) - 1 : -1]  # (c, V): t predicts t + 1
        logp = torch.log_softmax(logits.double() / temperature, dim=-1)  # (c, V)
        picked = logp.gather(-1, ids[0, len(prompt):, None])[:, 0].float()  # (c,)
        rows.append(torch.nn.functional.pad(picked, (0, C - len(completion))))  # (C,)
    return torch.stack(rows)  # (n, C)


class _TokenLogprobs(torch.autograd.Function):
    """log softmax(logits / τ)[token] chunk by chunk, with a hand-written backward that also works chunk by chunk.

    Autograd through `logsumexp(chunk.float())` would keep every chunk's float32 copy alive until the backward
    pass, i.e. the full float32 logits after all. Saving only the original logits and the `(N, T)` log-normaliser
    and recomputing each chunk's softmax in backward keeps the float32 working set at one chunk.
    """

    @staticmethod
    def forward(ctx, logits: Tensor, tokens: Tensor, chunk_size: int,  # type: ignore[override]
                temperature: float) -> Tensor:
        N, T, V = logits.shape
        out = torch.empty(N, T, dtype=torch.float32, device=logits.device)  # (N, T)
        log_normalizer = torch.empty(N, T, dtype=torch.float32, device=logits.device)  # (N, T)
        for n, start, stop in _chunks(N, T, chunk_size):
            block = logits[n, start:stop].float() / temperature  # (C, V), the only float32 copy alive (τ = 1: exact)
            lse = torch.logsumexp(block, dim=-1)  # (C,)
            picked = block.gather(-1, tokens[n, start:stop, None]).squeeze(-1)  # (C,)
            out[n, start:stop] = picked - lse
            log_normalizer[n, start:stop] = lse
        ctx.save_for_backward(logits, tokens, log_normalizer)
        ctx.chunk_size, ctx.temperature = chunk_size, temperature
        return out

    @staticmethod
    def backward(ctx, grad_out: Tensor) -> tuple[Tensor, None, None, None]:  # type: ignore[override]
        logits, tokens, log_normalizer = ctx.saved_tensors
        N, T, V = logits.shape
        grad_out = grad_out.float()  # (N, T)
        grad_logits = torch.empty(N, T, V, dtype=logits.dtype, device=logits.device)  # (N, T, V)
        for n, start, stop in _chunks(N, T, ctx.chunk_size):
            # d log p(token) / d logit_v = (1[v == token] - softmax(logits / τ)_v) / τ
            probs = torch.exp(logits[n, start:stop].float() / ctx.temperature - log_normalizer[n, start:stop, None])
            upstream = grad_out[n, start:stop, None] / ctx.temperature  # (C, 1)
            block_grad = (-upstream * probs).scatter_add(-1, tokens[n, start:stop, None], upstream)  # (C, V)
            grad_logits[n, start:stop] = block_grad.to(logits.dtype)
        return grad_logits, None, None, None


def _chunks(N: int, T: int, chunk_size: int) -> Iterable[tuple[int, int, int]]:
    """(sequence, start, stop) windows of at most `chunk_size` positions, never crossing a sequence, so that
    `logits[n, start:stop]` is a view even when `logits` is a non-contiguous slice such as `out[:, :-1]`."""
    for n in range(N):
        for start in range(0, T, chunk_size):
            yield n, start, min(start + chunk_size, T)


def token_logprobs(logits: Tensor, tokens: Tensor, chunk_size: int = 512, temperature: float = 1.0) -> Tensor:
    """`log_softmax(logits / temperature)[n, t, tokens[n, t]]` as `(N, T)` float32, differentiable in `logits`
    `(N, T, V)`, which must already be aligned with `tokens` `(N, T)`. At most `chunk_size` positions × V are upcast
    to float32 at a time, in forward and backward: the float32 `(N, T, V)` copy of the log-softmax is never built."""
    if logits.dim() != 3:
        raise ValueError(f"logits must be (N, T, V), got shape {tuple(logits.shape)}")
    if tokens.shape != logits.shape[:2]:
        raise ValueError(f"tokens must be (N, T) = {tuple(logits.shape[:2])}, got {tuple(tokens.shape)}")
    if tokens.dtype != torch.long:
        raise ValueError(f"tokens must be int64 (torch.long) ids, got {tokens.dtype}")
    if not logits.is_floating_point():
        raise ValueError(f"logits must be floating point, got {logits.dtype}")
    if chunk_size < 1:
        raise ValueError(f"chunk_size must be positive, got {chunk_size}")
    if not temperature > 0:
        raise ValueError(f"temperature must be positive, got {temperature}")
    return _TokenLogprobs.apply(logits, tokens, chunk_size, float(temperature))


def completion_logprobs(model, packed, temperature: float = 1.0) -> Tensor:
    """log π of every completion token of a packed micro-batch (training/packing.py): `(n, C)`, 0 on padding, where
    π = softmax(logits / `temperature`), the distribution the tokens were sampled from. Only the T predicting
    positions go through the output head (`logits_to_keep` as indices)."""
    logits = model(input_ids=packed.input_ids, position_ids=packed.position_ids,
                   attention_mask=packed.attention_mask(model), logits_to_keep=packed.predictors,
                   use_cache=False).logits  # (1, T, V)
    flat = token_logprobs(logits, packed.targets[None], temperature=temperature)[0]  # (T,)
    mask = packed.completion_mask.bool()  # (n, C)
    out = torch.zeros(mask.shape, dtype=flat.dtype, device=flat.device)  # (n, C)
    return out.masked_scatter(mask, flat)  # row-major order of the mask = completion after completion
