"""max_bad_steps under bfloat16: DeepSpeed 0.19.8 skips a non-finite update under ZeRO-2 and ZeRO-3 alike.

`canoe.skip_or_stop_on_bad_step` counts a step whose update DeepSpeed skipped (a non-finite loss, or non-finite
gradients from a finite one) and stops the run if a non-finite loss's update was applied. Whether DeepSpeed skips
in bfloat16 is read in its source, and this file runs it (real engines, one CPU rank, in this process):
- ZeRO-3: `DeepSpeedZeroOptimizer_Stage3.step` (deepspeed/runtime/zero/stage3.py) checks overflow by the
  gradient values only in fp16 (`_overflow_check_and_loss_scale_update`: `if self.dtype == torch.float16:
  self.check_overflow()`), but then, in every precision, takes the gradient norm and marks an invalid one as
  overflow (`combine_grad_norm_groups`, `is_invalid_grad_norm` -> `self.overflow = True`; a NaN or inf group norm
  is the -1 sentinel of `get_grad_norm_direct`, which `combine_grad_norm_groups` in runtime/utils.py keeps
  invalid), and returns without an update (`_loss_scale_update_and_overflow_cleanup`).
- ZeRO-1/2: `bf16.check_grad_overflow` (our optimizer.deepspeed_config sets it; read in engine.py,
  `DeepSpeedEngine._configure_zero_optimizer`) turns on the gradient check in `DeepSpeedZeroOptimizer.step`
  (stage_1_and_2.py), and an invalid norm is an overflow in bf16 when it is set.
- The engine reads the optimizer's `overflow` after the step: `was_step_applied()` is then False and the LR
  scheduler does not advance (engine.py, `DeepSpeedEngine._take_model_step`).
So ZeRO-3 in bf16 does skip a non-finite update in the installed DeepSpeed; these
tests hold the behaviour that max_bad_steps relies on, so an upgrade that loses it fails here.
"""

from __future__ import annotations

from types import SimpleNamespace

import deepspeed
import pytest
import torch

import canoe
from training import optimizer
from config import Config
from test_sleep_order import process_group, tiny_model  # noqa: F401


def full_parameters(engine, zero_stage: int) -> dict[str, torch.Tensor]:
    values = {}
    for name, param in engine.module.named_parameters():
        with deepspeed.zero.GatheredParameters([param], enabled=zero_stage == 3):
            values[name] = param.detach().clone()
    return values


@pytest.mark.parametrize("zero_stage", [2, 3])
def test_a_nonfinite_step_is_skipped_in_bfloat16_and_max_bad_steps_acts(zero_stage, process_group):
    cfg = Config(zero_stage=zero_stage, prompts_per_device=1, gradient_accumulation_steps=1, num_generations=2,
                 max_bad_steps=2, learning_rate=1e-3)
    model = tiny_model()
    engine, *_ = deepspeed.initialize(model=model, model_parameters=list(model.parameters()),
                                      config=optimizer.deepspeed_config(cfg, 1, torch.bfloat16, train=True))
    assert next(engine.module.parameters()).dtype == torch.bfloat16
    run = SimpleNamespace(engine=engine, cfg=cfg, bad_steps_in_a_row=0, bad_steps_total=0)
    ids = torch.tensor([[1, 2, 3, 4, 5]])

    def step(scale: float) -> torch.Tensor:
        loss = engine(ids).logits.float().mean() * scale
        engine.backward(loss)
        engine.step()
        return loss.detach()

    before = full_parameters(engine, zero_stage)
    canoe.skip_or_stop_on_bad_step(run, [step(1.0)])
    assert engine.was_step_applied() and run.bad_steps_in_a_row == 0
    moved = full_parameters(engine, zero_stage)
    assert any(not torch.equal(before[n], moved[n]) for n in before)  # a finite step updates

    canoe.skip_or_stop_on_bad_step(run, [step(float("nan"))])  # DeepSpeed skipped it, so this only counts
    assert not engine.was_step_applied() and (run.bad_steps_in_a_row, run.bad_steps_total) == (1, 1)
    after = full_parameters(engine, zero_stage)
    assert all(torch.equal(moved[n], after[n]) for n in moved)  # the weights were not touched
    with pytest.raises(RuntimeError, match="2 steps in a row had a non-finite loss"):
        canoe.skip_or_stop_on_bad_step(run, [step(float("inf"))])


@pytest.mark.parametrize("zero_stage", [2, 3])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_a_finite_loss_with_nonfinite_gradients_counts_as_a_bad_step(zero_stage, dtype, process_group):
    """DeepSpeed skips the update of non-finite gradients whatever the loss, so the step counts as bad.

    The loss goes through `torch.where(True, x, x / 0)`: its value is x's, finite, but the backward pass of the
    branch not taken multiplies a zero gradient by 1 / 0 and every gradient becomes NaN.
    """
    cfg = Config(zero_stage=zero_stage, prompts_per_device=1, gradient_accumulation_steps=1, num_generations=2,
                 max_bad_steps=2, learning_rate=1e-3)
    model = tiny_model()
    engine, *_ = deepspeed.initialize(model=model, model_parameters=list(model.parameters()),
                                      config=optimizer.deepspeed_config(cfg, 1, dtype, train=True))
    run = SimpleNamespace(engine=engine, cfg=cfg, bad_steps_in_a_row=0, bad_steps_total=0)
    ids = torch.tensor([[1, 2, 3, 4, 5]])

    def step() -> torch.Tensor:
        logits = engine(ids).logits.float()
        loss = torch.where(torch.tensor(True), logits, logits / 0.0).mean()
        engine.backward(loss)
        engine.step()
        return loss.detach()

    before = full_parameters(engine, zero_stage)
    loss = step()
    assert torch.isfinite(loss) and not engine.was_step_applied()
    canoe.skip_or_stop_on_bad_step(run, [loss])
    assert (run.bad_steps_in_a_row, run.bad_steps_total) == (1, 1)
    after = full_parameters(engine, zero_stage)
    assert all(torch.equal(before[n], after[n]) for n in before)  # the weights were not touched
    with pytest.raises(RuntimeError, match="2 steps in a row had a non-finite loss or gradient"):
        canoe.skip_or_stop_on_bad_step(run, [step()])
