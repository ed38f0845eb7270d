"""The push check beyond the probe: weight sums, and how much of a LoRA update a merged push delivers.

In bfloat16 the probe's tolerance must leave room for vLLM's and the trainer's kernels (the GPU recipes: 0.5
nats), and one step at lr 1e-6 moves the probe's log-probabilities by far less: a push that did not land would
pass it. `weight_sync.check_weight_sums` compares the sums of the pushed tensors with the engine's parameters', which
is exact and blind to kernels. The stand-in engine is tests/test_sleep_order.py's (vLLM's `LLM` as the step
uses it; `collective_rpc` with a function calls it with the worker, entrypoints/llm.py, `LLM.collective_rpc`).
"""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from safetensors.torch import load_file

import canoe
from plumbing import lora
import grpo_loss
from training import packing
import rollout
from plumbing import weight_sync
from config import LORA_TARGETS, Config
from test_sleep_order import (IllegalAddress, SleepModeEngine, cuda_kernels, fixed_rewards, make_run,  # noqa: F401
                              process_group, tiny_model)

def realistic_layer(size: int = 512, rank: int = 16):
    """One bfloat16 projection of the default run with its LoRA adapter after Adam's first step: W ~ N(0, 0.02²)
    (Qwen2's initializer range), A as PEFT initialises it, B = ±2.5e-5 (lr 5e-5), α/r = 2."""
    from peft import LoraConfig, get_peft_model

    base = torch.nn.Sequential(torch.nn.Linear(size, size, bias=False))
    torch.nn.init.normal_(base[0].weight, std=0.02, generator=torch.Generator().manual_seed(1))
    torch.manual_seed(3)  # PEFT's initialisation of A
    layer = get_peft_model(base, LoraConfig(r=rank, lora_alpha=2 * rank, target_modules=["0"])).base_model.model[0]
    layer.base_layer.to(torch.bfloat16)
    signs = torch.randint(0, 2, layer.lora_B["default"].weight.shape, generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        layer.lora_B["default"].weight.copy_((2.0 * signs - 1) * 2.5e-5)
    return layer


def relative_error(got: torch.Tensor, want: torch.Tensor) -> float:
    return float((got - want).norm() / want.norm())


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
    assert weight_sync.check_weight_sums(pushed, engine) == 0.0
    stale = q.clone()
    stale[3, 7] = q[3, 7] + (q[3, 7].abs() * 2**-7).bfloat16() * torch.sign(q[3, 7])  # one bf16 step up
    assert not torch.equal(stale, q)
    engine = weight_sync.WeightSums()
    for tensor in (torch.cat([stale, k, v]), padded):
        engine.add(tensor)
    with pytest.raises(weight_sync.WeightSyncError, match="do not sum to what was pushed"):
        weight_sync.check_weight_sums(pushed, engine)


def test_weight_sums_are_the_exact_integer_sums_of_the_bits():
    """Σ bits and Σ (1 + layer) · (1 + j mod 97) · bits[i, j], computed here in Python integers: for bfloat16
    (int16 bits, summed in int32 blocks) on a matrix taller than one block whose bits are all the extreme
    -32768 or 32767, and for float32 (int32 bits)."""
    torch.manual_seed(0)
    extreme = torch.where(torch.rand(70_000, 3) < 0.5, -32768, 32767).to(torch.int16).view(torch.bfloat16)
    for tensor, name in ((extreme, "model.layers.2.mlp.up_proj.weight"), (torch.randn(40, 130), "lm_head.weight"),
                         (torch.randn(7).bfloat16(), "model.norm.weight")):
        sums = weight_sync.WeightSums()
        sums.add(tensor, name)
        bits = tensor.view({2: torch.int16, 4: torch.int32}[tensor.element_size()]).reshape(-1, tensor.shape[-1])
        columns = [sum(int(v) for v in bits[:, j]) for j in range(bits.shape[1])]
        assert sums.total == sum(columns)
        layer = 1 + weight_sync.WeightSums.layer_of(name)
        expected = layer * sum((1 + j % 97) * c for j, c in enumerate(columns)) if tensor.dim() >= 2 else 0
        assert sums.placed == expected


def test_weight_sums_see_values_that_landed_in_the_wrong_place():
    """Every value landed, but a square matrix arrived transposed, or two layers' same-shape matrices swapped:
    the plain sum of the bits cannot tell, the column- and layer-weighted sum can; fused rows and zero padding it
    allows."""
    torch.manual_seed(0)
    weights = {f"model.layers.{i}.self_attn.{p}.weight": torch.randn(32, 32).bfloat16()
               for i in range(2) for p in ("q_proj", "o_proj")}
    weights["model.embed_tokens.weight"] = torch.randn(50, 32).bfloat16()
    weights["model.norm.weight"] = torch.randn(32).bfloat16()
    pushed = weight_sync.WeightSums()
    for name, tensor in weights.items():
        pushed.add(tensor, name)

    def engine_holding(**moved) -> weight_sync.WeightSums:
        held = {**weights, **moved}
        held["model.embed_tokens.weight"] = torch.cat([held["model.embed_tokens.weight"],
                                                       torch.zeros(14, 32, dtype=torch.bfloat16)])  # padded rows
        sums = weight_sync.WeightSums()
        for name, tensor in held.items():
            sums.add(tensor, name)
        return sums

    assert weight_sync.check_weight_sums(pushed, engine_holding()) == 0.0
    o0, o1 = "model.layers.0.self_attn.o_proj.weight", "model.layers.1.self_attn.o_proj.weight"
    for wrong in ({o0: weights[o0].T.contiguous()}, {o0: weights[o1], o1: weights[o0]}):
        engine = engine_holding(**wrong)
        assert engine.total == pushed.total  # the plain sum sees nothing
        with pytest.raises(weight_sync.WeightSyncError, match="placed"):
            weight_sync.check_weight_sums(pushed, engine)
    # rows fused as vLLM fuses q, k and v keep every column and layer index: nothing moves
    fused = weight_sync.WeightSums()
    q1 = weights["model.layers.1.self_attn.q_proj.weight"]
    fused.add(torch.cat([q1, weights[o1]]), "model.layers.1.self_attn.qkv_proj.weight")
    apart = weight_sync.WeightSums()
    for name in ("model.layers.1.self_attn.q_proj.weight", o1):
        apart.add(weights[name], name)
    assert fused.placed == apart.placed and fused.placed != 0


def test_a_push_that_did_not_land_passes_a_bf16_probe_tolerance_but_not_the_weight_sums(tmp_path, process_group,
                                                                                          monkeypatch):
    monkeypatch.setattr(canoe, "score", fixed_rewards)
    run, llm = make_run(tmp_path, sleep=False)
    run.cfg = run.cfg.__class__(**{**run.cfg.__dict__, "sync_tolerance": 0.5, "learning_rate": 1e-6})
    for group in run.engine.optimizer.param_groups:  # the optimizer was built at make_run's rate: a small update here
        group["lr"] = 1e-6
    run.push.tolerance = 0.5
    run.push.checksums = True  # what setup sets outside float32; float32 here, the stand-in's dtype
    step = canoe.train_step(run)  # a push that lands: both checks pass
    assert step.pushed["sync/weight_sums_gap"] <= 1e-12 and step.pushed["sync/push_max_abs_diff"] <= 1e-4
    def stale_push(llm, weights, **kwargs) -> float:  # the weights are produced (and summed) but never reach the engine
        for _ in weights:
            pass
        return 0.0

    monkeypatch.setattr(weight_sync, "push_weights", stale_push)
    with pytest.raises(weight_sync.WeightSyncError, match="do not sum"):
        canoe.train_step(run)
    # the probe alone would have passed this stale push at the bf16 recipes' tolerance
    prompt, completion = run.push.probe
    with torch.no_grad():
        trainer = grpo_loss.completion_logprobs(run.engine, packing.pack([(prompt, [completion])]))[0]
    vllm = weight_sync.vllm_token_logprobs(llm, prompt, completion)
    assert weight_sync.check_sync(vllm, trainer, 0.5)["sync/push_max_abs_diff"] < 0.5


class StaleKernelsEngine(SleepModeEngine):
    """An engine whose kernels compute from copies of the weights made at load time, as vLLM's packed CPU kernels
    do when a push does not rebuild them: a push lands in the parameters, so their sums match, and changes nothing
    the engine computes."""

    def _logprobs(self, ids: list[int]) -> torch.Tensor:
        logits = self.kernels(input_ids=torch.tensor([ids])).logits[0].float()  # (len, V)
        return torch.log_softmax(logits, -1)


@pytest.mark.parametrize("tolerance", [1e-3, 0.5], ids=["float32", "bfloat16"])
def test_kernels_that_do_not_read_the_pushed_weights_stop_the_run_though_the_sums_match(tmp_path, process_group,
                                                                                         monkeypatch, tolerance):
    monkeypatch.setattr(canoe, "score", fixed_rewards)
    trained = tiny_model()
    with torch.no_grad():  # a policy many updates away from what the engine loaded: every weight moved
        for param in trained.parameters():
            param.add_(0.1 * torch.randn(param.shape, generator=torch.Generator().manual_seed(param.numel())))
    run, llm = make_run(tmp_path, sleep=False, policy=trained)
    llm.__class__, llm.kernels = StaleKernelsEngine, tiny_model().eval()  # the weights the engine loaded
    run.push.tolerance, run.push.checksums = tolerance, True
    with pytest.raises(weight_sync.WeightSyncError, match="weight sums matched") as caught:
        canoe.train_step(run)
    assert "`sync_tolerance` = " in str(caught.value) and "trimmed maximum" in str(caught.value)


def test_without_a_checksum_dtype_the_step_pushes_as_before(tmp_path, process_group, monkeypatch):
    monkeypatch.setattr(canoe, "score", fixed_rewards)
    run, llm = make_run(tmp_path, sleep=False)
    assert not run.push.checksums  # float32, as the CPU run: no sums taken, no sync/weight_sums_gap
    step = canoe.train_step(run)
    assert set(step.pushed) == {"sync/push_seconds", "sync/push_max_abs_diff", "sync/push_trimmed_abs_diff",
                                "time/weight_push"}
    assert llm.events == ["generate", "reload_weights", "reset_prefix_cache", "generate"]


def adapted_layer(dtype: torch.dtype, b_scale: float):
    model = lora.wrap(tiny_model(), rank=4, alpha=8.0, dropout=0.0, target_modules=LORA_TARGETS).to(dtype)
    layer = model.base_model.model.model.layers[0].mlp.down_proj
    with torch.no_grad():
        layer.lora_B["default"].weight.copy_(torch.full_like(layer.lora_B["default"].weight, b_scale))
    return layer


def delivered(layer, merged: torch.Tensor) -> torch.Tensor:
    return merged.float() - layer.get_base_layer().weight.float()


def test_a_bf16_merge_loses_the_part_of_a_first_steps_update_below_half_a_step_and_says_so():
    """Over the default's 24 steps (B grows by about the learning rate each step), a bfloat16 merged push rounds
    away a fifth of the summed update, and `sync/lora_delta_*` report it: most of the first step's is lost."""
    layer = realistic_layer()
    first_b = layer.lora_B["default"].weight.detach().clone()
    push = lora.MergedPush()
    intended, pushed = 0, 0
    for step in range(1, 25):
        with torch.no_grad():
            layer.lora_B["default"].weight.copy_(first_b * step)
        intended = intended + lora.exact_delta(layer)
        pushed = pushed + delivered(layer, lora.merged_weights(layer, push, "w")["weight"])
        metrics = push.metrics()
        if step == 1:
            assert metrics["sync/lora_delta_bias"] > 0.9 and metrics["sync/lora_delta_cosine"] < 0.5
    assert relative_error(pushed, intended) > 0.15
    assert metrics["sync/lora_delta_bias"] > 0.1  # the metric, on its sample, says the same


def test_the_delivery_metrics_are_measured_on_fixed_entries():
    layer = realistic_layer()
    push = lora.MergedPush()
    lora.merged_weights(layer, push, "w")
    first = push.metrics()
    assert set(first) == {"sync/lora_delta_cosine", "sync/lora_delta_error", "sync/lora_delta_bias"}
    assert first["sync/lora_delta_error"] == pytest.approx(first["sync/lora_delta_bias"])  # one push: the same
    again = lora.MergedPush()
    lora.merged_weights(layer, again, "w")
    assert torch.equal(again.index["w"], push.index["w"]) and again.metrics() == first
    assert len(push.index["w"]) == lora.MergedPush.SAMPLE


def test_a_measured_merge_is_the_plain_merge_and_measures_what_it_loses():
    """Measuring changes nothing that is pushed, and the metrics say how little of a first step's update arrives."""
    layer = realistic_layer()
    push = lora.MergedPush()
    merged = lora.merged_weights(layer, push, "w")["weight"]
    assert torch.equal(merged, lora.merged_weights(layer)["weight"])
    metrics = push.metrics()
    assert metrics["sync/lora_delta_error"] > 0.9 and metrics["sync/lora_delta_bias"] > 0.9
    # measured on the sample with Δ computed at those entries only, as the whole product gives them
    index = push.index["w"]
    torch.testing.assert_close(lora.sampled_delta(layer, index), lora.exact_delta(layer).reshape(-1)[index],
                               rtol=1e-5, atol=1e-12)


def test_in_float32_the_merge_is_unchanged_and_exact_and_nothing_is_measured():
    layer = adapted_layer(torch.float32, 1e-3)
    push = lora.MergedPush()
    merged = lora.merged_weights(layer, push, "w")["weight"]
    expected = layer.get_base_layer().weight + layer.get_delta_weight("default")
    assert torch.equal(merged, expected) and torch.equal(merged, lora.merged_weights(layer)["weight"])
    torch.testing.assert_close(lora.exact_delta(layer), layer.get_delta_weight("default"), rtol=0, atol=0)
    assert push.metrics() == {}  # float32 merges exactly: nothing measured


@pytest.mark.parametrize("targets", [LORA_TARGETS, ["q_proj", "v_proj"]])
def test_a_changed_only_push_sends_every_projection_of_an_adapted_module_and_nothing_else(targets, process_group):
    """vLLM fuses q, k, v (and gate, up): a reload that sent q and v alone would lose k, so k goes too."""
    model = lora.wrap(tiny_model(), rank=4, alpha=8.0, dropout=0.0, target_modules=targets)
    every = [name for name, _ in lora.policy_weights(model, 2)]
    names = [name for name, _ in lora.policy_weights(model, 2, changed_only=True)]
    attention = [f"model.layers.{i}.self_attn.{p}.weight" for i in range(2) for p in ("q_proj", "k_proj", "v_proj",
                                                                                      "o_proj")]
    mlp = [f"model.layers.{i}.mlp.{p}.weight" for i in range(2) for p in ("gate_proj", "up_proj", "down_proj")]
    expected = attention + mlp if "down_proj" in targets else attention
    assert sorted(names) == sorted(expected) and set(names) <= set(every)
    assert not any("embed" in n or "norm" in n or "lm_head" in n for n in names)
    # the engine's sums of such a push cover the parameters vLLM builds from these modules alone: its fused
    # modules (vLLM's own mapping for Llama) when every part was sent, nothing else
    from vllm.model_executor.models.llama import LlamaForCausalLM

    scope = frozenset(name.rpartition(".")[0] for name in names)
    engine = [f"model.layers.{i}.{m}.weight" for i in range(2) for m in (
        "self_attn.qkv_proj", "self_attn.o_proj", "mlp.gate_up_proj", "mlp.down_proj", "input_layernorm",
        "post_attention_layernorm")] + ["model.embed_tokens.weight", "model.norm.weight"]
    covered = [n for n in engine if weight_sync.in_scope(n, scope, LlamaForCausalLM.packed_modules_mapping)]
    fused = [f"model.layers.{i}.{m}.weight" for i in range(2) for m in ("self_attn.qkv_proj", "self_attn.o_proj")]
    mlp_fused = [f"model.layers.{i}.{m}.weight" for i in range(2) for m in ("mlp.gate_up_proj", "mlp.down_proj")]
    assert sorted(covered) == sorted(fused + mlp_fused if "down_proj" in targets else fused)
    assert all(weight_sync.in_scope(n, None, {}) for n in engine)  # no scope: the whole model
    partial_scope = scope - {"model.layers.0.self_attn.k_proj"}  # a fused module with a part not sent is left out
    assert not weight_sync.in_scope("model.layers.0.self_attn.qkv_proj.weight", partial_scope,
                                    LlamaForCausalLM.packed_modules_mapping)


# ---------------------------------------------------------------------------- the adapter pushed as it is (item 1)


class LoraEngine(SleepModeEngine):
    """vLLM 0.32's `LLM(enable_lora=True, max_loras=1, max_cpu_loras=1)` as lora.AdapterPush and the step use it:
    - `llm_engine.add_lora(request)` reads the PEFT folder only for an id it does not hold (unless
      `load_inplace`), evicting the oldest adapter above its capacity of one (lora/worker_manager.py,
      `LRUCacheWorkerLoRAManager.add_adapter`); `list_loras()` names the ids held (v1/engine/llm_engine.py);
    - the slot is written on the device, so a sleeping engine faults, as for the weights (the LoRA buffers are
      allocated with the model, in the weights' memory);
    - `generate(..., lora_request=r)` applies W + s·B·A of the held adapter r (s = lora_alpha / r from its
      adapter_config.json); without one, the base weights alone;
    - the one LoRA slot holds the held adapter's A cast to the model's dtype and B cast, then multiplied by s
      (lora/lora_model.py, `LoRAModel.from_lora_tensors`; lora/lora_weights.py, `LoRALayerWeights.optimize`), in
      `lora_a_stacked` and `lora_b_stacked` of shape (slots, 1, rank, in) and (slots, 1, out, rank), and
      `lora_index_to_id` names its id (lora/layers/base_linear.py, lora/model_manager.py), read by a function
      given to `collective_rpc` through the worker's `model_runner.lora_manager._adapter_manager`."""

    def __init__(self, model):
        super().__init__(model)
        self.llm_engine = self
        self.model_config = SimpleNamespace(dtype=next(model.parameters()).dtype)
        self.held: dict[int, dict[str, torch.Tensor]] = {}
        self.requests = []
        self.lora_manager = SimpleNamespace(_adapter_manager=SimpleNamespace(lora_index_to_id=[None], modules={}))

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
        deltas, slot = {}, {}
        dtype = self.model_config.dtype
        for key in state:
            if ".lora_A." in key:
                module = key.removeprefix("base_model.model.").split(".lora_A.")[0]
                B = state[key.replace(".lora_A.", ".lora_B.")]
                deltas[module + ".weight"] = scale * B.float() @ state[key].float()
                held_b = B.to(dtype) * scale if scale != 1 else B.to(dtype)
                slot[module] = SimpleNamespace(lora_a_stacked=(state[key].to(dtype)[None, None],),
                                               lora_b_stacked=(held_b[None, None],))
        if len(self.held) + 1 > 1:
            self.held.pop(next(iter(self.held)))
        self.held[request.lora_int_id] = deltas
        manager = self.lora_manager._adapter_manager
        manager.lora_index_to_id, manager.modules = [request.lora_int_id], slot
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
    run.llm = run.push.llm = llm = LoraEngine(tiny_model())
    run.push.adapter = lora.AdapterPush(tmp_path / "vllm-adapter" / "rank-0")
    for _ in range(2):
        step = canoe.train_step(run)
        assert step.pushed["sync/push_max_abs_diff"] <= 1e-4  # vLLM's W + s·B·A, applied apart, is the trainer's
    assert llm.list_loras() == {2} and run.push.lora_request.lora_int_id == 2
    assert sorted(p.name for p in (tmp_path / "vllm-adapter" / "rank-0").iterdir()) == ["push-2"]  # push-1 dropped
    engine_params = dict(llm.model.named_parameters())
    for name, tensor in lora.base_weights(run.engine.module, 2):
        assert torch.equal(engine_params[name], tensor), name  # W exactly as the trainer holds it
    held = llm.held[2]
    layer = model.base_model.model.model.layers[1].mlp.down_proj
    torch.testing.assert_close(held["model.layers.1.mlp.down_proj.weight"], lora.exact_delta(layer), rtol=0, atol=0)
    one_step = ["generate", "sleep(2)", "wake_up(weights)", "reload_weights", "reset_prefix_cache"]
    assert llm.events[:7] == one_step + ["add_lora(1)", "wake_up(kv_cache)"]
    # step 1 sampled the base model (no adapter pushed yet), its probe and step 2 the adapter of push 1, then 2
    assert llm.requests == [None, 1, 1, 2]


class StaleSlotEngine(LoraEngine):
    """A LoRA engine that takes each new adapter id but keeps the first adapter's values in its slot (a load that
    did not land): requests name the new id, the computation uses stale values."""

    def add_lora(self, request) -> bool:
        manager = self.lora_manager._adapter_manager
        first = dict(manager.modules)
        added = super().add_lora(request)
        if first:
            manager.modules = first
        return added


def test_an_adapter_that_did_not_land_in_the_slot_stops_the_run_at_its_push(tmp_path, process_group, monkeypatch):
    """The probe's bfloat16 tolerance would let a stale adapter pass for steps at a small learning rate; the slot's
    exact sums (lora.check_adapter) stop the run at the first push whose values did not land."""
    from test_lora import adapted

    monkeypatch.setattr(canoe, "score", fixed_rewards)
    run, _ = make_run(tmp_path, sleep=False, policy=adapted(tiny_model()), beta=0.04)
    run.llm = run.push.llm = StaleSlotEngine(tiny_model())
    run.push.adapter = lora.AdapterPush(tmp_path / "vllm-adapter" / "rank-0")
    canoe.train_step(run)  # push 1 lands: the slot was empty
    with pytest.raises(weight_sync.WeightSyncError, match="LoRA slot does not hold the adapter"):
        canoe.train_step(run)


def test_without_a_discarding_sleep_the_adapter_push_sends_the_adapter_alone(tmp_path, process_group, monkeypatch):
    """W is frozen and the engine loaded it at start, so an engine that does not sleep gets only
    the adapter; the weight-sum check still covers W (its sums computed once), and the adapter's part is timed."""
    from test_lora import adapted

    monkeypatch.setattr(canoe, "score", fixed_rewards)
    model = adapted(tiny_model())
    run, _ = make_run(tmp_path, sleep=False, policy=model, beta=0.04)
    run.llm = run.push.llm = llm = LoraEngine(tiny_model())
    run.push.adapter = lora.AdapterPush(tmp_path / "vllm-adapter" / "rank-0")
    run.push.checksums = True  # the weight-sum check, as outside float32
    for _ in range(2):
        step = canoe.train_step(run)
        assert step.pushed["sync/push_max_abs_diff"] <= 1e-4
        assert step.pushed["sync/weight_sums_gap"] <= 1e-12
        assert 0 < step.pushed["time/adapter_push"] <= step.pushed["time/weight_push"]
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
    push = lora.AdapterPush(tmp_path)
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
