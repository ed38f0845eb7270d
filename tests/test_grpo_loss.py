"""Tests for grpo_loss.py: small hand-computed cases with the arithmetic in the comments, default tolerances.

Shape legend as in grpo_loss.py: N sequences, T positions, V vocabulary.
"""

import doctest
import math
from types import SimpleNamespace

import pytest
import torch
from torch.testing import assert_close
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

import grpo_loss
import variants
from config import Config
from grpo_loss import group_advantages, grpo_loss as loss_fn, merge_metrics, summarize_metrics, token_logprobs
from variants import (ADVANTAGE_RULES, AGGREGATIONS, RATIO_LEVELS, SURROGATE_WEIGHTS, decoupled_advantages,
                      kept_sequences)

LN2 = math.log(2.0)


def test_docstring_examples():
    for module in (grpo_loss, variants):
        result = doctest.testmod(module)
        assert result.attempted > 0 and result.failed == 0, module.__name__


# ---------------------------------------------------------------------------------------------------------------
# group_advantages


def test_group_advantages_hand_values_both_std_flavours():
    rewards = torch.tensor([0.0, 2.0, 2.0, 4.0, 3.0, 3.0, 3.0, 3.0])  # B = 2 prompts, G = 4
    before = rewards.clone()
    # Group 0: mean 2, deviations (-2, 0, 0, 2), sum of squares 8.
    #   unbiased std = sqrt(8 / 3), biased std = sqrt(8 / 4) = sqrt(2).
    # Group 1: all equal -> exactly 0.
    a = 2 / (math.sqrt(8 / 3) + 1e-4)
    assert_close(group_advantages(rewards, 4), torch.tensor([-a, 0.0, 0.0, a, 0.0, 0.0, 0.0, 0.0]))
    b = 2 / (math.sqrt(2) + 1e-4)
    assert_close(group_advantages(rewards, 4, std="biased"), torch.tensor([-b, 0.0, 0.0, b, 0.0, 0.0, 0.0, 0.0]))
    assert torch.equal(rewards, before)  # input untouched


def test_group_advantages_g3_and_eps():
    # G = 3, rewards (1, 2, 4): mean 7/3, deviations (-4/3, -1/3, 5/3), sum of squares (16 + 1 + 25) / 9 = 42/9.
    #   unbiased std = sqrt(42/9 / 2) = sqrt(7/3); with eps = 0.5: A = dev / (sqrt(7/3) + 0.5).
    s = math.sqrt(7 / 3) + 0.5
    expected = torch.tensor([-4 / 3 / s, -1 / 3 / s, 5 / 3 / s])
    assert_close(group_advantages(torch.tensor([1.0, 2.0, 4.0]), 3, eps=0.5), expected)


@pytest.mark.parametrize("value, group_size", [(4.0, 4), (0.3746311068534851, 3), (0.4523630738258362, 7)])
def test_group_advantages_equal_rewards_exactly_zero(value, group_size):
    rewards = torch.full((2 * group_size,), value)  # (N,), two groups of equal rewards
    # For the last two values float32 rounding makes mean(r) != r (the residue ~3e-8, divided by eps = 1e-4,
    # would give advantages ~3e-4), so this checks the explicit rule, not luck.
    if value != 4.0:
        assert rewards.reshape(-1, group_size).mean(dim=1)[0] != rewards[0]
    assert torch.equal(group_advantages(rewards, group_size), torch.zeros(2 * group_size))
    assert torch.equal(group_advantages(rewards, group_size, std="biased"), torch.zeros(2 * group_size))


def test_group_advantages_integer_rewards_become_float():
    out = group_advantages(torch.tensor([0, 2]), 2)
    # mean 1, deviations (-1, 1), unbiased std sqrt(2 / 1) = sqrt(2).
    assert_close(out, torch.tensor([-1 / (math.sqrt(2) + 1e-4), 1 / (math.sqrt(2) + 1e-4)]))


@pytest.mark.parametrize(
    "rewards, group_size, kwargs, message",
    [
        (torch.zeros(4), 1, {}, "group_size"),
        (torch.zeros(4), 0, {}, "group_size"),
        (torch.zeros(5), 2, {}, "multiple"),
        (torch.zeros(6), 3, {"std": "population"}, "std"),
        (torch.zeros(2, 3), 3, {}, "1-D"),
    ],
)
def test_group_advantages_errors(rewards, group_size, kwargs, message):
    with pytest.raises(ValueError, match=message):
        group_advantages(rewards, group_size, **kwargs)


# ---------------------------------------------------------------------------------------------------------------
# grpo_loss


def _grad(loss: torch.Tensor, leaf: torch.Tensor) -> torch.Tensor:
    (g,) = torch.autograd.grad(loss, leaf)
    return g


def test_on_policy_value_and_gradient_seq_mean_token_mean():
    # N = 2, T = 3. Sequence 0 trains 3 tokens, sequence 1 trains 2 (its last position is padding).
    logp = torch.tensor([[-1.0, -2.0, -0.5], [-0.3, -1.2, -7.0]], requires_grad=True)
    mask = torch.tensor([[1, 1, 1], [1, 1, 0]])
    A = torch.tensor([1.0, -0.5])
    loss, metrics = loss_fn(logp, logp.detach(), None, A, mask, beta=0.0)
    # On-policy ρ = 1, so every trained token's surrogate is A_i, its loss -A_i.
    # Per-sequence mean: -1 and 0.5; mean over N = 2: (-1 + 0.5) / 2 = -0.25.
    assert_close(loss, torch.tensor(-0.25))
    # d loss / d logp_{i,t} = -A_i · ρ / (|o_i| · N):  -1 / (3·2) = -1/6;  0.5 / (2·2) = 0.125;  padding 0.
    assert_close(_grad(loss, logp), torch.tensor([[-1 / 6, -1 / 6, -1 / 6], [0.125, 0.125, 0.0]]))
    assert_close(summarize_metrics(metrics)["loss/ratio_mean"], 1.0)
    assert_close(summarize_metrics(metrics)["loss/clip_frac"], 0.0)


def test_on_policy_value_and_gradient_token_mean():
    logp = torch.tensor([[-1.0, -2.0, -0.5], [-0.3, -1.2, -7.0]], requires_grad=True)
    mask = torch.tensor([[1, 1, 1], [1, 1, 0]])
    A = torch.tensor([1.0, -0.5])
    loss, _ = loss_fn(logp, logp.detach(), None, A, mask, beta=0.0, aggregation=AGGREGATIONS["token-mean"])
    # 5 trained tokens: -(3·1 + 2·(-0.5)) / 5 = -2/5 = -0.4.
    assert_close(loss, torch.tensor(-0.4))
    # d loss / d logp_{i,t} = -A_i / 5:  -0.2 and 0.1.
    assert_close(_grad(loss, logp), torch.tensor([[-0.2, -0.2, -0.2], [0.1, 0.1, 0.0]]))


def test_eos_token_is_trained():
    # The completion is 3 tokens, the third is EOS; positions 3-4 are padding (whose id may equal EOS).
    logp = torch.full((1, 5), -0.7, requires_grad=True)
    mask = torch.tensor([[1, 1, 1, 0, 0]])
    loss, _ = loss_fn(logp, logp.detach(), None, torch.tensor([2.0]), mask, beta=0.0)
    # d loss / d logp = -A / (|o| · N) = -2 / 3 on each trained position, EOS (index 2) included.
    assert_close(_grad(loss, logp), torch.tensor([[-2 / 3, -2 / 3, -2 / 3, 0.0, 0.0]]))


def test_clipping_both_sides_both_signs():
    # N = 4 single-token sequences, ε = 0.2 so ρ is clipped to [0.8, 1.2]; logp_old = 0 so ρ = exp(logp).
    ratios = torch.tensor([[1.5], [0.5], [1.5], [0.5]])
    logp = ratios.log().requires_grad_()
    A = torch.tensor([1.0, 1.0, -1.0, -1.0])
    loss, metrics = loss_fn(logp, torch.zeros(4, 1), None, A, torch.ones(4, 1), beta=0.0)
    # surrogate = min(ρA, clip(ρ)A):
    #   A=+1, ρ=1.5: min(1.5, 1.2) = 1.2     clipped   -> no gradient
    #   A=+1, ρ=0.5: min(0.5, 0.8) = 0.5     unclipped -> d/d logp = ρA = 0.5
    #   A=-1, ρ=1.5: min(-1.5, -1.2) = -1.5  unclipped -> ρA = -1.5
    #   A=-1, ρ=0.5: min(-0.5, -0.8) = -0.8  clipped   -> no gradient
    # loss = -(1.2 + 0.5 - 1.5 - 0.8) / 4 = 0.6 / 4 = 0.15; gradients of the loss are -ρA / 4.
    assert_close(loss, torch.tensor(0.15))
    assert_close(_grad(loss, logp), torch.tensor([[0.0], [-0.125], [0.375], [0.0]]))
    # Clipped tokens: 2 of 4. Ratios: mean (1.5 + 0.5 + 1.5 + 0.5) / 4 = 1, min 0.5, max 1.5.
    summary = summarize_metrics(metrics)
    assert_close(summary["loss/clip_frac"], 0.5)
    assert_close(summary["loss/ratio_mean"], 1.0)
    assert_close(summary["loss/ratio_min"], 0.5)
    assert_close(summary["loss/ratio_max"], 1.5)


def test_asymmetric_clipping():
    ratios = torch.tensor([[1.25], [1.35], [0.95], [0.85]])
    A = torch.tensor([1.0, 1.0, -1.0, -1.0])
    logp = ratios.log().requires_grad_()
    # ε_low = 0.1, ε_high = 0.3: clip range [0.9, 1.3].
    #   A=+1, ρ=1.25 inside  -> surrogate 1.25, gradient of the loss -1.25 / 4 = -0.3125
    #   A=+1, ρ=1.35 > 1.3   -> surrogate 1.3, clipped, 0
    #   A=-1, ρ=0.95 inside  -> surrogate -0.95, gradient 0.95 / 4 = 0.2375
    #   A=-1, ρ=0.85 < 0.9   -> min(-0.85, -0.9) = -0.9, clipped, 0
    # loss = -(1.25 + 1.3 - 0.95 - 0.9) / 4 = -0.7 / 4 = -0.175
    loss, metrics = loss_fn(
        logp, torch.zeros(4, 1), None, A, torch.ones(4, 1), beta=0.0, clip_eps_low=0.1, clip_eps_high=0.3
    )
    assert_close(loss, torch.tensor(-0.175))
    assert_close(_grad(loss, logp), torch.tensor([[-0.3125], [0.0], [0.2375], [0.0]]))
    assert_close(summarize_metrics(metrics)["loss/clip_frac"], 0.5)
    # The symmetric default [0.8, 1.2] clips the first token instead of the last:
    #   1.25 -> 1.2 (clipped), 1.35 -> 1.2 (clipped), 0.95 and 0.85 unclipped (min(-0.85, -0.8) = -0.85).
    #   loss = -(1.2 + 1.2 - 0.95 - 0.85) / 4 = -0.6 / 4 = -0.15
    loss, _ = loss_fn(logp, torch.zeros(4, 1), None, A, torch.ones(4, 1), beta=0.0)
    assert_close(loss, torch.tensor(-0.15))
    assert_close(_grad(loss, logp), torch.tensor([[0.0], [0.0], [0.2375], [0.2125]]))


def test_kl_zero_when_policy_equals_reference():
    logp = torch.tensor([[-1.0, -0.2], [-3.0, -0.1]], requires_grad=True)
    mask = torch.tensor([[1, 1], [1, 0]])
    A = torch.tensor([0.5, -1.0])
    with_kl, metrics = loss_fn(logp, logp.detach(), logp.detach(), A, mask, beta=0.04)
    without_kl, _ = loss_fn(logp, logp.detach(), None, A, mask, beta=0.0)
    # ref = logp: k3 = exp(0) - 0 - 1 = 0, so β·KL adds nothing, to the value or the gradient.
    assert_close(with_kl, without_kl)
    assert_close(summarize_metrics(metrics)["loss/kl"], 0.0)
    assert_close(_grad(with_kl, logp), _grad(without_kl, logp))


def test_kl_k3_hand_value_and_gradient():
    # One sequence of 2 tokens, on-policy with A = 0, so the loss is β · mean KL alone.
    logp = torch.tensor([[-1.0, -2.0]], requires_grad=True)
    ref = logp.detach() + torch.tensor([[LN2, -LN2]])  # ref - logp = (ln 2, -ln 2)
    loss, metrics = loss_fn(logp, logp.detach(), ref, torch.tensor([0.0]), torch.ones(1, 2), beta=0.04)
    # k3(d) = e^d - d - 1:  k3(ln 2) = 2 - ln 2 - 1 = 1 - ln 2;  k3(-ln 2) = 1/2 + ln 2 - 1 = ln 2 - 1/2.
    # Mean over the 2 tokens: (1 - ln 2 + ln 2 - 1/2) / 2 = 0.25;  loss = 0.04 · 0.25 = 0.01.
    assert_close(loss, torch.tensor(0.01))
    assert_close(metrics["kl_sum"], torch.tensor(0.5))
    assert_close(summarize_metrics(metrics)["loss/kl"], 0.25)
    # d k3 / d logp = 1 - e^d:  1 - 2 = -1  and  1 - 1/2 = 0.5;  times β / |o| = 0.04 / 2 = 0.02.
    assert_close(_grad(loss, logp), torch.tensor([[-0.02, 0.01]]))


def test_kl_metric_reported_with_beta_zero():
    logp = torch.tensor([[-1.0]])
    _, metrics = loss_fn(logp, logp, logp + LN2, torch.tensor([1.0]), torch.ones(1, 1), beta=0.0)
    assert_close(summarize_metrics(metrics)["loss/kl"], 1 - LN2)  # k3(ln 2), as above


def _random_batch(seed: int, N: int = 5, T: int = 6):
    generator = torch.Generator().manual_seed(seed)
    logp = -torch.rand(N, T, generator=generator) * 3  # (N, T)
    old = logp + 0.3 * torch.randn(N, T, generator=generator)  # (N, T), ratios around 1, some clipped
    ref = logp + 0.3 * torch.randn(N, T, generator=generator)  # (N, T)
    A = torch.randn(N, generator=generator)  # (N,)
    lengths = torch.tensor([6, 1, 4, 2, 5])[:N]  # uneven completion lengths
    mask = (torch.arange(T)[None, :] < lengths[:, None]).long()  # (N, T)
    return logp, old, ref, A, mask


@pytest.mark.parametrize("aggregation", ["seq-mean-token-mean", "token-mean"])
def test_masked_positions_contribute_nothing(aggregation):
    logp, old, ref, A, mask = _random_batch(0)
    logp = logp.requires_grad_()
    loss, metrics = loss_fn(logp, old, ref, A, mask, aggregation=AGGREGATIONS[aggregation])
    grad = _grad(loss, logp)

    outside = mask == 0
    wild_logp = torch.where(outside, torch.full_like(logp, 80.0), logp.detach()).requires_grad_()
    wild_old = torch.where(outside, torch.full_like(old, -math.inf), old)
    wild_ref = torch.where(outside, torch.full_like(ref, math.nan), ref)
    wild_loss, wild_metrics = loss_fn(wild_logp, wild_old, wild_ref, A, mask, aggregation=AGGREGATIONS[aggregation])
    wild_grad = _grad(wild_loss, wild_logp)

    assert_close(wild_loss, loss)
    assert_close(wild_grad, grad)
    assert torch.all(wild_grad[outside] == 0)
    assert_close(summarize_metrics(wild_metrics), summarize_metrics(metrics))


def test_arguments_are_not_modified():
    logp, old, ref, A, mask = _random_batch(1)
    copies = [t.clone() for t in (logp, old, ref, A, mask)]
    loss_fn(logp.requires_grad_(), old, ref, A, mask)[0].backward()
    for original, copy in zip((logp, old, ref, A, mask), copies):
        assert torch.equal(original.detach(), copy)


@pytest.mark.parametrize("aggregation", ["seq-mean-token-mean", "token-mean", "seq-mean-token-sum-norm"])
def test_micro_batches_sum_to_the_full_batch(aggregation):
    logp, old, ref, A, mask = _random_batch(2)
    full_logp = logp.clone().requires_grad_()
    full_loss, full_metrics = loss_fn(full_logp, old, ref, A, mask, aggregation=AGGREGATIONS[aggregation],
                                      max_completion_tokens=8)
    full_loss.backward()

    # Uneven micro-batches (2, 1, 2 sequences) of uneven lengths; the denominators are the whole batch's.
    totals = {"total_sequences": mask.shape[0], "total_tokens": int(mask.sum()),  # 5 sequences, 18 tokens
              "max_completion_tokens": 8}
    micro_logp = logp.clone().requires_grad_()
    micro_losses, micro_metrics = [], []
    for rows in (slice(0, 2), slice(2, 3), slice(3, 5)):
        loss, metrics = loss_fn(
            micro_logp[rows], old[rows], ref[rows], A[rows], mask[rows], aggregation=AGGREGATIONS[aggregation], **totals
        )
        loss.backward()  # gradients accumulate in micro_logp.grad, as with gradient accumulation
        micro_losses.append(loss.detach())
        micro_metrics.append(metrics)

    assert_close(sum(micro_losses), full_loss.detach())
    assert_close(micro_logp.grad, full_logp.grad)
    merged = merge_metrics(micro_metrics)
    for key in full_metrics:
        assert_close(merged[key], full_metrics[key])

    # Without the totals each micro-batch uses its own denominator and the sum is not the batch loss: the
    # contract above is what makes the split invisible.
    local_sum = sum(
        loss_fn(logp[rows], old[rows], ref[rows], A[rows], mask[rows], aggregation=AGGREGATIONS[aggregation],
                max_completion_tokens=8)[0]
        for rows in (slice(0, 2), slice(2, 3), slice(3, 5))
    )
    assert not torch.allclose(local_sum, full_loss.detach())


@pytest.mark.parametrize("aggregation", ["seq-mean-token-mean", "token-mean"])
def test_empty_sequences_do_not_produce_nan(aggregation):
    logp = torch.tensor([[-1.0, -2.0], [-0.5, -0.5]], requires_grad=True)
    mask = torch.tensor([[1, 1], [0, 0]])  # the second sequence has no trained token
    loss, _ = loss_fn(logp, logp.detach(), logp.detach(), torch.tensor([1.0, 3.0]), mask,
                      aggregation=AGGREGATIONS[aggregation])
    # seq-mean-token-mean: (-1 + 0) / 2 sequences = -0.5;  token-mean: -(1 + 1) / 2 tokens = -1.
    assert_close(loss, torch.tensor(-0.5 if aggregation == "seq-mean-token-mean" else -1.0))
    assert_close(_grad(loss, logp)[1], torch.zeros(2))

    # A micro-batch with no trained token at all: loss 0, metrics summarize to zeros (no NaN, no inf).
    loss, metrics = loss_fn(logp, logp.detach(), None, torch.tensor([1.0, 3.0]), torch.zeros(2, 2), beta=0.0)
    assert_close(loss, torch.tensor(0.0))
    assert_close(_grad(loss, logp), torch.zeros(2, 2))
    assert summarize_metrics(metrics) == dict.fromkeys(summarize_metrics(metrics), 0.0)


def test_grpo_loss_errors():
    logp, mask, A = torch.zeros(2, 3), torch.ones(2, 3), torch.zeros(2)
    with pytest.raises(ValueError, match="ref_logprobs"):
        loss_fn(logp, logp, None, A, mask, beta=0.04)
    with pytest.raises(ValueError, match="aggregation"):
        loss_fn(logp, logp, logp, A, mask, aggregation="sum")
    with pytest.raises(ValueError, match="advantages"):
        loss_fn(logp, logp, logp, torch.zeros(3), mask)
    with pytest.raises(ValueError, match="mask"):
        loss_fn(logp, logp, logp, A, torch.ones(2, 4))
    with pytest.raises(ValueError, match="total_tokens"):
        loss_fn(logp, logp, logp, A, mask, total_tokens=0)


# ---------------------------------------------------------------------------------------------------------------
# token_logprobs


def _reference_logprobs(logits: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
    return torch.log_softmax(logits.float(), dim=-1).gather(-1, tokens[..., None]).squeeze(-1)  # (N, T)


def test_token_logprobs_small_hand_value():
    # Logits (0, ln 3) over V = 2: softmax (1/4, 3/4), so log p(token 1) = ln(3/4), log p(token 0) = ln(1/4).
    logits = torch.tensor([[[0.0, math.log(3.0)], [0.0, math.log(3.0)]]])  # (1, 2, 2)
    out = token_logprobs(logits, torch.tensor([[1, 0]]))
    assert_close(out, torch.tensor([[math.log(0.75), math.log(0.25)]]))


@pytest.mark.parametrize("chunk_size", [1, 3, 512])
def test_token_logprobs_matches_log_softmax_fp32(chunk_size):
    generator = torch.Generator().manual_seed(3)
    logits = (3 * torch.randn(2, 5, 17, generator=generator)).requires_grad_()  # (N, T, V)
    tokens = torch.randint(0, 17, (2, 5), generator=generator)  # (N, T)
    upstream = torch.randn(2, 5, generator=generator)  # (N, T), an arbitrary d loss / d logprob

    out = token_logprobs(logits, tokens, chunk_size=chunk_size)
    assert out.dtype == torch.float32 and out.shape == (2, 5)
    reference = _reference_logprobs(logits, tokens)
    assert_close(out, reference)
    assert_close(_grad((out * upstream).sum(), logits), _grad((reference * upstream).sum(), logits))


def test_token_logprobs_at_a_sampling_temperature():
    # Logits (0, ln 3) at τ = 1/2 become (0, 2 ln 3) = (0, ln 9): softmax (1/10, 9/10).
    logits = torch.tensor([[[0.0, math.log(3.0)], [0.0, math.log(3.0)]]])  # (1, 2, 2)
    out = token_logprobs(logits, torch.tensor([[1, 0]]), temperature=0.5)
    assert_close(out, torch.tensor([[math.log(0.9), math.log(0.1)]]))
    generator = torch.Generator().manual_seed(6)
    logits = (3 * torch.randn(2, 5, 17, generator=generator)).requires_grad_()  # (N, T, V)
    tokens = torch.randint(0, 17, (2, 5), generator=generator)  # (N, T)
    upstream = torch.randn(2, 5, generator=generator)  # (N, T)
    out = token_logprobs(logits, tokens, chunk_size=3, temperature=0.7)
    reference = _reference_logprobs(logits / 0.7, tokens)  # d/dlogits carries the 1/τ
    assert_close(out, reference)
    assert_close(_grad((out * upstream).sum(), logits), _grad((reference * upstream).sum(), logits))
    assert not torch.allclose(out, _reference_logprobs(logits, tokens))  # the temperature does act


def test_token_logprobs_at_temperature_one_is_bit_identical_to_the_unscaled_rule():
    """τ = 1 changes no bit: the forward is `gather - logsumexp` of the float32 logits, the backward
    `1[v == token] - softmax` times the upstream gradient, exactly as without a temperature."""
    generator = torch.Generator().manual_seed(7)
    logits = (3 * torch.randn(2, 5, 17, generator=generator)).to(torch.bfloat16).requires_grad_()  # (N, T, V)
    tokens = torch.randint(0, 17, (2, 5), generator=generator)  # (N, T)
    upstream = torch.randn(2, 5, generator=generator)  # (N, T)
    out = token_logprobs(logits, tokens, temperature=1.0)  # one chunk per sequence
    (out * upstream).sum().backward()
    for n in range(2):
        block = logits[n].detach().float()  # (T, V)
        lse = torch.logsumexp(block, dim=-1)  # (T,)
        assert torch.equal(out[n], block.gather(-1, tokens[n, :, None]).squeeze(-1) - lse)
        up = upstream[n, :, None]  # (T, 1)
        grad = (-up * torch.exp(block - lse[:, None])).scatter_add(-1, tokens[n, :, None], up)  # (T, V)
        assert torch.equal(logits.grad[n], grad.to(torch.bfloat16))


def test_token_logprobs_bf16():
    generator = torch.Generator().manual_seed(4)
    logits = (3 * torch.randn(2, 5, 17, generator=generator)).to(torch.bfloat16).requires_grad_()  # (N, T, V)
    tokens = torch.randint(0, 17, (2, 5), generator=generator)  # (N, T)
    upstream = torch.randn(2, 5, generator=generator)  # (N, T)

    out = token_logprobs(logits, tokens, chunk_size=3)
    assert out.dtype == torch.float32
    # Same arithmetic as the float32-upcast reference, so float32 tolerances hold.
    reference = _reference_logprobs(logits, tokens)
    assert_close(out, reference)
    # Against log_softmax computed in bf16 itself, the natural tolerance is bf16's: 8 significant bits, a relative
    # error of 2^-8 ≈ 0.4% per rounding; torch's bf16 defaults are rtol 1.6e-2, atol 1e-5.
    bf16_reference = torch.log_softmax(logits, dim=-1).gather(-1, tokens[..., None]).squeeze(-1)
    assert_close(out.to(torch.bfloat16), bf16_reference)
    # Gradients come back in bf16, like the logits; compared at bf16 defaults.
    grad = _grad((out * upstream).sum(), logits)
    assert grad.dtype == torch.bfloat16
    assert_close(grad, _grad((reference * upstream).sum(), logits))


def test_token_logprobs_non_contiguous_logits():
    # A causal LM's logits are sliced as out[:, :-1], a non-contiguous view; the chunks are views of it.
    generator = torch.Generator().manual_seed(5)
    full = torch.randn(2, 6, 11, generator=generator, requires_grad=True)  # (N, T + 1, V)
    logits = full[:, :-1]  # (N, T, V)
    assert not logits.is_contiguous()
    tokens = torch.randint(0, 11, (2, 5), generator=generator)
    out = token_logprobs(logits, tokens, chunk_size=2)
    reference = _reference_logprobs(logits, tokens)
    assert_close(out, reference)
    assert_close(_grad(out.sum(), full), _grad(reference.sum(), full))


class _LargestFloat32(TorchDispatchMode):
    """Records the largest float32 tensor any aten op produces while active (views included, so it can only
    over-count), and how many ops ran."""

    def __init__(self):
        super().__init__()
        self.largest = 0
        self.ops = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        self.ops += 1
        for value in tree_flatten(out)[0]:
            if isinstance(value, torch.Tensor) and value.dtype == torch.float32:
                self.largest = max(self.largest, value.numel())
        return out


def test_token_logprobs_never_builds_a_full_float32_copy():
    N, T, V, chunk = 2, 8, 64, 4
    logits = torch.randn(N, T, V).to(torch.bfloat16).requires_grad_()  # (N, T, V)
    tokens = torch.randint(0, V, (N, T))

    # The recorder is not vacuous: the naive upcast is caught at full size.
    with _LargestFloat32() as naive:
        _reference_logprobs(logits.detach(), tokens)
    assert naive.largest == N * T * V

    with _LargestFloat32() as forward:
        out = token_logprobs(logits, tokens, chunk_size=chunk)
    with _LargestFloat32() as backward:
        out.sum().backward()
    assert backward.ops > 0  # the backward pass ran under the recorder
    # At most one chunk of chunk × V = 256 float32 values at a time, against N·T·V = 1024 for a full copy.
    assert forward.largest <= chunk * V
    assert backward.largest <= chunk * V
    assert logits.grad.dtype == torch.bfloat16


def test_token_logprobs_errors():
    with pytest.raises(ValueError, match="tokens"):
        token_logprobs(torch.zeros(2, 3, 5), torch.zeros(2, 4, dtype=torch.long))
    with pytest.raises(ValueError, match="int64"):
        token_logprobs(torch.zeros(2, 3, 5), torch.zeros(2, 3, dtype=torch.int32))
    with pytest.raises(ValueError, match="chunk_size"):
        token_logprobs(torch.zeros(2, 3, 5), torch.zeros(2, 3, dtype=torch.long), chunk_size=0)
    with pytest.raises(ValueError, match="temperature"):
        token_logprobs(torch.zeros(2, 3, 5), torch.zeros(2, 3, dtype=torch.long), temperature=0.0)


# ---------------------------------------------------------------------------------------------------------------
# The options beyond CANOE's defaults (Dr. GRPO, DAPO, GSPO, truncated importance sampling)


def test_group_advantages_without_std_dr_grpo():
    rewards = torch.tensor([0.0, 2.0, 2.0, 4.0, 3.0, 3.0, 3.0, 3.0])  # B = 2, G = 4
    # Group 0: mean 2 -> A = r - 2 = (-2, 0, 0, 2), no division. Group 1: all equal -> 0.
    assert_close(group_advantages(rewards, 4, std="none"), torch.tensor([-2.0, 0.0, 0.0, 2.0, 0.0, 0.0, 0.0, 0.0]))
    # G = 3, rewards (1, 2, 4): mean 7/3 -> (-4/3, -1/3, 5/3)
    assert_close(group_advantages(torch.tensor([1.0, 2.0, 4.0]), 3, std="none"),
                 torch.tensor([-4 / 3, -1 / 3, 5 / 3]))


def finished(*truncated: bool) -> list:
    """Completions as kept_sequences reads them: "length" when cut off by the token limit."""
    return [SimpleNamespace(finish_reason="length" if cut else "stop") for cut in truncated]


def test_zero_variance_groups_and_kept_sequences():
    rewards = torch.tensor([1.0, 1.0, 0.0, 2.0, 3.0, 3.0])  # B = 3, G = 2: groups 0 and 2 have equal rewards
    done = finished(False, True, True, False, False, False)
    flat = grpo_loss.zero_variance_groups(rewards, 2)
    assert torch.equal(flat, torch.tensor([True, False, True]))
    advantages = grpo_loss.group_advantages(rewards, 2)  # (6,): 0 in the flat groups
    assert torch.equal(kept_sequences(advantages, done, 2), torch.ones(6, dtype=torch.bool))
    # DAPO overlong filtering: the truncated completions 1 and 2 leave the loss
    assert torch.equal(kept_sequences(advantages, done, 2, mask_truncated=True),
                       torch.tensor([True, False, False, True, True, True]))
    # zero-variance groups 0 and 2 leave the loss, all of their members
    assert torch.equal(kept_sequences(advantages, done, 2, skip_zero_variance_groups=True),
                       torch.tensor([False, False, True, True, False, False]))
    # both: only sequence 3 is left
    assert torch.equal(kept_sequences(advantages, done, 2, mask_truncated=True, skip_zero_variance_groups=True),
                       torch.tensor([False, False, False, True, False, False]))
    with pytest.raises(ValueError, match="advantages must be"):
        kept_sequences(advantages, done[:4], 2)
    # per reward: scores (N, R) give (B, R), as signal/<name> counts the groups in which each reward varies
    scores = torch.stack([rewards, torch.tensor([0.0, 1.0, 2.0, 2.0, 5.0, 4.0])], dim=1)  # (6, 2)
    assert grpo_loss.zero_variance_groups(scores, 2).tolist() == [[True, False], [False, True], [True, False]]


def test_skipped_groups_under_normalize_then_sum_are_those_without_advantages():
    # Group 0: three rewards trade off so that their sum is 1 for all four samples, but with different spreads, so
    # GDPO's decoupled advantages are not 0 there and the group must stay in the loss. Group 1: every reward is
    # equal across its samples: advantages 0, it leaves.
    per_reward = torch.tensor([[1.0, 0.0, 0.0], [0.0, 0.5, 0.5], [0.0, 0.5, 0.5], [0.0, 0.0, 1.0]]
                              + [[1.0, 1.0, 1.0]] * 4)  # (N = 8, R = 3), G = 4
    weights = torch.ones(3)
    advantages = decoupled_advantages(None, per_reward, weights, 4)  # (N,)
    assert advantages[:4].abs().min() > 0.1 and torch.equal(advantages[4:], torch.zeros(4))
    three = {"accuracy": 1.0, "format": 1.0, "influence": 1.0}
    def kept_as_the_step_keeps(cfg):  # canoe.train_step's advantages by the config's rule, then its kept sequences
        rule = ADVANTAGE_RULES[cfg.advantage_rule]
        advantages = rule(per_reward @ cfg.reward_weights, per_reward, cfg.reward_weights, cfg.num_generations,
                          cfg.advantage_eps, cfg.advantage_std)
        return kept_sequences(advantages, finished(*[False] * 8), cfg.num_generations, cfg.mask_truncated,
                              cfg.skip_zero_variance_groups)

    gdpo = Config(advantage_rule="normalize_then_sum", num_generations=4, rewards=three, skip_zero_variance_groups=True)
    assert torch.equal(kept_as_the_step_keeps(gdpo), torch.tensor([True] * 4 + [False] * 4))
    # under CANOE's sum_then_normalize both groups have advantages 0 and both leave
    assert torch.equal(grpo_loss.group_advantages(per_reward @ weights, 4), torch.zeros(8))
    canoe = Config(num_generations=4, rewards=three, skip_zero_variance_groups=True)
    assert not kept_as_the_step_keeps(canoe).any()


def test_second_update_of_a_rollout_ratio_and_clip_act():
    # μ = 2: the second pass sees a policy that already moved, so logp ≠ logp_old. Two sequences of two tokens,
    # A = (+1, -1), β = 0, ε = 0.2 -> ρ is clipped to [0.8, 1.2].
    old = torch.log(torch.tensor([[0.5, 0.5], [0.4, 0.5]]))
    new = torch.log(torch.tensor([[0.65, 0.55], [0.3, 0.55]])).requires_grad_()
    A = torch.tensor([1.0, -1.0])
    loss, metrics = loss_fn(new, old, None, A, torch.ones(2, 2), beta=0.0)
    # ρ = new / old = [[1.3, 1.1], [0.75, 1.1]]
    #   seq 0 (A = +1): min(1.3, 1.2) = 1.2 (clipped, no gradient); min(1.1, 1.1) = 1.1 (gradient ρA = 1.1)
    #   seq 1 (A = -1): min(-0.75, -0.8) = -0.8 (clipped, no gradient); min(-1.1, -1.1) = -1.1 (gradient -1.1)
    # seq-mean-token-mean: loss = -((1.2 + 1.1) / 2 + (-0.8 - 1.1) / 2) / 2 = -(1.15 - 0.95) / 2 = -0.1
    # d loss / d logp = -ρA / (2 tokens · 2 sequences) on unclipped tokens: -1.1 / 4 = -0.275 and 1.1 / 4 = 0.275
    assert_close(loss, torch.tensor(-0.1))
    assert_close(_grad(loss, new), torch.tensor([[0.0, -0.275], [0.0, 0.275]]))
    summary = summarize_metrics(metrics)
    assert_close(summary["loss/clip_frac"], 0.5)  # 2 of 4 tokens clipped
    assert_close(summary["loss/ratio_mean"], (1.3 + 1.1 + 0.75 + 1.1) / 4)
    assert_close(summary["loss/ratio_min"], 0.75)
    assert_close(summary["loss/ratio_max"], 1.3)


def test_clip_higher_dapo():
    # One token, A = +1, ρ = 1.25 (logp_old = log 0.4, logp = log 0.5), β = 0.
    old = torch.log(torch.tensor([[0.4]]))
    new = torch.log(torch.tensor([[0.5]])).requires_grad_()
    A, mask = torch.tensor([1.0]), torch.ones(1, 1)
    # ε_high = 0.2: min(1.25, 1.2) = 1.2, clipped -> loss -1.2, gradient 0, clip fraction 1
    loss, metrics = loss_fn(new, old, None, A, mask, beta=0.0, clip_eps_high=0.2)
    assert_close(loss, torch.tensor(-1.2))
    assert_close(_grad(loss, new), torch.tensor([[0.0]]))
    assert_close(summarize_metrics(metrics)["loss/clip_frac"], 1.0)
    # ε_high = 0.28: 1.25 < 1.28, not clipped -> loss -1.25, gradient -ρA = -1.25, clip fraction 0
    loss, metrics = loss_fn(new, old, None, A, mask, beta=0.0, clip_eps_high=0.28)
    assert_close(loss, torch.tensor(-1.25))
    assert_close(_grad(loss, new), torch.tensor([[-1.25]]))
    assert_close(summarize_metrics(metrics)["loss/clip_frac"], 0.0)


def test_constant_normaliser_dr_grpo():
    # Two sequences of 1 and 3 trained tokens (T = 3), on-policy (ρ = 1), β = 0, A = (2, -1).
    logp = torch.full((2, 3), -1.0, requires_grad=True)
    mask = torch.tensor([[1.0, 0.0, 0.0], [1.0, 1.0, 1.0]])
    A = torch.tensor([2.0, -1.0])
    loss, _ = loss_fn(logp, logp.detach(), None, A, mask, beta=0.0, aggregation=AGGREGATIONS["seq-mean-token-sum-norm"],
                      max_completion_tokens=4)
    # token losses -A: seq 0 one token of -2, seq 1 three tokens of +1 -> sum = -2 + 3 = 1
    # divided by N · L_max = 2 · 4 = 8 -> 0.125; every trained token's gradient is -A / 8
    assert_close(loss, torch.tensor(0.125))
    assert_close(_grad(loss, logp), torch.tensor([[-0.25, 0.0, 0.0], [0.125, 0.125, 0.125]]))
    # the same batch under seq-mean-token-mean: (-2 / 1 + 3 / 3) / 2 = -0.5, the long sequence weighs less per token
    loss, _ = loss_fn(logp, logp.detach(), None, A, mask, beta=0.0)
    assert_close(loss, torch.tensor(-0.5))
    with pytest.raises(ValueError, match="max_completion_tokens"):
        loss_fn(logp, logp.detach(), None, A, mask, beta=0.0, aggregation=AGGREGATIONS["seq-mean-token-sum-norm"])


def test_sequence_level_ratio_gspo():
    # One sequence of two tokens with token ratios 1.44 and 1.0 (logp_old = log 0.5): geometric mean
    # s = sqrt(1.44 · 1.0) = 1.2. A = +1, β = 0.
    old = torch.log(torch.tensor([[0.5, 0.5]]))
    new = torch.log(torch.tensor([[0.72, 0.5]])).requires_grad_()
    A, mask = torch.tensor([1.0]), torch.ones(1, 2)
    loss, metrics = loss_fn(new, old, None, A, mask, beta=0.0, ratio_level=RATIO_LEVELS["sequence"], clip_eps_high=0.3)
    # every token uses s = 1.2 (inside [0.8, 1.3]): loss = -(1.2 + 1.2) / 2 = -1.2
    # s = exp((Δ_1 + Δ_2) / 2), so d s / d logp_t = s / 2, and d loss / d logp_t = -(1/2)(s/2 + s/2) = -s/2 = -0.6
    assert_close(loss, torch.tensor(-1.2))
    assert_close(_grad(loss, new), torch.tensor([[-0.6, -0.6]]))
    summary = summarize_metrics(metrics)
    assert_close(summary["loss/ratio_min"], 1.2)
    assert_close(summary["loss/ratio_max"], 1.2)
    # with ε_high = 0.1 it is clipped for both tokens: loss -1.1, no gradient
    loss, metrics = loss_fn(new, old, None, A, mask, beta=0.0, ratio_level=RATIO_LEVELS["sequence"], clip_eps_high=0.1)
    assert_close(loss, torch.tensor(-1.1))
    assert_close(_grad(loss, new), torch.tensor([[0.0, 0.0]]))
    assert_close(summarize_metrics(metrics)["loss/clip_frac"], 1.0)
    # token level, for contrast: ratios 1.44 (clipped at 1.3) and 1.0 -> loss -(1.3 + 1.0) / 2 = -1.15
    loss, _ = loss_fn(new, old, None, A, mask, beta=0.0, clip_eps_high=0.3)
    assert_close(loss, torch.tensor(-1.15))


def test_truncated_importance_sampling():
    # Three tokens of one sequence, on-policy for the trainer (ρ = 1), A = +1, β = 0.1 with ref = logp (KL 0).
    # vLLM's log-probabilities differ: π_old / π_vllm = 0.5 / 0.4 = 1.25, 0.5 / 0.5 = 1, 0.6 / 0.2 = 3.
    logp = torch.log(torch.tensor([[0.5, 0.5, 0.6]])).requires_grad_()
    sampler = torch.log(torch.tensor([[0.4, 0.5, 0.2]]))
    A, mask = torch.tensor([1.0]), torch.ones(1, 3)
    capped = {"surrogate_weight": SURROGATE_WEIGHTS["truncated_importance"], "importance_cap": 2.0}
    loss, metrics = loss_fn(logp, logp.detach(), logp.detach(), A, mask, beta=0.1, vllm_logprobs=sampler, **capped)
    # w = min(ratio, 2) = (1.25, 1, 2); token loss -w · ρA = -w; mean over 3 tokens = -(1.25 + 1 + 2) / 3
    assert_close(loss, torch.tensor(-(1.25 + 1 + 2) / 3))
    # gradient of -w ρ A / 3 is -w / 3 (w is a constant); the KL term adds 0 at logp = ref
    assert_close(_grad(loss, logp), torch.tensor([[-1.25 / 3, -1 / 3, -2 / 3]]))
    summary = summarize_metrics(metrics)
    assert_close(summary["loss/importance_mean"], (1.25 + 1 + 2) / 3)
    assert_close(summary["loss/importance_capped_frac"], 1 / 3)  # the third token, 3 > 2
    # off (C = 0): every weight is 1 and nothing is capped, even with vllm_logprobs given
    loss, metrics = loss_fn(logp, logp.detach(), logp.detach(), A, mask, beta=0.1, vllm_logprobs=sampler)
    assert_close(loss, torch.tensor(-1.0))
    assert summarize_metrics(metrics)["loss/importance_mean"] == 1.0
    assert summarize_metrics(metrics)["loss/importance_capped_frac"] == 0.0
    # the KL term is not weighted: ref ≠ logp at the first token only, ref = log 0.25, logp = log 0.5:
    #   D = exp(ref - logp) - (ref - logp) - 1 = 0.5 + ln 2 - 1; its loss share β D / 3 is the same with or without w
    ref = torch.log(torch.tensor([[0.25, 0.5, 0.6]]))
    with_kl, _ = loss_fn(logp, logp.detach(), ref, A, mask, beta=0.1, vllm_logprobs=sampler, **capped)
    assert_close(with_kl, torch.tensor(-(1.25 + 1 + 2) / 3 + 0.1 * (0.5 + LN2 - 1) / 3))
    with pytest.raises(ValueError, match="importance_cap"):
        loss_fn(logp, logp.detach(), None, A, mask, beta=0.0, **capped)  # no sampler log-probabilities


def test_decoupled_advantages_gdpo_hand_values():
    # One group of G = 4; rewards (accuracy, format), weights (1, 1).
    #   accuracy (1, 0, 0, 0): mean 1/4, unbiased std sqrt(((3/4)^2 + 3 (1/4)^2) / 3) = sqrt(1/4) = 1/2
    #       -> A_acc = (3/2, -1/2, -1/2, -1/2)                                                (eps = 0)
    #   format   (1, 1, 1, 0): mean 3/4, std 1/2 -> A_fmt = (1/2, 1/2, 1/2, -3/2)
    #   S = A_acc + A_fmt = (2, 0, 0, -2): mean 0, unbiased std sqrt((4 + 0 + 0 + 4) / 3) = sqrt(8/3)
    per_reward = torch.tensor([[1.0, 1.0], [0.0, 1.0], [0.0, 1.0], [0.0, 0.0]])
    expected = torch.tensor([2.0, 0.0, 0.0, -2.0]) / math.sqrt(8 / 3)
    assert_close(decoupled_advantages(None, per_reward, torch.tensor([1.0, 1.0]), 4, eps=0.0), expected)
    # The plain sum (CANOE) of the same rewards, (2, 1, 1, 0): mean 1, unbiased std sqrt(2/3), so
    # A = (1, 0, 0, -1) / sqrt(2/3): the correct answer's advantage 1.22 against 2 / sqrt(8/3) = 1.22 above; they
    # differ once the rewards' spreads differ (next case).
    assert_close(group_advantages(per_reward.sum(1), 4, eps=0.0),
                 torch.tensor([1.0, 0.0, 0.0, -1.0]) / math.sqrt(2 / 3))
    # Weights scale each reward's normalised advantage before the batch-wide rescaling: weights (3, 1)
    # S = 3 (3/2, -1/2, -1/2, -1/2) + (1/2, 1/2, 1/2, -3/2) = (5, -1, -1, -3): mean 0, std sqrt(36 / 3) = sqrt(12)
    assert_close(decoupled_advantages(None, per_reward, torch.tensor([3.0, 1.0]), 4, eps=0.0),
                 torch.tensor([5.0, -1.0, -1.0, -3.0]) / math.sqrt(12))


def test_decoupled_advantages_constant_rewards_and_errors():
    same = torch.ones(6, 3)  # every reward equal inside each group: no signal
    assert torch.equal(decoupled_advantages(None, same, torch.ones(3), 3), torch.zeros(6))
    # Two rewards that trade off inside a group: S is 0 everywhere, so the advantages are exactly 0
    swap = torch.tensor([[1.0, 0.0], [0.0, 1.0]])
    assert torch.equal(decoupled_advantages(None, swap, torch.ones(2), 2), torch.zeros(2))
    with pytest.raises(ValueError, match=r"\(N, R\)"):
        decoupled_advantages(None, torch.ones(4), torch.ones(1), 2)
    with pytest.raises(ValueError, match=r"\(N, R\)"):
        decoupled_advantages(None, torch.ones(4, 2), torch.ones(3), 2)
