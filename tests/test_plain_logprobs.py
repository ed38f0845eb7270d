"""grpo_loss.plain_completion_logprobs, the log-probabilities to read first, and the packed path training uses
(`completion_logprobs`) held equal to it in values and gradients, on the smoke model and on tiny random models.

Shapes: n completions, C the longest completion, V vocabulary.
"""

import math
from types import SimpleNamespace

import pytest
import torch
from torch.testing import assert_close
from transformers import AutoModelForCausalLM, LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

from conftest import SMOKE_MODEL
from grpo_loss import completion_logprobs, plain_completion_logprobs
from training import packing


class Bigram(torch.nn.Module):
    """A model whose logits at a position are a fixed row per token: the next token's distribution after token
    k is softmax(table[k] / T), whatever came before."""

    def __init__(self, table: list[list[float]]):
        super().__init__()
        self.table = torch.nn.Parameter(torch.tensor(table))  # (V, V)

    def forward(self, input_ids, use_cache=False):
        return SimpleNamespace(logits=self.table[input_ids])  # (1, L, V)


def test_hand_values_at_two_temperatures():
    # After token 0 the logits are (0, ln 3): softmax (1/4, 3/4). After token 1 they are (ln 4, 0): (4/5, 1/5).
    model = Bigram([[0.0, math.log(3)], [math.log(4), 0.0]])
    got = plain_completion_logprobs(model, [[0], [1, 0]], [[1, 1, 0], [0]])  # (2, 3)
    # Sequence 0: 0 → 1 (3/4), 1 → 1 (1/5), 1 → 0 (4/5). Sequence 1: its prompt ends in 0, 0 → 0 (1/4), padding 0.
    expected = torch.tensor([[math.log(3 / 4), math.log(1 / 5), math.log(4 / 5)], [math.log(1 / 4), 0.0, 0.0]])
    assert_close(got, expected)
    # At T = 2 the logits after token 0 are (0, ln 3) / 2: softmax (1, √3) / (1 + √3).
    got = plain_completion_logprobs(model, [[0]], [[1]], temperature=2.0)
    assert_close(got, torch.tensor([[math.log(math.sqrt(3) / (1 + math.sqrt(3)))]]))


def test_an_empty_prompt_is_refused():
    with pytest.raises(ValueError, match="empty prompt"):
        plain_completion_logprobs(Bigram([[0.0, 0.0], [0.0, 0.0]]), [[]], [[1]])


def tiny(kind: str) -> torch.nn.Module:
    torch.manual_seed(0)
    common = dict(vocab_size=61, hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2, max_position_embeddings=128, attn_implementation="sdpa")
    if kind == "llama":
        return LlamaForCausalLM(LlamaConfig(**common)).eval()
    return Qwen2ForCausalLM(Qwen2Config(**common)).eval()


def smoke() -> torch.nn.Module:
    if not SMOKE_MODEL.exists():
        pytest.skip("run `make setup` first (makes models/smoke-llama)")
    return AutoModelForCausalLM.from_pretrained(SMOKE_MODEL, dtype=torch.float32, attn_implementation="sdpa").eval()


# Two prompts, one with three completions and one with two, the second of them one token long.
PROMPTS = [[3, 14, 15, 9, 2, 6]] * 3 + [[38, 4]] * 2
COMPLETIONS = [[5, 3, 5], [8, 1, 40, 2], [9, 7, 9, 3, 2], [6, 2, 6, 4], [3]]


@pytest.mark.parametrize("load", [smoke, lambda: tiny("llama"), lambda: tiny("qwen2")], ids=["smoke", "llama", "qwen2"])
@pytest.mark.parametrize("temperature", [1.0, 0.9])
def test_the_packed_path_equals_the_plain_one_in_values_and_gradients(load, temperature):
    model = load()
    lengths = torch.tensor([len(c) for c in COMPLETIONS])  # (n,)
    mask = torch.arange(max(lengths))[None, :] < lengths[:, None]  # (n, C)
    weights = torch.linspace(-1.0, 2.0, mask.numel()).reshape(mask.shape) * mask  # (n, C), any per-token weighting

    def values_and_gradients(logprobs_of):
        model.zero_grad()
        logprobs = logprobs_of()  # (n, C)
        (weights * logprobs).sum().backward()
        return logprobs.detach(), {name: p.grad.clone() for name, p in model.named_parameters()}

    plain, plain_grads = values_and_gradients(lambda: plain_completion_logprobs(model, PROMPTS, COMPLETIONS,
                                                                                temperature))
    packed, packed_grads = values_and_gradients(lambda: completion_logprobs(
        model, packing.pack_micro_batch(PROMPTS, COMPLETIONS), temperature))
    assert plain.shape == packed.shape == mask.shape
    assert (plain[~mask] == 0).all() and (packed[~mask] == 0).all()
    assert (plain[mask] < 0).all()  # real log-probabilities, not padding
    assert_close(packed, plain, atol=1e-5, rtol=1e-5)
    for name, grad in plain_grads.items():
        assert grad.abs().max() > 0, name
        assert_close(packed_grads[name], grad, atol=1e-5, rtol=1e-4, msg=name)
