"""Step 6 of the driver: the trained weights into vLLM, and the proof that they arrived, in one call,
`run.push(run.engine)`: every parameter, merged LoRA (`lora.MergedPush`) or the LoRA adapter (`lora.AdapterPush`),
as the set-up chose (`WeightPush.create`).

Differs from CANOE (docs/differences.md, D7): every push is verified, by the probe (`weight_sync.check_sync`) and,
outside float32, where the probe's tolerance must leave room for bfloat16 kernels, by the pushed weights' exact
sums (`weight_sync.check_weight_sums`) and the adapter's in vLLM's LoRA slot (`lora.check_adapter`). With sleep
mode the engine arrives asleep: its weights wake before the push, its KV cache after (the probe needs it).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

import grpo_loss
from plumbing import lora, weight_sync
from training import packing


@dataclass
class WeightPush:
    llm: Any  # this rank's vLLM engine
    probe: tuple[list[int], list[int]]  # (prompt ids, completion ids) scored by both sides after every push
    tolerance: float  # the probe's, in nats (Config.push_tolerance)
    zero_stage: int
    dtype: torch.dtype = torch.float32  # the engine's
    checksums: bool = False  # compare the pushed weights' exact sums with the engine's (outside float32)
    sleep: bool = False  # the engine sleeps through the update (CUDA sleep mode)
    adapter: lora.AdapterPush | None = None  # the LoRA adapter way
    merged: lora.MergedPush | None = None  # the merged LoRA way

    @classmethod
    def create(cls, cfg, llm, probe, dtype: torch.dtype, *, adapter: bool, sleep: bool, folder: Path) -> WeightPush:
        """The way `cfg` pushes: the adapter where `adapter` (Config.pushes_adapter), merged where LoRA trains
        otherwise, full weights without LoRA. `folder` holds this rank's adapter pushes."""
        return cls(llm, probe, cfg.push_tolerance(dtype), cfg.zero_stage,
                   dtype=dtype, checksums=dtype != torch.float32, sleep=sleep,
                   adapter=lora.AdapterPush(folder) if adapter else None,
                   merged=lora.MergedPush() if cfg.lora_rank and not adapter else None)

    @property
    def lora_request(self):
        """What every vLLM request names where vLLM applies the adapter itself (None otherwise)."""
        return self.adapter.request if self.adapter else None

    def __call__(self, engine, *, asleep: bool = True) -> dict[str, float]:
        """Push `engine`'s weights (a DeepSpeed engine or a plain model), verify them and return the `sync/` and
        `time/` metrics and the training phase's `memory/peak_gib`; raises weight_sync.WeightSyncError when they
        did not arrive (canoe.train's `runtime.stop_together` then stops every rank). With `asleep=False` the
        engine is known to be awake (a resumed run's first push)."""
        start = time.perf_counter()
        model = getattr(engine, "module", engine)
        sleeping = self.sleep and asleep
        peak = weight_sync.training_peak(sleeping)  # the training phase's, before vLLM's memory comes back
        weight_sync.wake_weights(self.llm, sleeping)
        sums = weight_sync.WeightSums() if self.checksums else None
        if lora.is_lora(model):
            seconds = lora.push(self.llm, model, self.zero_stage, adapter=self.adapter, base=sleeping,
                                merged_push=self.merged, sums=sums, dtype=self.dtype)
        else:  # every parameter
            weights = weight_sync.iter_full_parameters(model, self.zero_stage)
            weights = weights if sums is None else weight_sync.summed(weights, sums, self.dtype)
            seconds = weight_sync.push_weights(self.llm, weights)
        metrics = {"sync/push_seconds": seconds} | peak
        if self.adapter:  # part of the push: the adapter's folder written and read back
            metrics["time/adapter_push"] = self.adapter.seconds
        if self.merged:  # outside float32: how much of the update arrives
            metrics |= self.merged.metrics()
        if sums is not None:  # over what the push sent
            metrics["sync/weight_sums_gap"] = weight_sync.check_weight_sums(
                sums, weight_sync.engine_weight_sums(self.llm, sums.scope))
        weight_sync.wake_kv_cache(self.llm, sleeping)
        sums_said = "were not compared (float32)" if sums is None else "matched: every pushed value landed bit for bit"
        metrics |= self.check_probe(engine, sums_said)
        metrics["time/weight_push"] = time.perf_counter() - start
        return metrics

    def check_probe(self, engine, sums_said: str) -> dict[str, float]:
        """The probe's `sync/push_*_abs_diff` (weight_sync.check_sync, which raises beyond tolerance)."""
        prompt, completion = self.probe
        device = next(getattr(engine, "module", engine).parameters()).device
        engine.eval()
        with torch.no_grad():  # τ = 1 on both sides: vLLM's prompt log-probabilities are never tempered
            trainer = grpo_loss.completion_logprobs(engine, packing.pack([(prompt, [completion])], device))[0]
        engine.train()
        vllm = weight_sync.vllm_token_logprobs(self.llm, prompt, completion, self.lora_request)
        return weight_sync.check_sync(vllm, trainer, self.tolerance, sums_said)
