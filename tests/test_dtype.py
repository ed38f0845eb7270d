"""The training dtype: which one `auto` picks, what each part of the trainer holds in it, and the
push check's tolerance. All of it runs on any CPU: the choice is a pure function of the hardware's flags, and
bfloat16 tensors compute (emulated where the CPU lacks the instructions) on every x86 CPU.
"""

from __future__ import annotations

import doctest

import deepspeed
import pytest
import torch

from plumbing import lora
from training import optimizer
from plumbing import runtime
from config import Config
from test_sleep_order import process_group, tiny_model  # noqa: F401

AVX2 = {"fpu", "sse4_2", "avx", "avx2", "fma"}  # the AMD EPYC of the morning: no bfloat16 instructions
AVX512 = AVX2 | {"avx512f", "avx512bw", "avx512vl"}


@pytest.mark.parametrize("name, cuda, cuda_bf16, flags, expected", [
    ("auto", True, True, set(), torch.bfloat16),  # a GPU with bfloat16 (Ampere and newer)
    ("auto", True, False, set(), torch.float32),  # a V100
    ("auto", False, False, AVX512 | {"avx512_bf16"}, torch.bfloat16),  # Cooper Lake, Zen 4
    ("auto", False, False, AVX512 | {"amx_bf16", "amx_tile"}, torch.bfloat16),  # Sapphire Rapids
    ("auto", False, False, AVX512 | {"avx512_bf16", "amx_bf16"}, torch.bfloat16),
    ("auto", False, False, AVX512, torch.float32),  # AVX-512 without BF16: emulated
    ("auto", False, False, AVX2, torch.float32),
    ("auto", False, False, set(), torch.float32),  # no /proc/cpuinfo
    ("float32", False, False, AVX512 | {"amx_bf16"}, torch.float32),  # the config's choice wins
    ("bfloat16", False, False, AVX2, torch.bfloat16),
    ("float32", True, True, set(), torch.float32),
])
def test_auto_picks_bfloat16_where_the_hardware_computes_in_it(name, cuda, cuda_bf16, flags, expected):
    dtype, why = runtime.choose_dtype(name, cuda=cuda, cuda_bf16=cuda_bf16, cpu_flags=flags)
    assert dtype == expected
    assert why.startswith("auto:") == (name == "auto")


def test_the_reason_names_what_was_found_or_missed():
    assert runtime.choose_dtype("auto", cuda=False, cuda_bf16=False, cpu_flags=AVX2)[1] == (
        "auto: the CPU has neither avx512_bf16 nor amx_bf16, so bfloat16 would be emulated, no faster than float32")
    assert runtime.choose_dtype("auto", cuda=False, cuda_bf16=False,
                                cpu_flags=AVX512 | {"avx512_bf16", "amx_bf16"})[1] == (
        "auto: the CPU has avx512_bf16 and amx_bf16")
    result = doctest.testmod(runtime)
    assert result.attempted > 0 and result.failed == 0


def test_the_flags_are_read_from_this_machine():
    flags = runtime.cpu_flags()
    with open("/proc/cpuinfo") as f:
        first = next(line for line in f if line.startswith("flags"))
    assert set(first.split(":", 1)[1].split()) <= flags and "fpu" in flags


def test_the_probe_tolerance_follows_the_dtype_unless_set():
    assert Config().push_tolerance(torch.float32) == 1e-3
    assert Config().push_tolerance(torch.bfloat16) == 0.5
    assert Config(sync_tolerance=0.2).push_tolerance(torch.bfloat16) == 0.2
    assert Config(sync_tolerance=1e-4).push_tolerance(torch.float32) == 1e-4


def optimizer_states(engine) -> list[torch.Tensor]:
    """The AdamW moments that DeepSpeed's optimizer holds (torch's AdamW under DeepSpeed's ZeRO wrapper)."""
    inner = getattr(engine.optimizer, "optimizer", engine.optimizer)
    return [value for state in inner.state.values() for value in state.values()
            if isinstance(value, torch.Tensor) and value.dim() > 0]


def one_step(engine) -> None:
    loss = engine(torch.tensor([[1, 2, 3, 4, 5]])).logits.float().mean()
    engine.backward(loss)
    engine.step()


@pytest.mark.parametrize("zero_stage", [2, 3])
def test_lora_in_bfloat16_keeps_the_base_in_bfloat16_and_trains_the_adapters_in_float32(zero_stage, process_group):
    cfg = Config(zero_stage=zero_stage, lora_rank=4, prompts_per_device=1, gradient_accumulation_steps=1,
                 num_generations=2, learning_rate=1e-2)
    model = lora.wrap(tiny_model().to(torch.bfloat16), **cfg.lora_settings())
    engine, *_ = deepspeed.initialize(model=model, model_parameters=[p for p in model.parameters() if p.requires_grad],
                                      config=optimizer.deepspeed_config(cfg, 1, torch.bfloat16, train=True))
    parameters = dict(engine.module.named_parameters())
    adapters = {n: p for n, p in parameters.items() if "lora_" in n}
    base = {n: p for n, p in parameters.items() if "lora_" not in n}
    assert adapters and all(p.dtype == torch.float32 and p.requires_grad for p in adapters.values())
    assert all(p.dtype == torch.bfloat16 and not p.requires_grad for p in base.values())

    ids = torch.tensor([[1, 2, 3, 4, 5]])
    with torch.no_grad():  # B = 0: the policy is the base exactly, so step 1's KL is exactly 0
        policy = engine(ids).logits
        with lora.adapters_disabled(engine):
            reference = engine(ids).logits
    assert policy.dtype == torch.bfloat16 and torch.equal(policy, reference)

    one_step(engine)
    states = optimizer_states(engine)
    assert states and all(s.dtype == torch.float32 for s in states)
    assert all(p.dtype == torch.float32 for n, p in engine.module.named_parameters() if "lora_" in n)


def test_full_fine_tuning_in_bfloat16_keeps_float32_master_weights(process_group):
    cfg = Config(zero_stage=2, prompts_per_device=1, gradient_accumulation_steps=1, num_generations=2)
    model = tiny_model()
    engine, *_ = deepspeed.initialize(model=model, model_parameters=list(model.parameters()),
                                      config=optimizer.deepspeed_config(cfg, 1, torch.bfloat16, train=True))
    assert all(p.dtype == torch.bfloat16 for p in engine.module.parameters())
    masters = engine.optimizer.single_partition_of_fp32_groups  # ZeRO-1/2's float32 copy of the weights
    assert masters and all(m.dtype == torch.float32 for m in masters)
    one_step(engine)
    assert all(s.dtype == torch.float32 for s in optimizer_states(engine))
