"""weight_sync.py on models the other tests do not cover: a tied input embedding and output head.

Qwen2.5 up to 3B, Llama-3.2 and SmolLM2 hold one tensor as `model.embed_tokens.weight` and `lm_head.weight`. The
engine counts it once (vLLM makes the head the embedding's Parameter and its `parameters()` yield it once), so
every push path must send and sum it once, or the weight-sum check of every push outside float32 fails. Walking
`named_modules()` and each module's own parameters, as ZeRO-3 gathering and the LoRA paths do, meets it twice.
"""

from __future__ import annotations

import deepspeed
import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from plumbing import lora
from training import optimizer
from plumbing import weight_sync
from config import Config
from test_sleep_order import VOCAB, process_group  # noqa: F401


def tied_model() -> LlamaForCausalLM:
    torch.manual_seed(0)
    return LlamaForCausalLM(LlamaConfig(vocab_size=VOCAB, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                                        num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=64,
                                        tie_word_embeddings=True, attn_implementation="sdpa"))


def engine_sums(model: torch.nn.Module) -> weight_sync.WeightSums:
    """What the engine's side of `check_weight_sums` adds up: every distinct parameter once."""
    sums = weight_sync.WeightSums()
    for param in model.parameters():
        sums.add(param)
    return sums


def pushed(weights) -> tuple[list[str], weight_sync.WeightSums]:
    sums, names = weight_sync.WeightSums(), []
    for name, tensor in weights:
        names.append(name)
        sums.add(tensor)
    return names, sums


@pytest.mark.parametrize("zero_stage", [2, 3])
@pytest.mark.parametrize("lora_rank", [0, 4])
def test_a_tied_embedding_is_pushed_and_summed_once(zero_stage, lora_rank, process_group):
    model = tied_model()
    assert model.lm_head.weight is model.model.embed_tokens.weight
    expected = engine_sums(tied_model())  # B starts at 0, so the merged policy is the base exactly
    if lora_rank:
        model = lora.wrap(model, rank=lora_rank, alpha=8.0, dropout=0.0, target_modules=["q_proj", "v_proj"])
    cfg = Config(zero_stage=zero_stage, prompts_per_device=1, gradient_accumulation_steps=1, num_generations=2)
    engine, *_ = deepspeed.initialize(model=model, model_parameters=[p for p in model.parameters() if p.requires_grad],
                                      config=optimizer.deepspeed_config(cfg, 1, torch.float32, train=True))
    paths = {"full": weight_sync.iter_full_parameters(engine.module, zero_stage)}
    if lora_rank:
        paths = {"merged": lora.policy_weights(engine.module, zero_stage),
                 "adapter's base": lora.base_weights(engine.module, zero_stage)}
    for path, weights in paths.items():
        names, sums = pushed(weights)
        assert len(names) == len(set(names)), (path, names)
        assert "model.embed_tokens.weight" in names and "lm_head.weight" not in names, (path, names)
        assert weight_sync.check_weight_sums(sums, expected) == 0.0, path
