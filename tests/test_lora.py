"""LoRA (lora.py): the merge rule, the reference for free, only the adapters trained, one gradient by finite
differences, and the merged push into the real CPU vLLM engine (end-to-end runs: tests/test_train.py)."""

from __future__ import annotations

import copy
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from peft import PeftModel
from conftest import SMOKE_MODEL

import canoe
from plumbing import lora
from training import packing
from plumbing import weight_sync
from config import LORA_TARGETS, Config, ConfigError, load_config
from grpo_loss import completion_logprobs, grpo_loss
from variants import AGGREGATIONS
from test_sleep_order import SleepModeEngine, cuda_kernels, fixed_rewards, make_run, process_group, tiny_model  # noqa: F401

ROOT = Path(__file__).resolve().parent.parent


def adapted(model=None, rank: int = 4, alpha: float = 8.0, seed: int = 1) -> PeftModel:
    """`model` (default: the tiny Llama) with adapters whose B is random, so that they change the output."""
    wrapped = lora.wrap(model if model is not None else tiny_model(), rank=rank, alpha=alpha, dropout=0.0,
                        target_modules=LORA_TARGETS)
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in wrapped.named_parameters():
            if "lora_B" in name:
                param.copy_(0.1 * torch.randn(param.shape, generator=generator, dtype=param.dtype))
    return wrapped


def test_the_pushed_weight_is_w_plus_alpha_over_r_times_b_a():
    base = tiny_model()
    model = adapted(copy.deepcopy(base), rank=4, alpha=8.0)
    weights = dict(lora.policy_weights(model, zero_stage=2))
    # the names are the base model's (what vLLM and a model folder hold), the adapters are not among them
    assert set(weights) == {name for name, _ in base.named_parameters()}
    layer = model.base_model.model.model.layers[1].mlp.down_proj
    A, B = layer.lora_A["default"].weight, layer.lora_B["default"].weight  # (r, in), (out, r)
    W = base.model.layers[1].mlp.down_proj.weight  # (out, in)
    expected = W + (8.0 / 4) * B @ A  # s = α / r = 2
    torch.testing.assert_close(weights["model.layers.1.mlp.down_proj.weight"], expected, rtol=0, atol=1e-6)
    # not adapted: as it is
    assert torch.equal(weights["model.norm.weight"], base.model.norm.weight)
    # the trainer's module is not merged: its base weight is still W
    assert torch.equal(layer.base_layer.weight, W)
    # PEFT's own merge agrees on every weight
    merged = copy.deepcopy(model).merge_and_unload()
    for name, param in merged.named_parameters():
        torch.testing.assert_close(weights[name], param, rtol=0, atol=1e-6)


def test_the_reference_is_the_base_model_with_the_adapters_disabled():
    base = tiny_model()
    model = adapted(copy.deepcopy(base))
    ids = torch.tensor([[1, 5, 9, 13, 2, 3]])
    with torch.no_grad(), lora.adapters_disabled(model):
        reference = model(ids).logits
    with torch.no_grad():
        assert torch.equal(reference, base(ids).logits)
        assert not torch.allclose(model(ids).logits, reference, atol=1e-3)  # enabled again after the block


def test_the_step_trains_only_the_adapters_pushes_the_merge_and_scores_the_reference(tmp_path, process_group,
                                                                                     monkeypatch):
    """canoe.train_step with LoRA (β > 0): the base stays bit-identical, the adapters move, the engine holds the
    merged weights after each push, and π_ref is the base model's log-probabilities."""
    monkeypatch.setattr(canoe, "score", fixed_rewards)
    model = adapted(tiny_model())
    run, llm = make_run(tmp_path, sleep=False, policy=model, beta=0.04)
    base_before = {n: p.detach().clone() for n, p in model.named_parameters() if "lora_" not in n}
    adapters_before = {n: p.detach().clone() for n, p in model.named_parameters() if "lora_" in n}
    optimized = sum(p.numel() for group in run.engine.optimizer.param_groups for p in group["params"])
    assert optimized == sum(p.numel() for p in adapters_before.values())  # only the adapters are in the optimizer
    plain = tiny_model()  # the base model, to score π_ref independently
    for _ in range(3):
        step = canoe.train_step(run)
        assert step.pushed["sync/push_max_abs_diff"] <= 1e-4
        pushed = dict(llm.model.named_parameters())
        for name, tensor in lora.policy_weights(run.engine.module, 2):
            assert torch.equal(pushed[name], tensor), name
    for name, param in model.named_parameters():
        if "lora_" in name:
            continue
        assert torch.equal(param, base_before[name]), f"{name} changed"
    moved = [n for n, p in model.named_parameters() if "lora_" in n and not torch.equal(p, adapters_before[n])]
    assert len(moved) == len(adapters_before)  # every A and B moved
    batch = step.micro_batches[0]
    with torch.no_grad():
        expected = completion_logprobs(plain, batch.packed, run.cfg.temperature)  # (M, C), at the sampling τ
    torch.testing.assert_close(batch.ref, expected, rtol=0, atol=1e-5)


def test_the_adapter_gradients_follow_from_the_merged_weights_gradient():
    """For y = (W + s·B·A)·x the chain rule gives dL/dB = s·G·Aᵀ and dL/dA = s·Bᵀ·G, with G = dL/dW' the gradient
    a fully trained model with the merged weight W' would get. Both sides come from the same GRPO loss: the
    adapters' by backward through PEFT's layers, G by backward through a plain model holding the merged weights."""
    model = adapted(tiny_model(), rank=4, alpha=8.0).train()
    merged = copy.deepcopy(model).merge_and_unload().train().requires_grad_(True)
    packed = packing.pack([([1, 5, 9], [[13, 2, 7, 4], [3, 3, 8, 6]])])
    mask = packed.completion_mask.float()  # (2, C)
    advantages = torch.tensor([1.0, -1.0])
    with torch.no_grad():
        ref = completion_logprobs(tiny_model(), packed) - 0.05  # (2, C), a reference that differs

    def backward(policy) -> None:
        logprobs = completion_logprobs(policy, packed)  # (2, C)
        loss, _ = grpo_loss(logprobs, logprobs.detach(), ref, advantages, mask, beta=0.04,
                            aggregation=AGGREGATIONS["seq-mean-token-mean"], total_sequences=2.0)
        loss.backward()

    backward(model)
    backward(merged)
    layer = model.base_model.model.model.layers[0].self_attn.v_proj
    A, B = layer.lora_A["default"].weight, layer.lora_B["default"].weight  # (r, in), (kv, r)
    G = merged.model.layers[0].self_attn.v_proj.weight.grad  # (kv, in)
    s = 8.0 / 4
    assert float(G.abs().max()) > 1e-4  # a gradient that can tell right from wrong
    torch.testing.assert_close(B.grad, s * G @ A.detach().T)
    torch.testing.assert_close(A.grad, s * B.detach().T @ G)
    assert layer.base_layer.weight.grad is None  # the base is frozen


def test_lora_config_keys_are_checked(tmp_path):
    config = tmp_path / "c.toml"
    for line, key in (("lora_rank = -1", "lora_rank"), ("lora_alpha = 0", "lora_alpha"), ("lora_dropout = 1.0", "lora_dropout"),
                      ("lora_target_modules = []", "lora_target_modules"), ("lora_target_modules = [1]", "lora_target_modules")):
        config.write_text(line + "\n")
        with pytest.raises(ConfigError, match=key):
            load_config(config)
    config.write_text('lora_rank = 8\nlora_target_modules = ["q_proj", "v_proj"]\n')
    cfg = load_config(config)
    assert cfg.lora_settings()["target_modules"] == ["q_proj", "v_proj"] and Config().lora_rank == 0


def test_a_target_module_the_model_lacks_is_named():
    with pytest.raises(lora.LoraSetupError, match="lora_target_modules = \\['qkv_proj'\\]"):
        lora.wrap(tiny_model(), rank=2, alpha=4.0, dropout=0.0, target_modules=["qkv_proj"])


@pytest.mark.skipif(not SMOKE_MODEL.exists(), reason="run `make setup` first (makes models/smoke-llama)")
def test_a_merged_push_lands_in_the_real_cpu_engine_and_an_unmerged_one_fails_the_probe():
    done = subprocess.run([sys.executable, str(ROOT / "tests" / "lora_push.py"), str(SMOKE_MODEL)], cwd=ROOT,
                          capture_output=True, text=True, timeout=600)
    lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    assert lines, done.stdout[-3000:] + done.stderr[-3000:]
    result = json.loads(lines[-1].removeprefix("RESULT "))
    assert result["packed"] and result["packed_said"]  # vLLM's kernels compute from a packed copy; weight_sync knows
    assert not result["unmerged"]["passed"] and result["unmerged"]["gap"] > 1e-2
    assert result["merged"]["passed"] and result["merged"]["gap"] <= 1e-3


@pytest.mark.skipif(not SMOKE_MODEL.exists(), reason="run `make setup` first (makes models/smoke-llama)")
def test_the_adapter_push_lands_in_the_real_cpu_engine_under_a_new_id_each_time():
    """vLLM's own LoRA support on the CPU (lora_push = "adapter"): the request with the adapter computes the adapted
    model, the plain request the base, each push replaces the one adapter the engine holds, and the slot holds the
    pushed adapter bit for bit (lora.check_adapter, run by every push; a stale adapter fails it)."""
    done = subprocess.run([sys.executable, str(ROOT / "tests" / "lora_push.py"), str(SMOKE_MODEL), "adapter"],
                          cwd=ROOT, capture_output=True, text=True, timeout=600)
    lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    assert lines, done.stdout[-3000:] + done.stderr[-3000:]
    result = json.loads(lines[-1].removeprefix("RESULT "))
    pushes = result["pushes"]
    assert [(p["id"], p["held"]) for p in pushes] == [(1, [1]), (2, [2])]
    assert result["stale_caught"]  # the slot's exact sums tell the first adapter from the second
    for p in pushes:
        assert p["gap"] <= 1e-3 and p["base_gap"] > 1e-2, p
