"""The push check beyond the probe (issue 30, items 1 and 3): weight sums, and the share of a LoRA update that a
merged push delivers.

In bfloat16 the probe's tolerance must leave room for vLLM's and the trainer's kernels (the GPU recipes: 0.5
nats), and one step at lr 1e-6 moves the probe's log-probabilities by far less: a push that did not land would
pass it. `weight_sync.check_weight_sums` compares the sums of the pushed tensors with the engine's parameters', which
is exact and blind to kernels. The stand-in engine is tests/test_sleep_order.py's (vLLM's `LLM` as the step
uses it; `collective_rpc` with a function calls it with the worker, entrypoints/llm.py lines 574-595).
"""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

import canoe
import lora
import packing
import rollout
import weight_sync
from config import LORA_TARGETS, Config
from test_sleep_order import (IllegalAddress, SleepModeEngine, cuda_kernels, fixed_rewards, make_run,  # noqa: F401
                              process_group, tiny_model)


def test_weight_sums_see_through_fused_and_padded_layouts_but_not_a_changed_value():
    torch.manual_seed(0)
    q, k, v = (torch.randn(64, 32).bfloat16() for _ in range(3))
    embedding = torch.randn(50, 32).bfloat16()
    pushed, engine = weight_sync.WeightSums(), weight_sync.WeightSums()
    for tensor in (q, k, v, embedding):
        pushed.add(tensor)
    padded = torch.cat([embedding, torch.zeros(14, 32, dtype=torch.bfloat16)])  # vocabulary padded to 64 rows
    for tensor in (torch.cat([q, k, v]), padded):  # vLLM's fused qkv_proj
        engine.add(tensor)
    assert weight_sync.check_weight_sums(pushed, engine) <= 1e-12
    stale = q.clone()
    stale[3, 7] = q[3, 7] + (q[3, 7].abs() * 2**-7).bfloat16() * torch.sign(q[3, 7])  # one bf16 step up
    assert not torch.equal(stale, q)
    engine = weight_sync.WeightSums()
    for tensor in (torch.cat([stale, k, v]), padded):
        engine.add(tensor)
    with pytest.raises(weight_sync.WeightSyncError, match="do not sum to what was pushed"):
        weight_sync.check_weight_sums(pushed, engine)


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

    monkeypatch.setattr(weight_sync, "push_weights", stale_push)
    with pytest.raises(weight_sync.WeightSyncError, match="do not sum"):
        canoe.train_step(run)
    # the probe alone would have passed this stale push at the bf16 recipes' tolerance
    prompt, completion = run.probe
    with torch.no_grad():
        trainer = packing.completion_logprobs(run.engine, packing.pack([(prompt, [completion])]))[0]
    assert weight_sync.check_sync(weight_sync.vllm_token_logprobs(llm, prompt, completion), trainer, 0.5) < 0.5


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
    exact = weight_sync.exact_delta(layer)
    assert 0 < float(exact.abs().max()) < 1e-5
    share = weight_sync.DeltaShare()
    merged = weight_sync.merged_weights(layer, share)["weight"]
    assert torch.equal(merged, layer.get_base_layer().weight)  # nothing of the update reaches the engine
    assert share.metrics()["sync/lora_delta_reached"] == 0.0
    assert share.metrics()["sync/lora_delta_error"] == pytest.approx(1.0)


def test_in_float32_the_merge_is_unchanged_and_exact_so_the_share_is_not_measured():
    layer = adapted_layer(torch.float32, 1e-3)
    share = weight_sync.DeltaShare()
    merged = weight_sync.merged_weights(layer, share)["weight"]
    assert torch.equal(merged, weight_sync.merged_weights(copy.deepcopy(layer))["weight"])  # the share only watches
    expected = layer.get_base_layer().weight + layer.get_delta_weight("default")
    assert torch.equal(merged, expected)
    torch.testing.assert_close(weight_sync.exact_delta(layer), layer.get_delta_weight("default"), rtol=0, atol=0)
    assert share.metrics() == {}  # float32 merges exactly: not measured (it would cost 5x the merge on the CPU)
    measured = weight_sync.DeltaShare()
    measured.add(layer.get_base_layer().weight, merged, weight_sync.exact_delta(layer))  # what it would say
    assert measured.metrics()["sync/lora_delta_reached"] == pytest.approx(1.0, abs=1e-3)
    assert measured.metrics()["sync/lora_delta_error"] < 1e-3
    nothing = weight_sync.DeltaShare()
    nothing.add(layer.get_base_layer().weight, layer.get_base_layer().weight, torch.zeros(1))
    assert nothing.metrics() == {"sync/lora_delta_reached": 1.0, "sync/lora_delta_error": 0.0}


# ---------------------------------------------------------------------------- the adapter pushed as it is (item 1)


class LoraEngine(SleepModeEngine):
    """vLLM 0.32's `LLM(enable_lora=True, max_loras=1, max_cpu_loras=1)` as weight_sync.AdapterPush and the step use it:
    - `llm_engine.add_lora(request)` reads the PEFT folder only for an id it does not hold (unless
      `load_inplace`), evicting the oldest adapter above its capacity of one (lora/worker_manager.py lines
      289-330); `list_loras()` names the ids held (v1/engine/llm_engine.py lines 469-479);
    - the slot is written on the device, so a sleeping engine faults, as for the weights (the LoRA buffers are
      allocated with the model, in the weights' memory);
    - `generate(..., lora_request=r)` applies W + s·B·A of the held adapter r (s = lora_alpha / r from its
      adapter_config.json); without one, the base weights alone."""

    def __init__(self, model):
        super().__init__(model)
        self.llm_engine = self
        self.held: dict[int, dict[str, torch.Tensor]] = {}
        self.requests = []

    def add_lora(self, request) -> bool:
        self.events.append(f"add_lora({request.lora_int_id})")
        if "weights" in self.asleep:
            raise IllegalAddress("LoRA slot written while the engine's weight memory is unmapped")
        if request.lora_int_id in self.held and not request.load_inplace:
            return False
        folder = Path(request.lora_path)
        config = json.loads((folder / "adapter_config.json").read_text())
        state = load_file(str(folder / "adapter_model.safetensors"))
        scale = config["lora_alpha"] / config["r"]
        deltas = {}
        for key in state:
            if ".lora_A." in key:
                module = key.removeprefix("base_model.model.").split(".lora_A.")[0]
                B = state[key.replace(".lora_A.", ".lora_B.")]
                deltas[module + ".weight"] = scale * B.float() @ state[key].float()
        if len(self.held) + 1 > 1:
            self.held.pop(next(iter(self.held)))
        self.held[request.lora_int_id] = deltas
        return True

    def list_loras(self) -> set[int]:
        return set(self.held)

    @torch.no_grad()
    def generate(self, prompts, params, use_tqdm: bool = False, lora_request=None):
        self.requests.append(None if lora_request is None else lora_request.lora_int_id)
        if lora_request is None:
            return super().generate(prompts, params)
        parameters = dict(self.model.named_parameters())
        saved = {name: parameters[name].detach().clone() for name in self.held[lora_request.lora_int_id]}
        for name, delta in self.held[lora_request.lora_int_id].items():
            parameters[name].add_(delta)
        try:
            return super().generate(prompts, params)
        finally:
            for name, value in saved.items():
                parameters[name].copy_(value)


def test_the_adapter_push_lands_under_a_new_id_after_the_weights_wake_and_every_request_names_it(
        tmp_path, process_group, monkeypatch):
    from test_lora import adapted

    monkeypatch.setattr(canoe, "score", fixed_rewards)
    model = adapted(tiny_model())
    run, _ = make_run(tmp_path, sleep=True, policy=model, beta=0.04)
    run.llm = llm = LoraEngine(tiny_model())
    run.adapter = weight_sync.AdapterPush(tmp_path / "vllm-adapter" / "rank-0")
    for _ in range(2):
        step = canoe.train_step(run)
        assert step.sync_diff <= 1e-4  # vLLM's W + s·B·A, applied apart, is the trainer's policy
    assert llm.list_loras() == {2} and run.adapter.request.lora_int_id == 2
    assert sorted(p.name for p in (tmp_path / "vllm-adapter" / "rank-0").iterdir()) == ["push-2"]  # push-1 dropped
    engine_params = dict(llm.model.named_parameters())
    for name, tensor in weight_sync.base_weights(run.engine.module, 2):
        assert torch.equal(engine_params[name], tensor), name  # W exactly as the trainer holds it
    held = llm.held[2]
    layer = model.base_model.model.model.layers[1].mlp.down_proj
    torch.testing.assert_close(held["model.layers.1.mlp.down_proj.weight"], weight_sync.exact_delta(layer), rtol=0, atol=0)
    one_step = ["generate", "sleep(2)", "wake_up(weights)", "reload_weights", "reset_prefix_cache"]
    assert llm.events[:7] == one_step + ["add_lora(1)", "wake_up(kv_cache)"]
    # step 1 sampled the base model (no adapter pushed yet), its probe and step 2 the adapter of push 1, then 2
    assert llm.requests == [None, 1, 1, 2]


def test_without_a_discarding_sleep_the_adapter_push_sends_the_adapter_alone(tmp_path, process_group, monkeypatch):
    """Issue 37, item 4: W is frozen and the engine loaded it at start, so an engine that does not sleep gets only
    the adapter; the weight-sum check still covers W (its sums computed once), and the adapter's part is timed."""
    from test_lora import adapted

    monkeypatch.setattr(canoe, "score", fixed_rewards)
    model = adapted(tiny_model())
    run, _ = make_run(tmp_path, sleep=False, policy=model, beta=0.04)
    run.llm = llm = LoraEngine(tiny_model())
    run.adapter = weight_sync.AdapterPush(tmp_path / "vllm-adapter" / "rank-0")
    run.checksum = torch.float32  # the weight-sum check, as outside float32
    for _ in range(2):
        step = canoe.train_step(run)
        assert step.sync_diff <= 1e-4
        assert step.push_metrics["sync/weight_sums_gap"] <= 1e-12
        assert 0 < run.times["adapter_push"] <= run.times["weight_push"]
    assert "reload_weights" not in llm.events
    assert [e for e in llm.events if e.startswith("add_lora")] == ["add_lora(1)", "add_lora(2)"]
    with torch.no_grad():  # a W that did not land would now be seen: the engine's W is no longer the trainer's
        next(llm.model.parameters()).add_(1e-3)
    with pytest.raises(weight_sync.WeightSyncError, match="do not sum"):
        canoe.train_step(run)


def test_an_adapter_the_engine_does_not_hold_stops_the_run(tmp_path):
    class Forgetful(LoraEngine):
        def add_lora(self, request) -> bool:  # a load that leaves the old adapter in place
            return False

    model = lora.wrap(tiny_model(), rank=4, alpha=8.0, dropout=0.0, target_modules=LORA_TARGETS)
    push = weight_sync.AdapterPush(tmp_path)
    with pytest.raises(weight_sync.WeightSyncError, match="adapter push failed"):
        push.push(Forgetful(tiny_model()), model, 2)
    engine = LoraEngine(tiny_model())
    push.push(engine, model, 2)
    push.push(engine, model, 2)
    assert engine.list_loras() == {3} and push.count == 3  # every push a new id: vLLM reads a known id only once


def test_the_adapter_push_is_the_default_on_a_gpu_outside_float32_and_the_engine_gets_lora_support(monkeypatch):
    cfg = Config(lora_rank=16)
    assert not cfg.pushes_adapter(torch.float32, cuda=False)  # the CPU default run: merged, as before
    assert not cfg.pushes_adapter(torch.float32, cuda=True)
    assert cfg.pushes_adapter(torch.bfloat16, cuda=True)
    # the CPU in bfloat16: vLLM's CPU LoRA kernels made sampling 1.6-1.9x slower; a merged push costs far less
    assert not cfg.pushes_adapter(torch.bfloat16, cuda=False)
    assert not Config(lora_rank=16, lora_push="merged").pushes_adapter(torch.bfloat16, cuda=True)
    assert Config(lora_rank=16, lora_push="adapter").pushes_adapter(torch.float32, cuda=False)
    assert not Config(lora_push="adapter").pushes_adapter(torch.bfloat16, cuda=True)  # no LoRA, nothing to push apart
    import dataclasses

    from vllm.engine.arg_utils import EngineArgs

    seen = []
    monkeypatch.setattr(rollout, "LLM", lambda **kwargs: seen.append(kwargs))
    monkeypatch.setattr(weight_sync, "keep_cpu_linear_weights", lambda: None)
    for rank in (0, 4, 16):
        rollout.make_engine("m", dtype="bfloat16", seed=0, max_model_len=64, gpu_memory_utilization=0.5,
                            enable_sleep_mode=True, lora_rank=rank)
    assert "enable_lora" not in seen[0]
    assert [(k["enable_lora"], k["max_lora_rank"], k["max_loras"], k["max_cpu_loras"]) for k in seen[1:]] == \
        [(True, 8, 1, 1), (True, 16, 1, 1)]
    fields = {f.name for f in dataclasses.fields(EngineArgs)}
    assert {"enable_lora", "max_lora_rank", "max_loras", "max_cpu_loras"} <= fields  # the installed vLLM's
