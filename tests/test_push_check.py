"""The push check beyond the probe (issue 30, items 1 and 3): weight sums, and the share of a LoRA update that a
merged push delivers.

In bfloat16 the probe's tolerance must leave room for vLLM's and the trainer's kernels (the GPU recipes: 0.5
nats), and one step at lr 1e-6 moves the probe's log-probabilities by far less: a push that did not land would
pass it. `rollout.check_weight_sums` compares the sums of the pushed tensors with the engine's parameters', which
is exact and blind to kernels. The stand-in engine is tests/test_sleep_order.py's (vLLM's `LLM` as the step
uses it; `collective_rpc` with a function calls it with the worker, entrypoints/llm.py lines 574-595).
"""

from __future__ import annotations

import copy

import pytest
import torch

import canoe
import lora
import packing
import rollout
from config import LORA_TARGETS
from test_sleep_order import cuda_kernels, fixed_rewards, make_run, process_group, tiny_model  # noqa: F401


def test_weight_sums_see_through_fused_and_padded_layouts_but_not_a_changed_value():
    torch.manual_seed(0)
    q, k, v = (torch.randn(64, 32).bfloat16() for _ in range(3))
    embedding = torch.randn(50, 32).bfloat16()
    pushed, engine = rollout.WeightSums(), rollout.WeightSums()
    for tensor in (q, k, v, embedding):
        pushed.add(tensor)
    padded = torch.cat([embedding, torch.zeros(14, 32, dtype=torch.bfloat16)])  # vocabulary padded to 64 rows
    for tensor in (torch.cat([q, k, v]), padded):  # vLLM's fused qkv_proj
        engine.add(tensor)
    assert rollout.check_weight_sums(pushed, engine) <= 1e-12
    stale = q.clone()
    stale[3, 7] = q[3, 7] + (q[3, 7].abs() * 2**-7).bfloat16() * torch.sign(q[3, 7])  # one bf16 step up
    assert not torch.equal(stale, q)
    engine = rollout.WeightSums()
    for tensor in (torch.cat([stale, k, v]), padded):
        engine.add(tensor)
    with pytest.raises(rollout.WeightSyncError, match="do not sum to what was pushed"):
        rollout.check_weight_sums(pushed, engine)


def test_a_push_that_did_not_land_passes_a_bf16_probe_tolerance_but_not_the_weight_sums(tmp_path, process_group,
                                                                                          monkeypatch):
    monkeypatch.setattr(canoe, "score", fixed_rewards)
    run, llm = make_run(tmp_path, sleep=False)
    run.cfg = run.cfg.__class__(**{**run.cfg.__dict__, "sync_tolerance": 0.5, "learning_rate": 1e-6})
    run.checksum = torch.float32  # what setup sets outside float32; float32 here, the stand-in's dtype
    step = canoe.train_step(run)  # a push that lands: both checks pass
    assert step.push_metrics["sync/weight_sums_gap"] <= 1e-12 and step.sync_diff <= 1e-4
    def stale_push(llm, weights) -> float:  # the weights are produced (and summed) but never reach the engine
        for _ in weights:
            pass
        return 0.0

    monkeypatch.setattr(rollout, "push_weights", stale_push)
    with pytest.raises(rollout.WeightSyncError, match="do not sum"):
        canoe.train_step(run)
    # the probe alone would have passed this stale push at the bf16 recipes' tolerance
    prompt, completion = run.probe
    with torch.no_grad():
        trainer = packing.completion_logprobs(run.engine, packing.pack([(prompt, [completion])]))[0]
    assert rollout.check_sync(rollout.vllm_token_logprobs(llm, prompt, completion), trainer, 0.5) < 0.5


def test_without_a_checksum_dtype_the_step_pushes_as_before(tmp_path, process_group, monkeypatch):
    monkeypatch.setattr(canoe, "score", fixed_rewards)
    run, llm = make_run(tmp_path, sleep=False)
    assert run.checksum is None  # float32, as the CPU run: no sums taken, no sync/weight_sums_gap
    step = canoe.train_step(run)
    assert step.push_metrics == {} and llm.events == ["generate", "reload_weights", "reset_prefix_cache", "generate"]


def adapted_layer(dtype: torch.dtype, b_scale: float):
    model = lora.wrap(tiny_model(), rank=4, alpha=8.0, dropout=0.0, target_modules=LORA_TARGETS).to(dtype)
    layer = model.base_model.model.model.layers[0].mlp.down_proj
    with torch.no_grad():
        layer.lora_B["default"].weight.copy_(torch.full_like(layer.lora_B["default"].weight, b_scale))
    return layer


def test_a_merged_bf16_push_loses_an_update_below_half_a_step_of_w_and_the_share_says_so():
    """W ~ 0.02 has a bf16 step of ~1.2e-4; an update of ~1e-6 per entry rounds away entirely in bf16."""
    layer = adapted_layer(torch.bfloat16, 1e-7)
    exact = lora.exact_delta(layer)
    assert 0 < float(exact.abs().max()) < 1e-5
    share = lora.DeltaShare()
    merged = lora.merged_weights(layer, share)["weight"]
    assert torch.equal(merged, layer.get_base_layer().weight)  # nothing of the update reaches the engine
    assert share.metrics()["sync/lora_delta_reached"] == 0.0
    assert share.metrics()["sync/lora_delta_error"] == pytest.approx(1.0)


def test_in_float32_the_share_is_whole_and_the_merge_is_unchanged():
    layer = adapted_layer(torch.float32, 1e-3)
    share = lora.DeltaShare()
    merged = lora.merged_weights(layer, share)["weight"]
    assert torch.equal(merged, lora.merged_weights(copy.deepcopy(layer))["weight"])  # the share only watches
    expected = layer.get_base_layer().weight + layer.get_delta_weight("default")
    assert torch.equal(merged, expected)
    torch.testing.assert_close(lora.exact_delta(layer), layer.get_delta_weight("default"), rtol=0, atol=0)
    metrics = share.metrics()
    assert metrics["sync/lora_delta_reached"] == pytest.approx(1.0, abs=1e-3)
    assert metrics["sync/lora_delta_error"] < 1e-3
    assert lora.DeltaShare().metrics() == {"sync/lora_delta_reached": 1.0, "sync/lora_delta_error": 0.0}
