"""On one CUDA GPU: what the CPU suite cannot show, checked in one run of a few minutes. One line per check, its
figure and PASS or FAIL; the exit status is 1 if any check failed.

1. packing: the packed micro-batch's log-probabilities and LoRA gradients (`grpo_loss.completion_logprobs` over
   `training/packing.py`'s mask) against each sequence scored alone, under torch's default attention kernel, the
   memory-efficient one and the math one; bfloat16 base, float32 adapters, L not a multiple of 8. The tolerance is
   the dtype's own noise: twice the gap between the bfloat16 sequences alone and the same in float32.
2. deepspeed: one step of `training/optimizer.deepspeed_config` under ZeRO-2 and ZeRO-3 on the GPU's collective
   backend (NCCL), with LoRA and with full fine-tuning: each stage's full gradient against a plain model's (within
   the bfloat16 noise: the plain model against its float32 copy), its step against torch's AdamW on float32 master
   copies with those gradients, the `WeightSums` of the weights a push sends (`weight_sync.iter_full_parameters`,
   `lora.policy_weights`) on the GPU against the same tensors' on the CPU, and `plumbing/checkpoint.py`'s save and
   load (a fresh engine loads the checkpoint, both take one more step under torch's deterministic algorithms and
   the math attention kernel: equal bits; the saved policy folder holds the pushed weights bit for bit).
3. memory: `torch.cuda.max_memory_allocated()` of one worst-case micro-batch's forward and backward with the
   adapters in float32 as training holds them (no DeepSpeed bf16 mode with LoRA), within `MEMORY_BAND` of
   `memory_plan.activation_bytes` of the same shape; the ratio is printed either way, to calibrate the plan.
4. merge: the default run's LoRA update (log π with it less log π without) seen by base + adapter (as training
   computes π), by the float32 merge run in bfloat16 (vLLM loading a merged checkpoint at the config's dtype) and
   run in float32 (the exact update): base + adapter keeps the exact update to within a quarter, the bfloat16 run
   of the merge keeps no more than base + adapter, the float32 run is within twice the bfloat16 noise of it.

`--break-mask` checks the packing check: with a plain causal mask the packing lines must fail.

Random weights from a config (models/ is not carried: the default model alone is ~1 GB): the default model's shape
with fewer layers (`--layers`), Llama-3.1-8B's for the memory check; initializer_range 2/√h so that the mask's
mistakes show in the log-probabilities. The GPU machine has torch but no vLLM: a stand-in answers `import vllm`
(`_NoVllm`), whose names raise if called; no check calls one. What else the run imports and the machine lacks
travels as the wheels of bench/gpu_wheels.txt; docs/gpus.md, "The first device run", gives the commands, the time
and what each line means.

The first line gives the versions the run found (Python, torch, transformers, PEFT, huggingface-hub, tokenizers,
safetensors), before anything is imported; an import that fails, or an error outside the checks, ends the run with
a FAIL line that names it. Each check runs in its own try: one that raises is a FAIL and the next one runs.

    .venv/bin/python bench/gpu_check.py --cpu     # on a CPU (tests/test_gpu_check.py): a tiny model, no memory check
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import dataclasses
import gc
import importlib.abc
import importlib.machinery
import importlib.metadata
import importlib.util
import math
import os
import platform
import sys
import tempfile
import traceback
import types
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
# cuBLAS is deterministic only with a fixed workspace, read when its first handle is made: before torch starts.
os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
sys.path.insert(0, str(ROOT / "bench"))


class _Absent:
    """A name vLLM would provide: importable, raises if used."""

    def __init__(self, name: str):
        self.name = name

    def __call__(self, *args, **kwargs):
        raise RuntimeError(f"{self.name}: vLLM is not installed here, and gpu_check calls no vLLM code")

    def __getattr__(self, attribute: str) -> _Absent:
        return _Absent(f"{self.name}.{attribute}")


class _NoVllm(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """`import vllm` and its submodules as empty modules whose every name is `_Absent`: plumbing/lora.py,
    weight_sync.py and checkpoint.py import vLLM's names at their top, and the parts checked here use none."""

    def find_spec(self, name, path, target=None):
        if name == "vllm" or name.startswith("vllm."):
            return importlib.machinery.ModuleSpec(name, self, is_package=True)
        return None

    def create_module(self, spec):
        module = types.ModuleType(spec.name)
        module.__path__ = []
        module.__getattr__ = lambda attribute: _Absent(f"{spec.name}.{attribute}")
        return module

    def exec_module(self, module) -> None:
        pass


VERSIONS = ("torch", "transformers", "peft", "huggingface-hub", "tokenizers", "safetensors")


def found_versions() -> str:
    """The installed versions of `VERSIONS`, read from their metadata (nothing imported), and Python's."""
    def version(name: str) -> str:
        try:
            return importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            return "MISSING"

    return f"python {platform.python_version()}, " + ", ".join(f"{name} {version(name)}" for name in VERSIONS)


def stopped(where: str) -> None:
    """End the run on an error outside the checks, with its traceback and a FAIL line that says where and why."""
    traceback.print_exc()
    print(f"FAIL  {where}: {traceback.format_exc().strip().splitlines()[-1]}", flush=True)
    sys.exit(1)


# Run as a script, on every machine (the CPU test too, which so shows that the run needs no vLLM); imported, only
# where vLLM is missing, so that a process that has vLLM keeps it.
if __name__ == "__main__":
    print(f"       {found_versions()}", flush=True)
if __name__ == "__main__" or importlib.util.find_spec("vllm") is None:
    sys.meta_path.insert(0, _NoVllm())

try:
    from plumbing import runtime  # noqa: I001  (first: the environment before torch loads)
    import deepspeed
    import torch
    import torch.distributed as dist
    from torch.nn.attention import SDPBackend, sdpa_kernel

    import config
    import cuda_memory  # bench/: the model configs and the worst-case micro-batch
    import grpo_loss
    from plumbing import checkpoint, lora, memory_plan
    from plumbing.weight_sync import WeightSums, iter_full_parameters
    from training import packing
    from training.optimizer import deepspeed_config
except Exception:  # a package missing or at a version another refuses (transformers checks its own at import)
    if __name__ != "__main__":
        raise
    stopped("imports (bench/gpu_wheels.txt lists what travels)")

MIB = 2**20
TINY = memory_plan.Architecture(hidden=64, layers=2, intermediate=128, vocab=512, heads=4, kv_heads=2, head_dim=16,
                                qkv_bias=True, tied_embeddings=True)
BACKENDS = {"default": None, "efficient": SDPBackend.EFFICIENT_ATTENTION, "math": SDPBackend.MATH}
# The measured activations over the plan's: bfloat16 adapters measured within -6 % and +5 % of it on an H200
# (bench/RESULTS.md); outside this band the plan misses a part, or counts one twice.
MEMORY_BAND = (0.9, 1.1)
# One AdamW step moves each weight by about lr: above the bfloat16 spacing of every weight below 1 (2⁻⁸ at 1), so
# that the full fine-tuning step shows in bfloat16 weights.
STEP_LR = 1e-2


class Report:
    """One line per check: PASS or FAIL, its name, its figure."""

    def __init__(self):
        self.failed: list[str] = []

    def __call__(self, name: str, ok: bool, figure: str) -> None:
        print(f"{'PASS' if ok else 'FAIL'}  {name}: {figure}", flush=True)
        if not ok:
            self.failed.append(name)


# ------------------------------------------------------------------------------------------------ models and data


def random_model(arch: memory_plan.Architecture, layers: int, dtype: torch.dtype, device, seed: int = 0):
    """A decoder of `arch`'s shape with `layers` layers and seeded random weights (initializer_range 2/√h)."""
    from transformers import AutoModelForCausalLM

    hf = cuda_memory.hf_config(arch, layers, positions=8192)
    hf.initializer_range = 2 / math.sqrt(arch.hidden)
    torch.manual_seed(seed)
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(hf, dtype=dtype, attn_implementation="sdpa")
    return model.train()  # as training holds it (gradient checkpointing acts only then); its dropouts are 0


def with_adapters(model, cfg: config.Config, b_scale: float, seed: int = 1):
    """`model` with the config's LoRA (PEFT keeps the adapters float32 on a bfloat16 base, as training does) and B
    moved off its zero start to `b_scale` · N(0, 1), so that A has a gradient and the adapter changes π."""
    wrapped = lora.wrap(model, **(cfg.lora_settings() | {"dropout": 0.0, "gradient_checkpointing": False}))
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in wrapped.named_parameters():
            if "lora_B" in name:
                param.copy_(b_scale * torch.randn(param.shape, generator=generator))
    return wrapped


def groups(vocab: int, scale: int, seed: int = 2) -> list[packing.Group]:
    """Two prompts of 3 and 2 completions of unequal lengths, L = 41 · `scale` tokens (odd: not a multiple of 8)."""
    generator = torch.Generator().manual_seed(seed)

    def tokens(n: int) -> list[int]:
        return torch.randint(vocab, (n * scale,), generator=generator).tolist()

    return [(tokens(9), [tokens(5), tokens(3), tokens(7)]), (tokens(7), [tokens(4), tokens(6)])]


def token_weights(packed: packing.Packed, seed: int = 3) -> torch.Tensor:
    """A fixed random weighting of the completion tokens `(n, C)`: the gradient of Σ w·log π reaches every token."""
    generator = torch.Generator().manual_seed(seed)
    return torch.randn(packed.completion_mask.shape, generator=generator).to(packed.completion_mask.device)


# ---------------------------------------------------------------------------------------------------- 1. packing


def logprobs_and_grads(model, rows: list[list[packing.Group]], backend: str,
                       device) -> tuple[torch.Tensor, torch.Tensor]:
    """Log-probabilities of every completion token, each element of `rows` packed into one row, flattened in
    order, and the gradient of Σ w·log π over the adapters, flattened; w as `token_weights` of every completion."""
    adapters = [p for p in model.parameters() if p.requires_grad]
    every = [(prompt, [c]) for row in rows for prompt, completions in row for c in completions]
    weights = token_weights(packing.pack(every, device))  # (n, C) over all completions, in order
    values, loss, first = [], 0.0, 0
    for row in rows:
        packed = packing.pack(row, device)
        with sdpa_kernel(BACKENDS[backend]) if BACKENDS[backend] else contextlib.nullcontext():
            logprobs = grpo_loss.completion_logprobs(model, packed)  # (n, C)
        n, C = logprobs.shape
        loss = loss + (logprobs * weights[first:first + n, :C]).sum()
        values.append(logprobs[packed.completion_mask.bool()].detach().float())
        first += n
    grads = torch.autograd.grad(loss, adapters)
    return torch.cat(values), torch.cat([g.reshape(-1).float() for g in grads])


def causal_only(packed: packing.Packed) -> torch.Tensor:
    """`--break-mask`, the check of the check: every token sees every earlier token of the row, other prompts' and
    other completions' too (a sequence alone is unchanged)."""
    return torch.ones(packed.num_tokens, packed.num_tokens, dtype=torch.bool, device=packed.group.device).tril()


def relative(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).norm() / b.norm().clamp_min(1e-30))


def check_packing(report: Report, cfg: config.Config, arch, layers: int, scale: int, backends, device) -> None:
    """Packed against alone, per backend, within twice the bfloat16 noise (alone in bfloat16 against float32)."""
    model = with_adapters(random_model(arch, layers, torch.bfloat16, device), cfg, b_scale=0.05)
    exact = copy.deepcopy(model).float()
    units = groups(arch.vocab, scale)
    L = packing.pack(units, device).num_tokens
    alone = [[(prompt, [c])] for prompt, completions in units for c in completions]
    reference = logprobs_and_grads(exact, alone, "math", device)
    for backend in backends:
        single = logprobs_and_grads(model, alone, backend, device)
        packed = logprobs_and_grads(model, [units], backend, device)
        noise = (float((single[0] - reference[0]).abs().max()), relative(single[1], reference[1]))
        gap = (float((packed[0] - single[0]).abs().max()), relative(packed[1], single[1]))
        report(f"packing {backend}: log π packed vs alone (L = {L}, max |Δ|)", L % 8 != 0 and gap[0] <= 2 * noise[0],
               f"{gap[0]:.3g} nats, bf16 noise {noise[0]:.3g}")
        report(f"packing {backend}: LoRA gradient packed vs alone (relative)", gap[1] <= 2 * noise[1],
               f"{gap[1]:.3g}, bf16 noise {noise[1]:.3g}")


# -------------------------------------------------------------------------------------------------- 2. deepspeed


class NoTokenizer:
    """A random model has no tokenizer; save_policy's call to write one writes nothing."""

    def save_pretrained(self, path) -> None:
        pass


def step_loss(model, packed: packing.Packed) -> torch.Tensor:
    """The GRPO loss of one micro-batch, π_old = π_θ (μ = 1) and π_ref a fixed offset of it, fixed rewards."""
    logprobs = grpo_loss.completion_logprobs(model, packed)  # (n, C)
    n = logprobs.shape[0]
    rewards = torch.arange(n, dtype=torch.float32, device=logprobs.device) % 3  # (n,)
    advantages = grpo_loss.group_advantages(rewards, n)
    reference = logprobs.detach() + 0.05 * token_weights(packed)
    loss, _ = grpo_loss.grpo_loss(logprobs, logprobs.detach(), reference, advantages, packed.completion_mask,
                                  total_sequences=float(n))
    return loss


def full_weights(engine, stage: int, lora_on: bool) -> dict[str, torch.Tensor]:
    """The weights a push sends (merged W + s·B·A with LoRA), every rank in step, on their device."""
    walk = lora.policy_weights if lora_on else iter_full_parameters
    return {name: tensor.clone() for name, tensor in walk(engine.module, stage)}


def trained(engine, stage: int) -> dict[str, torch.Tensor]:
    """Every trainable parameter, whole, as float32 on the CPU."""
    return {name: tensor.float().cpu() for name, tensor in iter_full_parameters(engine.module, stage)
            if "lora_" in name or not lora.is_lora(engine.module)}


def ds_engine(start, cfg: config.Config, stage: int):
    """A DeepSpeed engine of `cfg` at ZeRO-`stage` on a copy of `start`, as canoe.load_models makes it."""
    model = copy.deepcopy(start)
    ds = deepspeed_config(dataclasses.replace(cfg, zero_stage=stage), 1, next(model.parameters()).dtype, train=True)
    engine, *_ = deepspeed.initialize(model=model, config=ds,
                                      model_parameters=[p for p in model.parameters() if p.requires_grad])
    return engine


def ds_step(start, cfg: config.Config, stage: int, packed) -> tuple:
    """One step of a new engine: (engine, full gradients as float32 on the CPU, trainable weights after)."""
    engine = ds_engine(start, cfg, stage)
    engine.backward(step_loss(engine, packed))
    grads = {name: deepspeed.utils.safe_get_full_grad(p).float().cpu() for name, p in engine.module.named_parameters()
             if p.requires_grad}
    engine.step()
    return engine, grads, trained(engine, stage)


def plain_grads(start, packed, dtype: torch.dtype | None = None) -> dict[str, torch.Tensor]:
    """The loss's gradient without DeepSpeed, on a copy of `start` (cast to `dtype` if given), float32 on the CPU."""
    model = copy.deepcopy(start) if dtype is None else copy.deepcopy(start).to(dtype)
    step_loss(model, packed).backward()
    return {name: p.grad.float().cpu() for name, p in model.named_parameters() if p.requires_grad}


def adamw_step(before: dict, grads: dict, dtypes: dict, cfg: config.Config) -> dict[str, torch.Tensor]:
    """torch's AdamW on float32 master copies of `before` with `grads`, clipped at max_grad_norm, each result cast
    to its parameter's dtype as DeepSpeed's bfloat16 mode casts its master weights back."""
    names = sorted(before)
    masters = [before[name].clone().requires_grad_() for name in names]
    for master, name in zip(masters, names):
        master.grad = grads[name].clone()
    torch.nn.utils.clip_grad_norm_(masters, cfg.max_grad_norm)
    torch.optim.AdamW(masters, lr=cfg.learning_rate, betas=tuple(cfg.adam_betas), eps=1e-8,
                      weight_decay=cfg.weight_decay).step()
    return {name: master.detach().to(dtypes[name]).float() for master, name in zip(masters, names)}


def joined(values: dict[str, torch.Tensor], names) -> torch.Tensor:
    return torch.cat([values[name].reshape(-1) for name in names])


def check_stages(report: Report, start, cfg, packed, mode: str) -> None:
    """Each stage's full gradient against a plain model's (within the bfloat16 noise: the plain model against its
    float32 copy), its step against torch's AdamW on those gradients, then its sums and its save and load."""
    trainable = {name: p for name, p in start.named_parameters() if p.requires_grad}
    before = {name: p.detach().float().cpu() for name, p in trainable.items()}
    dtypes = {name: p.dtype for name, p in trainable.items()}
    names = sorted(before)
    plain = joined(plain_grads(start, packed), names)
    noise = relative(plain, joined(plain_grads(start, packed, torch.float32), names))
    for stage in (2, 3):
        engine, grads, after = ds_step(start, cfg, stage, packed)
        gap = relative(joined(grads, names), plain)
        report(f"deepspeed {mode} ZeRO-{stage}: full gradient vs a plain model (relative)", gap <= noise,
               f"{gap:.3g}, bf16 noise {noise:.3g}")
        expected = joined(adamw_step(before, grads, dtypes, cfg), names) - joined(before, names)
        gap = relative(joined(after, names) - joined(before, names), expected)
        report(f"deepspeed {mode} ZeRO-{stage}: the step vs torch's AdamW on its gradients (relative)",
               gap <= 1e-3, f"{gap:.3g} of |update| {float(expected.norm()):.3g}")
        check_sums(report, engine, stage, mode)
        check_save_load(report, engine, start, cfg, stage, packed, mode)
        del engine
        gc.collect()


def check_sums(report: Report, engine, stage: int, mode: str) -> None:
    """The WeightSums of the pushed weights on their device equal those of the same tensors copied to the CPU."""
    on_device, on_cpu = WeightSums(), WeightSums()
    weights = full_weights(engine, stage, mode == "lora")
    for name, tensor in weights.items():
        on_device.add(tensor, name)
        on_cpu.add(tensor.cpu(), name)
    where = next(iter(weights.values())).device.type
    report(f"deepspeed {mode} ZeRO-{stage}: WeightSums on {where} = on the CPU",
           (on_device.total, on_device.placed) == (on_cpu.total, on_cpu.placed),
           f"total {on_device.total} / {on_cpu.total}, placed {on_device.placed} / {on_cpu.placed}")


def check_save_load(report: Report, engine, start, cfg, stage: int, packed, mode: str) -> None:
    """save_checkpoint, a fresh engine from the starting weights load_checkpoint's it, one more step on both: equal
    bits; the policy folder, loaded by transformers, holds the pushed weights."""
    from transformers import AutoModelForCausalLM

    lora_on = mode == "lora"
    pushed = {name: tensor.cpu() for name, tensor in full_weights(engine, stage, lora_on).items()}
    with tempfile.TemporaryDirectory() as out:
        path = checkpoint.save_checkpoint(out, 1, engine=engine, tokenizer=NoTokenizer(), zero_stage=stage,
                                          trainer_state={"step": 1}, rank=0, keep=1)
        folder = AutoModelForCausalLM.from_pretrained(path / "policy", dtype=next(iter(pushed.values())).dtype)
        saved = dict(folder.named_parameters())
        policy_equal = all(torch.equal(saved[name].cpu(), tensor) for name, tensor in pushed.items())
        fresh = ds_engine(start, cfg, stage)
        state = checkpoint.load_checkpoint(path, engine=fresh, rank=0)
    with deterministic():
        for one in (engine, fresh):
            one.backward(step_loss(one, packed))
            one.step()
    a, b = trained(engine, stage), trained(fresh, stage)
    differing = sum(int((a[name] != b[name]).sum()) for name in a)
    report(f"deepspeed {mode} ZeRO-{stage}: save, load into a fresh engine, one more step each (deterministic)",
           policy_equal and differing == 0 and state == {"step": 1},
           f"{differing} of {sum(t.numel() for t in a.values())} trained values differ; policy folder "
           f"{'equal' if policy_equal else 'DIFFERS'} ({len(pushed)} tensors)")
    del fresh


@contextlib.contextmanager
def deterministic():
    """Kernels that give the same bits on the same inputs: torch's deterministic algorithms (a warning where an op
    has none) and the math attention kernel. The default kernel for a float mask on an H200 (cuDNN's) and the
    memory-efficient one accumulate their backward with atomics, so two equal engines could differ by rounding."""
    torch.use_deterministic_algorithms(True, warn_only=True)
    try:
        with sdpa_kernel(SDPBackend.MATH):
            yield
    finally:
        torch.use_deterministic_algorithms(False)


def check_deepspeed(report: Report, cfg: config.Config, arch, layers: int, scale: int, device) -> None:
    """`check_stages` with LoRA (the config's rank, else 16) and with full fine-tuning, in a world of one rank."""
    runtime.init_distributed()
    print(f"       deepspeed {deepspeed.__version__}, collective backend {dist.get_backend()}", flush=True)
    units = groups(arch.vocab, scale)
    packed = packing.pack(units, device)
    step_cfg = dataclasses.replace(cfg, learning_rate=STEP_LR, prompts_per_device=len(units))
    base = random_model(arch, layers, torch.bfloat16, device)
    lora_cfg = dataclasses.replace(step_cfg, lora_rank=cfg.lora_rank or 16)
    check_stages(report, with_adapters(copy.deepcopy(base), lora_cfg, b_scale=0.05), lora_cfg, packed, "lora")
    check_stages(report, base, dataclasses.replace(step_cfg, lora_rank=0), packed, "full")


# ----------------------------------------------------------------------------------------------------- 3. memory


def peak_activations(cfg: config.Config, arch, layers: int) -> tuple[float, float, int]:
    """MiB above the weights of one worst-case micro-batch's forward and backward, float32 adapters on a bfloat16
    base (gradient checkpointing as `cfg` says), and the plan's `activation_bytes` for the same shape."""
    model = random_model(arch, layers, torch.bfloat16, "cuda")
    model.config.use_cache = False
    if cfg.gradient_checkpointing:
        model.gradient_checkpointing_enable()
    model = lora.wrap(model, **cfg.lora_settings())
    assert all(p.dtype == torch.float32 for p in model.parameters() if p.requires_grad)
    packed = cuda_memory.micro_batch(cfg.prompts_per_device, cfg.max_prompt_tokens - 3, cfg.num_generations,
                                     cfg.max_completion_tokens, arch.vocab)
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    grpo_loss.completion_logprobs(model, packed).sum().backward()
    torch.cuda.synchronize()
    peak = torch.cuda.max_memory_allocated() - before
    shape = dataclasses.replace(cfg, max_prompt_tokens=cfg.max_prompt_tokens - 3)
    planned = memory_plan.activation_bytes(shape, dataclasses.replace(arch, layers=layers), 2)
    del model, packed
    gc.collect()
    torch.cuda.empty_cache()
    return peak / MIB, sum(planned.values()) / MIB, packed_tokens(shape)


def packed_tokens(cfg) -> int:
    return cfg.prompts_per_device * (cfg.max_prompt_tokens + cfg.num_generations * cfg.max_completion_tokens)


def check_memory(report: Report, default: config.Config) -> None:
    """The default run (its model, 24 layers, no checkpointing) and Llama-3.1-8B with LoRA (4 layers, with and
    without checkpointing): the measured peak within `MEMORY_BAND` of the plan."""
    llama_cfg = config.load_config(ROOT / "recipes" / "llama3.1-8b-lora.toml")
    llama = memory_plan.KNOWN_ARCHITECTURES["Llama-3.1-8B-Instruct"]
    cases = [("default model (24 layers), config.toml", default, cuda_memory.QWEN_05B, 24)]
    cases += [(f"Llama-3.1-8B (4 layers), llama3.1-8b-lora.toml, checkpointing {ckpt}",
               dataclasses.replace(llama_cfg, gradient_checkpointing=ckpt), llama, 4) for ckpt in (True, False)]
    for name, cfg, arch, layers in cases:
        measured, planned, L = peak_activations(cfg, arch, layers)
        low, high = MEMORY_BAND
        report(f"memory {name}, L = {L}: measured / plan in [{low}, {high}]", low <= measured / planned <= high,
               f"ratio {measured / planned:.3f}: {measured:,.0f} MiB measured, {planned:,.0f} MiB planned")


# ------------------------------------------------------------------------------------------------------ 4. merge


def check_merge(report: Report, cfg: config.Config, arch, layers: int, scale: int, device) -> None:
    """The default run's adapter (B at lr × steps, as Adam moves each entry by about lr a step) seen three ways, each
    as the update of log π over its own base: base + adapter (bfloat16 base, float32 adapters: training's π), the
    float32 merge W + s·B·A rounded to bfloat16, and run in float32 (the exact update u₃₂).
    Kept = ⟨u, u₃₂⟩ / |u₃₂|²."""
    model = with_adapters(random_model(arch, layers, torch.bfloat16, device), cfg,
                          b_scale=cfg.learning_rate * cfg.max_steps)
    packed = packing.pack(groups(arch.vocab, scale), device)
    keep = packed.completion_mask.bool()

    @torch.no_grad()
    def logprobs(net) -> torch.Tensor:
        return grpo_loss.completion_logprobs(net, packed)[keep].double()

    with lora.adapters_disabled(model):
        base16 = logprobs(model)
    trainer = logprobs(model)
    exact_model = copy.deepcopy(model).float()
    with lora.adapters_disabled(exact_model):
        base32 = logprobs(exact_model)
    merged = exact_model.merge_and_unload()  # W + s·B·A in float32
    merged32 = logprobs(merged)
    merged16 = logprobs(merged.to(torch.bfloat16))
    exact = merged32 - base32  # (tokens,) the update in float32

    def kept(update: torch.Tensor) -> float:
        return float(update @ exact) / float(exact @ exact)

    report("merge: base + adapter (training's π) keeps the update", abs(kept(trainer - base16) - 1) <= 0.25,
           f"kept {kept(trainer - base16):.3f} of the float32 update (RMS {float(exact.square().mean().sqrt()):.3g} "
           f"nats)")
    report("merge: float32 merge run in bfloat16 keeps no more than base + adapter",
           kept(merged16 - base16) <= kept(trainer - base16) + 0.05, f"kept {kept(merged16 - base16):.3f}")
    gap, noise = float((merged32 - trainer).abs().max()), float((base32 - base16).abs().max())
    report("merge: float32 merge run in float32 vs base + adapter (max |Δ|)", gap <= 2 * noise,
           f"{gap:.3g} nats, bf16 noise {noise:.3g}")


# ------------------------------------------------------------------------------------------------------- the run


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cpu", action="store_true", help="a tiny model on the CPU: default and math kernels, "
                        "the collective backend DeepSpeed picks there (gloo), no memory check")
    parser.add_argument("--layers", type=int, default=4, help="layers of the default model's shape (GPU)")
    parser.add_argument("--only", default="packing,deepspeed,memory,merge", help="comma-separated checks")
    parser.add_argument("--break-mask", action="store_true", help="pack with a plain causal mask (`causal_only`): "
                        "the packing checks must fail")
    args = parser.parse_args(argv)
    cuda = torch.cuda.is_available() and not args.cpu
    if not cuda and not args.cpu:
        parser.error("no CUDA GPU: run with --cpu for the CPU subset")
    import peft
    import transformers

    device = "cuda" if cuda else "cpu"
    arch, layers, scale = (cuda_memory.QWEN_05B, args.layers, 15) if cuda else (TINY, TINY.layers, 1)
    print(f"       torch {torch.__version__}, transformers {transformers.__version__}, peft {peft.__version__} "
          f"imported; {torch.cuda.get_device_name() if cuda else 'CPU'}", flush=True)
    cfg = config.load_config(ROOT / "config.toml")
    if args.break_mask:
        packing.Packed.allowed = property(causal_only)
    report, only = Report(), args.only.split(",")
    backends = ("default", "efficient", "math") if cuda else ("default", "math")
    parts = {"packing": lambda: check_packing(report, cfg, arch, layers, scale, backends, device),
             "merge": lambda: check_merge(report, cfg, arch, layers, scale, device),
             "memory": lambda: check_memory(report, cfg) if cuda else print("SKIP  memory: needs CUDA's allocator "
                                                                            "counters", flush=True),
             "deepspeed": lambda: check_deepspeed(report, cfg, arch, layers, scale, device)}
    if set(only) - set(parts):
        parser.error(f"--only: unknown {sorted(set(only) - set(parts))}; the checks are {list(parts)}")
    for name in (name for name in parts if name in only):
        try:  # one run on a device must report every part: a part that raises is a failure, the next one runs
            parts[name]()
        except Exception:
            traceback.print_exc()
            report(f"{name}: raised", False, traceback.format_exc().strip().splitlines()[-1])
    print(f"{len(report.failed)} failed" + (f": {'; '.join(report.failed)}" if report.failed else ""), flush=True)
    return 1 if report.failed else 0


if __name__ == "__main__":
    try:
        code = main()
    except Exception:
        stopped("gpu_check, outside its checks")
    runtime.leave_process_group()  # the DeepSpeed check joined a world of one
    sys.exit(code)
