"""packing.py: the layout of a packed micro-batch, and that scoring it equals scoring each sequence on its own."""

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

import grpo_loss
from training import packing

# --- layout, checked by hand


def test_one_group_layout():
    # prompt [5, 6]; completions [7, 2(EOS)] and [9]
    p = packing.pack([([5, 6], [[7, 2], [9]])])
    assert p.input_ids.tolist() == [[5, 6, 7, 2, 9]]
    assert p.position_ids.tolist() == [[0, 1, 2, 3, 2]]  # the second completion starts again right after the prompt
    assert p.predictors.tolist() == [1, 2, 1]  # 7 and 9 are predicted by the prompt's last token, 2 by 7
    assert p.targets.tolist() == [7, 2, 9]
    assert p.completion_mask.tolist() == [[1.0, 1.0], [1.0, 0.0]]
    assert p.allowed.int().tolist() == [
        [1, 0, 0, 0, 0],  # 5
        [1, 1, 0, 0, 0],  # 6
        [1, 1, 1, 0, 0],  # 7: the prompt and itself
        [1, 1, 1, 1, 0],  # 2
        [1, 1, 0, 0, 1],  # 9: the prompt and itself, not the other completion
    ]


def test_groups_do_not_see_each_other():
    p = packing.pack([([1], [[2]]), ([3, 4], [[5], [6]])])
    assert p.input_ids.tolist() == [[1, 2, 3, 4, 5, 6]]
    assert p.position_ids.tolist() == [[0, 1, 0, 1, 2, 2]]
    assert p.predictors.tolist() == [0, 3, 3]
    assert p.allowed.int().tolist() == [
        [1, 0, 0, 0, 0, 0],
        [1, 1, 0, 0, 0, 0],
        [0, 0, 1, 0, 0, 0],
        [0, 0, 1, 1, 0, 0],
        [0, 0, 1, 1, 1, 0],
        [0, 0, 1, 1, 0, 1],
    ]


def test_micro_batch_groups_consecutive_equal_prompts():
    p = packing.pack_micro_batch([[1, 2], [1, 2], [3], [3]], [[4], [5, 6], [7], [8]])
    assert p.input_ids.tolist() == [[1, 2, 4, 5, 6, 3, 7, 8]]
    assert p.completion_mask.tolist() == [[1, 0], [1, 1], [1, 0], [1, 0]]
    with pytest.raises(ValueError):
        packing.pack_micro_batch([[1], [2]], [[3]])  # one prompt per completion


def test_empty_completion_and_empty_prompt():
    p = packing.pack([([1, 2], [[], [3]])])
    assert p.targets.tolist() == [3] and p.predictors.tolist() == [1]
    assert p.completion_mask.tolist() == [[0.0], [1.0]]
    with pytest.raises(ValueError, match="empty prompt"):
        packing.pack([([], [[1]])])


# --- equivalence with one sequence at a time, on real transformers models


def tiny(kind: str, attn: str):
    torch.manual_seed(0)
    common = dict(vocab_size=61, hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2, max_position_embeddings=128, attn_implementation=attn)
    if kind == "llama":
        return LlamaForCausalLM(LlamaConfig(**common)).eval()
    return Qwen2ForCausalLM(Qwen2Config(**common)).eval()


def one_at_a_time(model, groups, temperature=1.0):
    """The plain computation: each prompt + completion alone (no padding, no mask), full log-softmax of the logits
    divided by the sampling temperature."""
    rows = []
    for prompt, completions in groups:
        for completion in completions:
            ids = torch.tensor([list(prompt) + list(completion)])
            logits = model(input_ids=ids).logits[0, len(prompt) - 1 : -1]  # (|c|, V)
            rows.append(torch.log_softmax(logits.float() / temperature, -1).gather(-1, ids[0, len(prompt):, None])[:, 0])
    return rows


GROUPS = [([3, 14, 15, 9, 2, 6], [[5, 3, 5], [8], [9, 7, 9, 3, 2]]), ([38, 4], [[6, 2, 6, 4], [3, 3]])]


@pytest.mark.parametrize("kind", ["llama", "qwen2"])
@pytest.mark.parametrize("attn", ["sdpa", "eager"])
@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_packed_logprobs_and_gradients_equal_one_sequence_at_a_time(kind, attn, temperature):
    model = tiny(kind, attn)
    expected = one_at_a_time(model, GROUPS, temperature)
    weights = [torch.linspace(-1, 2, len(row)) for row in expected]  # any per-token weighting of the loss
    sum((w * row).sum() for w, row in zip(weights, expected)).backward()
    expected_grads = {n: p.grad.clone() for n, p in model.named_parameters()}
    model.zero_grad()

    packed = packing.pack(GROUPS)
    got = grpo_loss.completion_logprobs(model, packed, temperature)  # (5, 5)
    for i, row in enumerate(expected):
        torch.testing.assert_close(got[i, : len(row)], row, atol=1e-5, rtol=1e-5)
        assert (got[i, len(row):] == 0).all()
    padded_weights = torch.zeros_like(got)
    for i, w in enumerate(weights):
        padded_weights[i, : len(w)] = w
    (padded_weights * got).sum().backward()
    for name, param in model.named_parameters():
        torch.testing.assert_close(param.grad, expected_grads[name], atol=1e-5, rtol=1e-4, msg=name)


def test_flash_attention_is_refused_with_a_reason():
    model = tiny("llama", "sdpa")
    model.config._attn_implementation = "flash_attention_2"
    with pytest.raises(ValueError, match="4D attention mask"):
        grpo_loss.completion_logprobs(model, packing.pack(GROUPS))


def test_mask_is_in_the_model_dtype():
    model = tiny("llama", "sdpa").to(torch.bfloat16)
    mask = packing.attention_mask(model, packing.pack(GROUPS).allowed)
    assert mask.dtype == torch.bfloat16 and mask.shape[:2] == (1, 1)
    assert mask[0, 0, 0, 1] == torch.finfo(torch.bfloat16).min and mask[0, 0, 1, 0] == 0
    got = grpo_loss.completion_logprobs(model, packing.pack(GROUPS))
    assert got.dtype == torch.float32 and torch.isfinite(got).all()


def test_a_packed_micro_batch_holds_no_l_by_l_tensor():
    """A step keeps every micro-batch packed until it ends; each must hold O(L) memory, not its (L, L) mask (which
    is built for the forward pass that uses it: the memory plan counts one)."""
    packed = packing.pack([(list(range(1, 101)), [list(range(5, 45)) for _ in range(7)])])  # L = 100 + 7 × 40 = 380
    L = packed.num_tokens
    assert L == 380
    stored = [value for value in vars(packed).values() if isinstance(value, torch.Tensor)]
    assert stored and max(t.numel() for t in stored) < L * L // 10
    assert packed.allowed.shape == (L, L) and packed.allowed.dtype == torch.bool  # still there when asked for
