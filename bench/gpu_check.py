"""On one CUDA GPU: what the CPU suite cannot show, checked in one run of a few minutes. One line per check, its
figure and PASS or FAIL; the exit status is 1 if any check failed.

1. packing: the packed micro-batch's log-probabilities and LoRA gradients (`grpo_loss.completion_logprobs` over
   `training/packing.py`'s mask) against each sequence scored alone, under torch's default attention kernel, the
   memory-efficient one and the math one; bfloat16 base, float32 adapters, L not a multiple of 8. The tolerance is
   the dtype's own noise, measured once on the math kernel rather than on each kernel under test (one that misread
   the mask would widen its own bound): twice the gap between the sequences alone under the math kernel in
   bfloat16 and the same in float32.
2. deepspeed: `training/optimizer.deepspeed_config` under ZeRO-2 and ZeRO-3, with LoRA and with full fine-tuning,
   each line in its own try: the first step's full gradient against a plain model's (within the bfloat16 noise:
   the plain model against its float32 copy); two optimizer steps against torch's AdamW on float32 master copies
   with the same gradients, betas and weight decay off their defaults and clipping that binds at the first step
   only, so that a config that lost the betas, the weight decay or the clipping lands elsewhere (the next line
   shows by how much: each at least ten times the tolerance); the `WeightSums` of the weights a push sends
   (`weight_sync.iter_full_parameters`, `lora.policy_weights`), on the device, against the same definition
   summed apart on the CPU in Python integers, and against the same weights with one value one step off (the sums
   must move by exactly that step) and two layers' matrices swapped (the placed sum must change); the checkpoint's
   policy folder against what vLLM holds after training's push (`training/push.WeightPush`, its weight-sums check
   included, into a stand-in engine that loaded the starting model and records what each reload sends: no probe,
   which needs vLLM's forward); `plumbing/checkpoint.py`'s save and load (a fresh engine loads the checkpoint, both
   take one more step under torch's deterministic algorithms and the math attention kernel: equal bits).
   A world of one rank: NCCL's (or gloo's) collectives move nothing and ZeRO keeps every partition whole, so these
   lines cannot show the reduce-scatter of gradients, ZeRO-3's all-gather of a partitioned layer, optimizer state
   split over ranks or NCCL between GPUs; the output says so where DeepSpeed starts.
3. memory: `torch.cuda.max_memory_allocated()` of one worst-case micro-batch's forward and backward with the
   adapters in float32 as training holds them (no DeepSpeed bf16 mode with LoRA), within `MEMORY_BAND` of
   `memory_plan.activation_bytes` of the same shape; the ratio is printed either way, to calibrate the plan.
4. merge: the default run's LoRA update (log π with it less log π without) seen by base + adapter (as training
   computes π), by the float32 merge run in bfloat16 (vLLM loading a merged checkpoint at the config's dtype) and
   run in float32 (the exact update): base + adapter keeps the exact update to within a quarter, the bfloat16 run
   of the merge keeps no more than base + adapter, the float32 run is within twice the bfloat16 noise of it.

The checks of the checks, each on the CPU in tests/test_gpu_check.py: `--break-mask` (a plain causal mask) must fail
the packing lines; `--break-step betas|decay|clip` (DeepSpeed's config loses that setting) the two-step line;
`--break-sums` (WeightSums over the values in float32) both sums lines; `--break-policy` (a LoRA policy folder
saved as its base, the update left out) the policy line. `--deepspeed MODES:STAGES` runs part of the DeepSpeed part.

Random weights from a config (models/ is not carried: the default model alone is ~1 GB): the default model's shape
with fewer layers (`--layers`), Llama-3.1-8B's for the memory check; initializer_range 2/√h so that the mask's
mistakes show in the log-probabilities. The GPU machine has torch but no vLLM: a stand-in answers `import vllm`
(`_NoVllm`: modules whose `__file__` is None and whose other names raise if called); no check calls one. What else
the run imports and the machine lacks travels as the wheels of bench/gpu_wheels.txt; docs/gpus.md, "The first
device run", gives the commands, the time and what each line means.

The first line gives the versions the run found (Python, torch, transformers, PEFT, huggingface-hub, tokenizers,
safetensors), before anything is imported; an import that fails, or an error outside the checks, ends the run with
a FAIL line that names it. Each check runs in its own try: one that raises is a FAIL and the next one runs (a check
that needs what raised is a FAIL line "not run").

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


def _dunder(attribute: str) -> bool:
    return attribute.startswith("__") and attribute.endswith("__")


class _Absent:
    """A name vLLM would provide: importable, raises if used."""

    def __init__(self, name: str):
        self.name = name

    def __call__(self, *args, **kwargs):
        raise RuntimeError(f"{self.name}: vLLM is not installed here, and gpu_check calls no vLLM code")

    def __getattr__(self, attribute: str) -> _Absent:
        if _dunder(attribute):  # asked of any object by introspection (inspect, copy, pickle): not vLLM's
            raise AttributeError(attribute)
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
        module.__file__ = None  # no file: `inspect.getmodule` walks sys.modules and reads every module's __file__

        def absent(attribute: str) -> _Absent:
            if _dunder(attribute):
                raise AttributeError(f"module {spec.name!r} has no attribute {attribute!r}")
            return _Absent(f"{spec.name}.{attribute}")

        module.__getattr__ = absent
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
    from training.push import WeightPush
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


class Report:
    """One line per check: PASS or FAIL, its name, its figure."""

    def __init__(self):
        self.failed: list[str] = []

    def __call__(self, name: str, ok: bool, figure: str) -> None:
        print(f"{'PASS' if ok else 'FAIL'}  {name}: {figure}", flush=True)
        if not ok:
            self.failed.append(name)

    def attempt(self, name: str, work, *args):
        """`work(*args)` in its own try: what it returns, or None after a FAIL line `NAME: raised` (its traceback
        above it), so that one check that raises leaves the next one to run."""
        try:
            return work(*args)
        except Exception:
            traceback.print_exc()
            self(f"{name}: raised", False, traceback.format_exc().strip().splitlines()[-1])
            return None

    def not_run(self, names: list[str], why: str) -> None:
        """A FAIL line for each check that needs what `why` names, which raised above."""
        for name in names:
            self(name, False, f"not run: {why} raised")


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
    """Packed against alone, per backend, within twice the bfloat16 noise. The noise is the math kernel's (alone in
    bfloat16 against alone in float32), not the kernel's under test: a kernel that misread the mask would otherwise
    widen its own bound."""
    model = with_adapters(random_model(arch, layers, torch.bfloat16, device), cfg, b_scale=0.05)
    units = groups(arch.vocab, scale)
    L = packing.pack(units, device).num_tokens
    alone = [[(prompt, [c])] for prompt, completions in units for c in completions]

    def bf16_noise() -> tuple[float, float]:
        reference = logprobs_and_grads(copy.deepcopy(model).float(), alone, "math", device)
        single = logprobs_and_grads(model, alone, "math", device)
        return float((single[0] - reference[0]).abs().max()), relative(single[1], reference[1])

    names = [(f"packing {backend}: log π packed vs alone (L = {L}, max |Δ|)",
              f"packing {backend}: LoRA gradient packed vs alone (relative)") for backend in backends]
    noise = report.attempt("packing: the bfloat16 noise (math kernel, bfloat16 vs float32)", bf16_noise)
    if noise is None:
        report.not_run([name for pair in names for name in pair], "the bfloat16 noise")
        return

    def compare(backend: str, name_logprobs: str, name_grads: str) -> None:
        single = logprobs_and_grads(model, alone, backend, device)
        packed = logprobs_and_grads(model, [units], backend, device)
        gap = (float((packed[0] - single[0]).abs().max()), relative(packed[1], single[1]))
        report(name_logprobs, L % 8 != 0 and gap[0] <= 2 * noise[0],
               f"{gap[0]:.3g} nats, math kernel's bf16 noise {noise[0]:.3g}")
        report(name_grads, gap[1] <= 2 * noise[1], f"{gap[1]:.3g}, math kernel's bf16 noise {noise[1]:.3g}")

    for backend, (name_logprobs, name_grads) in zip(backends, names):
        report.attempt(f"packing {backend}", compare, backend, name_logprobs, name_grads)


# -------------------------------------------------------------------------------------------------- 2. deepspeed

# The optimizer of the step check: lr above the bfloat16 spacing of every weight below 1 (2⁻⁸ at 1), so that each
# step shows in bfloat16 weights, and betas and weight decay off every default, so that a DeepSpeed config that
# dropped one would run another AdamW. Clipping is set per run to bind at the first step only (`clipped_once`).
STEP_LR = 1e-2
STEP_BETAS = (0.5, 0.7)
STEP_DECAY = 0.5
STEP_TOLERANCE = 1e-3  # of the update's norm: DeepSpeed's two steps against torch's AdamW on the same gradients
# What a DeepSpeed config that lost one setting would run (DeepSpeed's defaults: torch's betas, no weight decay,
# `gradient_clipping` 0 = off): each must move the two steps by at least POWER × STEP_TOLERANCE, or the step check
# could not see it lost.
WRONG = {"betas (0.9, 0.999)": {"betas": (0.9, 0.999)}, "no weight decay": {"weight_decay": 0.0},
         "no clipping": {"max_norm": 0.0}}
POWER = 10
# `--break-step`: the DeepSpeed config with one setting as `WRONG` has it (the step lines must then fail).
BREAKS = {"betas": lambda ds: ds["optimizer"]["params"].update(betas=[0.9, 0.999]),
          "decay": lambda ds: ds["optimizer"]["params"].update(weight_decay=0.0),
          "clip": lambda ds: ds.update(gradient_clipping=0.0)}
BROKEN_STEP: list[str] = []
BITS = {2: torch.int16, 4: torch.int32}  # a float's bits as the signed integer of its width


class NoTokenizer:
    """A random model has no tokenizer; save_policy's call to write one writes nothing."""

    def save_pretrained(self, path) -> None:
        pass


def step_loss(model, packed: packing.Packed, scale: float = 1.0) -> torch.Tensor:
    """`scale` × the GRPO loss of one micro-batch, π_old = π_θ (μ = 1) and π_ref a fixed offset of it, fixed
    rewards."""
    logprobs = grpo_loss.completion_logprobs(model, packed)  # (n, C)
    n = logprobs.shape[0]
    rewards = torch.arange(n, dtype=torch.float32, device=logprobs.device) % 3  # (n,)
    advantages = grpo_loss.group_advantages(rewards, n)
    reference = logprobs.detach() + 0.05 * token_weights(packed)
    loss, _ = grpo_loss.grpo_loss(logprobs, logprobs.detach(), reference, advantages, packed.completion_mask,
                                  total_sequences=float(n))
    return scale * loss


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
    for name in BROKEN_STEP:
        BREAKS[name](ds)
    engine, *_ = deepspeed.initialize(model=model, config=ds,
                                      model_parameters=[p for p in model.parameters() if p.requires_grad])
    return engine


def ds_steps(start, cfg: config.Config, stage: int, batches) -> tuple:
    """Optimizer steps of a new engine, one per (micro-batch, loss scale) of `batches`: (engine, each step's full
    gradients as float32 on the CPU, trainable weights after)."""
    engine = ds_engine(start, cfg, stage)
    grads = []
    for packed, scale in batches:
        engine.backward(step_loss(engine, packed, scale))
        grads.append({name: deepspeed.utils.safe_get_full_grad(p).float().cpu()
                      for name, p in engine.module.named_parameters() if p.requires_grad})
        engine.step()
    return engine, grads, trained(engine, stage)


def plain_grads(start, packed, dtype: torch.dtype | None = None, scale: float = 1.0) -> dict[str, torch.Tensor]:
    """The loss's gradient without DeepSpeed, on a copy of `start` (cast to `dtype` if given), float32 on the CPU."""
    model = copy.deepcopy(start) if dtype is None else copy.deepcopy(start).to(dtype)
    step_loss(model, packed, scale).backward()
    return {name: p.grad.float().cpu() for name, p in model.named_parameters() if p.requires_grad}


def norm(grads: dict[str, torch.Tensor]) -> float:
    return float(torch.cat([g.reshape(-1) for g in grads.values()]).norm())


def clipped_once(start, cfg: config.Config, packed: list[packing.Packed]) -> tuple[config.Config, list]:
    """`cfg` with a clipping threshold that binds at the first of two steps and not at the second, and the two
    (micro-batch, loss scale): the second batch's loss scaled to a quarter of the first's gradient norm, the
    threshold at half of it. Two gradients of unequal direction and norm make the second step depend on β₁, β₂ and
    the clipping, which the first step's update, lr · g / |g|, does not."""
    first, second = norm(plain_grads(start, packed[0])), norm(plain_grads(start, packed[1]))
    return dataclasses.replace(cfg, max_grad_norm=first / 2), [(packed[0], 1.0), (packed[1], first / (4 * second))]


def adamw_steps(before: dict, grads: list[dict], dtypes: dict, *, lr: float, betas, weight_decay: float,
                max_norm: float) -> dict[str, torch.Tensor]:
    """torch's AdamW on float32 master copies of `before`, one step per gradient of `grads`, each clipped at
    `max_norm` (0: not clipped) first; the results cast to each parameter's dtype, as DeepSpeed's bfloat16 mode
    casts its master weights back."""
    names = sorted(before)
    masters = [before[name].clone().requires_grad_() for name in names]
    optimizer = torch.optim.AdamW(masters, lr=lr, betas=tuple(betas), eps=1e-8, weight_decay=weight_decay)
    for step in grads:
        for master, name in zip(masters, names):
            master.grad = step[name].clone()
        if max_norm > 0:
            torch.nn.utils.clip_grad_norm_(masters, max_norm)
        optimizer.step()
    return {name: master.detach().to(dtypes[name]).float() for master, name in zip(masters, names)}


def joined(values: dict[str, torch.Tensor], names) -> torch.Tensor:
    return torch.cat([values[name].reshape(-1) for name in names])


def check_step(report: Report, names: tuple[str, str], cfg, before: dict, grads: list[dict], after: dict,
               dtypes: dict) -> None:
    """DeepSpeed's two steps against torch's AdamW on the same gradients, within STEP_TOLERANCE of the update; and
    the check's power: AdamW with each of `WRONG`'s settings must land at least POWER × STEP_TOLERANCE away, with
    the clipping binding at the first step and not at the second."""
    order = sorted(before)
    origin = joined(before, order)
    settings = {"lr": cfg.learning_rate, "betas": tuple(cfg.adam_betas), "weight_decay": cfg.weight_decay,
                "max_norm": cfg.max_grad_norm}

    def update(**changed) -> torch.Tensor:
        return joined(adamw_steps(before, grads, dtypes, **(settings | changed)), order) - origin

    expected = update()
    gap = relative(joined(after, order) - origin, expected)
    report(names[0], gap <= STEP_TOLERANCE, f"{gap:.3g} of |update| {float(expected.norm()):.3g}, tolerance "
           f"{STEP_TOLERANCE:g}")
    moves = {what: relative(update(**changed), expected) for what, changed in WRONG.items()}
    norms = [norm(step) for step in grads]
    binds = norms[0] > cfg.max_grad_norm > norms[1]
    report(names[1], binds and min(moves.values()) >= POWER * STEP_TOLERANCE,
           ", ".join(f"{what} {move:.3g}" for what, move in moves.items())
           + f" (each ≥ {POWER * STEP_TOLERANCE:g}); |g| {norms[0]:.3g} then {norms[1]:.3g}, clipped at "
           f"{cfg.max_grad_norm:.3g} ({'first step only' if binds else 'NOT the first step only'})")


def exact_sums(weights: dict[str, torch.Tensor]) -> tuple[int, int]:
    """WeightSums' (total, placed) by their definition, computed apart from it on the CPU: each tensor's bits
    widened to int64, times c_j = 1 + j mod 97 per column, summed in blocks of rows that cannot overflow and added
    up as Python integers (no int32 partial sums, no split into halves, no device kernel)."""
    total = placed = 0
    for name, tensor in weights.items():
        bits = tensor.detach().cpu().contiguous().view(BITS[tensor.element_size()]).long()
        matrix = bits.reshape(-1, bits.shape[-1]) if bits.dim() >= 2 else bits.reshape(1, -1)
        columns = 1 + torch.arange(matrix.shape[1]) % 97
        for block in matrix.split(max(1, 2**24 // matrix.shape[1])):  # |bits · c| < 2³⁸: a block sums below 2⁶²
            total += int(block.sum())
            if tensor.dim() >= 2:
                placed += (1 + WeightSums.layer_of(name)) * int((block * columns).sum())
    return total, placed


def weight_sums(weights: dict[str, torch.Tensor]) -> WeightSums:
    sums = WeightSums()
    for name, tensor in weights.items():
        sums.add(tensor, name)
    return sums


def check_sums_exact(report: Report, name: str, weights: dict[str, torch.Tensor]) -> None:
    """The push's WeightSums, on the weights' device, equal `exact_sums` of the same bits."""
    sums, exact = weight_sums(weights), exact_sums(weights)
    report(name, (sums.total, sums.placed) == exact, f"total {sums.total} / {exact[0]}, placed {sums.placed} / "
           f"{exact[1]} ({len(weights)} tensors)")


def check_sums_see(report: Report, name: str, weights: dict[str, torch.Tensor]) -> None:
    """The WeightSums of the pushed weights with one value one step of its dtype up (its bits + 1, at row 1 and
    column 5 of a layer-0 matrix) move by exactly (1, 1 + 5) — total, placed — and with that matrix and layer 1's
    swapped keep their total and change their placed sum."""
    matrix = next(key for key, tensor in weights.items()
                  if tensor.dim() == 2 and ".layers.0." in key and key.replace(".layers.0.", ".layers.1.") in weights)
    twin = matrix.replace(".layers.0.", ".layers.1.")
    nudged, swapped = dict(weights), dict(weights)
    nudged[matrix] = weights[matrix].clone()
    nudged[matrix].view(BITS[nudged[matrix].element_size()])[1, 5] += 1
    swapped[matrix], swapped[twin] = weights[twin], weights[matrix]
    sums, one, two = weight_sums(weights), weight_sums(nudged), weight_sums(swapped)
    moved = (one.total - sums.total, one.placed - sums.placed)
    report(name, moved == (1, 6) and two.total == sums.total and two.placed != sums.placed,
           f"one value one step up: total, placed moved by {moved} (exactly (1, 6)); {matrix.split('.layers.0.')[1]}"
           f" of layers 0 and 1 swapped: total {'kept' if two.total == sums.total else 'CHANGED'}, placed "
           f"{'changed' if two.placed != sums.placed else 'UNCHANGED'}")


class HeldWeights:
    """vLLM's engine as a push reaches it: the weights it holds by Hugging Face name, as it holds them (cast to its
    dtype; here on the CPU), which a reload replaces by name; a function sent to its workers (the engine's weight
    sums, the CPU kernels' repacking) runs on this one stand-in worker. No forward: the push's probe is left out."""

    packed_modules_mapping: dict = {}  # no fused modules: the names are the trainer's

    def __init__(self, weights, dtype: torch.dtype):
        self.dtype = dtype
        self.held = {name: tensor.detach().to("cpu", dtype, copy=True) for name, tensor in weights}
        self.model_runner = types.SimpleNamespace(model=self)

    def collective_rpc(self, method, kwargs=None):
        if method == "reload_weights":
            for name, tensor in kwargs["weights_iterator"]:
                if name not in self.held:
                    raise KeyError(f"the push sent {name}, which the engine does not hold")
                self.held[name] = tensor.detach().to("cpu", self.dtype, copy=True)
            return [None]
        return [method(self, **(kwargs or {}))]

    def reset_prefix_cache(self) -> None:
        pass

    def named_parameters(self):
        return iter(self.held.items())

    def modules(self):
        return iter(())


class ProbelessPush(WeightPush):
    """training/push.py's push as training makes it, without the probe, which needs vLLM's forward."""

    def check_probe(self, engine, sums_said: str) -> dict[str, float]:
        return {}


def pushed_into_engine(engine, start, cfg, stage: int, lora_on: bool, folder: Path) -> dict[str, torch.Tensor]:
    """What vLLM holds after training's push of `engine`'s weights (`WeightPush`, merged pushes with LoRA, awake:
    only what training changes is sent) into an engine that loaded the starting model's folder (W, the adapters
    left out); the push's own weight-sums check runs and raises if what it sent did not land."""
    initial = lora.base_weights(start, 0) if lora_on else iter_full_parameters(start, 0)
    dtype = next(start.parameters()).dtype  # the base's: the config's dtype, vLLM's
    held = HeldWeights(initial, dtype)
    push = ProbelessPush.create(dataclasses.replace(cfg, zero_stage=stage), held, ([], []), dtype, adapter=False,
                                sleep=False, folder=folder)
    push(engine, asleep=False)
    return held.held


def check_policy(report: Report, name: str, path: Path, held: dict[str, torch.Tensor]) -> None:
    """The checkpoint's policy folder, loaded by transformers in the engine's dtype, holds every weight the engine
    holds after a push, bit for bit, and no other."""
    from transformers import AutoModelForCausalLM

    dtype = next(iter(held.values())).dtype
    saved = dict(AutoModelForCausalLM.from_pretrained(path / "policy", dtype=dtype).named_parameters())
    differing = sorted(key for key in held if key not in saved or not torch.equal(saved[key], held[key]))
    extra = sorted(set(saved) - set(held))
    report(name, not differing and not extra,
           f"{len(held) - len(differing)} of {len(held)} tensors equal" + (f"; differing: {differing[:3]}" if differing
                                                                           else "")
           + (f"; only in the folder: {extra[:3]}" if extra else ""))


def check_resume(report: Report, name: str, engine, path: Path, start, cfg, stage: int, packed) -> None:
    """A fresh engine from the starting weights load_checkpoint's `path`; one more step on both, under torch's
    deterministic algorithms and the math attention kernel: equal bits."""
    fresh = ds_engine(start, cfg, stage)
    state = checkpoint.load_checkpoint(path, engine=fresh, rank=0)
    with deterministic():
        for one in (engine, fresh):
            one.backward(step_loss(one, packed))
            one.step()
    a, b = trained(engine, stage), trained(fresh, stage)
    differing = sum(int((a[key] != b[key]).sum()) for key in a)
    report(name, differing == 0 and state == {"step": 2},
           f"{differing} of {sum(t.numel() for t in a.values())} trained values differ, trainer state {state}")


def float_sums(self: WeightSums, tensor: torch.Tensor, name: str = "") -> None:
    """`--break-sums`: WeightSums.add as a checksum written carelessly would be: the values, not their bits, summed
    in float32 per column, then weighted as `add` weights them and truncated to integers."""
    values = tensor.detach().float()
    matrix = values.reshape(-1, values.shape[-1]) if values.dim() >= 2 else values.reshape(1, -1)
    columns = matrix.sum(dim=0)
    self.total += int(columns.sum())
    if tensor.dim() >= 2:
        weights = 1 + torch.arange(matrix.shape[1], device=matrix.device) % 97
        self.placed += (1 + self.layer_of(name)) * int((columns * weights).sum())


def policy_without_update(save_policy):
    """`--break-policy`: checkpoint.save_policy, then a LoRA policy folder rewritten with the base's W in place of
    W + s·B·A (the adapter's update left out of what `--eval` loads); full fine-tuning's folder is left as it is."""

    def broken(engine, tokenizer, zero_stage: int, target: Path, rank: int) -> None:
        save_policy(engine, tokenizer, zero_stage, target, rank)
        if lora.is_lora(engine.module):
            state = {name: tensor.detach().to("cpu") for name, tensor in lora.base_weights(engine.module, zero_stage)}
            engine.module.get_base_model().save_pretrained(target, state_dict=state)

    return broken


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


def check_stages(report: Report, start, cfg, packed: list[packing.Packed], mode: str, stages=(2, 3)) -> None:
    """At ZeRO-2 and ZeRO-3, each line in its own try: the first step's full gradient against a plain model's
    (within the bfloat16 noise: the plain model against its float32 copy), two steps against torch's AdamW on their
    gradients and that check's power, the pushed weights' sums against an exact sum and against two perturbations,
    the saved policy folder against what a push leaves in vLLM, and save and load."""
    lora_on = mode == "lora"
    trainable = {name: p for name, p in start.named_parameters() if p.requires_grad}
    before = {name: p.detach().float().cpu() for name, p in trainable.items()}
    dtypes = {name: p.dtype for name, p in trainable.items()}
    order = sorted(before)
    for stage in stages:
        prefix = f"deepspeed {mode} ZeRO-{stage}"
        lines = {"gradient": f"{prefix}: full gradient vs a plain model (relative)",
                 "step": f"{prefix}: two steps vs torch's AdamW on their gradients (relative)",
                 "power": f"{prefix}: AdamW with a setting lost lands away from the two steps (relative)",
                 "exact": f"{prefix}: WeightSums of the pushed weights = their exact integer sums",
                 "see": f"{prefix}: WeightSums see one value one step off and two layers' matrices swapped",
                 "policy": f"{prefix}: the saved policy folder = what vLLM holds after a push",
                 "resume": f"{prefix}: save, load into a fresh engine, one more step each (deterministic)"}
        setup = report.attempt(f"{prefix}: two steps with clipping at the first", clipped_once, start, cfg, packed)
        ran = setup and report.attempt(f"{prefix}: two steps of a DeepSpeed engine", ds_steps, start, setup[0], stage,
                                       setup[1])
        if not ran:
            report.not_run(list(lines.values()), "the engine's two steps")
            continue
        (step_cfg, batches), (engine, grads, after) = setup, ran

        def gradient():
            plain = joined(plain_grads(start, batches[0][0]), order)
            noise = relative(plain, joined(plain_grads(start, batches[0][0], torch.float32), order))
            gap = relative(joined(grads[0], order), plain)
            report(lines["gradient"], gap <= noise, f"{gap:.3g}, bf16 noise {noise:.3g}")

        report.attempt(lines["gradient"], gradient)
        report.attempt(lines["step"], check_step, report, (lines["step"], lines["power"]), step_cfg, before, grads,
                       after, dtypes)
        weights = report.attempt(f"{prefix}: the pushed weights", full_weights, engine, stage, lora_on)
        if weights is None:
            report.not_run([lines["exact"], lines["see"]], "the pushed weights")
        else:
            where = next(iter(weights.values())).device.type
            report.attempt(lines["exact"], check_sums_exact, report, f"{lines['exact']} ({where})", weights)
            report.attempt(lines["see"], check_sums_see, report, lines["see"], weights)
            del weights
        with tempfile.TemporaryDirectory() as out:
            path = report.attempt(f"{prefix}: save_checkpoint", lambda: checkpoint.save_checkpoint(
                out, 2, engine=engine, tokenizer=NoTokenizer(), zero_stage=stage, trainer_state={"step": 2}, rank=0,
                keep=1))
            held = report.attempt(f"{prefix}: a push into a stand-in engine", pushed_into_engine, engine, start,
                                  step_cfg, stage, lora_on, Path(out) / "adapter-pushes")
            if path is None or held is None:
                report.not_run([lines["policy"]], "the checkpoint or the push")
            else:
                report.attempt(lines["policy"], check_policy, report, lines["policy"], path, held)
            if path is None:
                report.not_run([lines["resume"]], "the checkpoint")
            else:
                report.attempt(lines["resume"], check_resume, report, lines["resume"], engine, path, start, step_cfg,
                               stage, batches[0][0])
        del engine
        gc.collect()


def check_deepspeed(report: Report, cfg: config.Config, arch, layers: int, scale: int, device,
                    modes=("lora", "full"), stages=(2, 3)) -> None:
    """`check_stages` with LoRA (the config's rank, else 16) and with full fine-tuning, in a world of one rank."""
    runtime.init_distributed()
    world = dist.get_world_size()
    print(f"       deepspeed {deepspeed.__version__}, collective backend {dist.get_backend()}, world of {world}"
          + (": its collectives move nothing and ZeRO keeps every partition whole, so no line below shows the "
             "reduce-scatter of gradients, ZeRO-3's all-gather of a partitioned layer, optimizer state split over "
             "ranks or NCCL between GPUs" if world == 1 else ""), flush=True)
    units = groups(arch.vocab, scale)
    packed = [packing.pack(units, device), packing.pack(groups(arch.vocab, scale, seed=5), device)]
    step_cfg = dataclasses.replace(cfg, learning_rate=STEP_LR, adam_betas=list(STEP_BETAS), weight_decay=STEP_DECAY,
                                   prompts_per_device=len(units))
    base = random_model(arch, layers, torch.bfloat16, device)
    lora_cfg = dataclasses.replace(step_cfg, lora_rank=cfg.lora_rank or 16)
    if "lora" in modes:
        check_stages(report, with_adapters(copy.deepcopy(base), lora_cfg, b_scale=0.05), lora_cfg, packed, "lora",
                     stages)
    if "full" in modes:
        check_stages(report, base, dataclasses.replace(step_cfg, lora_rank=0), packed, "full", stages)


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
    def case(name: str, cfg: config.Config, arch, layers: int) -> None:
        measured, planned, L = peak_activations(cfg, arch, layers)
        low, high = MEMORY_BAND
        report(f"memory {name}, L = {L}: measured / plan in [{low}, {high}]", low <= measured / planned <= high,
               f"ratio {measured / planned:.3f}: {measured:,.0f} MiB measured, {planned:,.0f} MiB planned")

    for name, cfg, arch, layers in cases:  # each in its own try: one that runs out of memory leaves the next
        report.attempt(f"memory {name}", case, name, cfg, arch, layers)


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
    parser.add_argument("--deepspeed", default="lora,full:2,3", help="the DeepSpeed part's modes and ZeRO stages, "
                        "MODES:STAGES")
    parser.add_argument("--break-mask", action="store_true", help="pack with a plain causal mask (`causal_only`): "
                        "the packing checks must fail")
    parser.add_argument("--break-step", default="", help=f"comma-separated, of {list(BREAKS)}: DeepSpeed's config "
                        "loses that AdamW setting (`BREAKS`): the two-step lines must fail")
    parser.add_argument("--break-sums", action="store_true", help="WeightSums sum the values in float32, not their "
                        "bits as integers (`float_sums`): the two WeightSums lines must fail")
    parser.add_argument("--break-policy", action="store_true", help="a LoRA policy folder saved as its base, the "
                        "update left out (`policy_without_update`): the LoRA policy folder lines must fail")
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
    BROKEN_STEP.extend(name for name in args.break_step.split(",") if name)
    if set(BROKEN_STEP) - set(BREAKS):
        parser.error(f"--break-step: unknown {sorted(set(BROKEN_STEP) - set(BREAKS))}; they are {list(BREAKS)}")
    if args.break_sums:
        WeightSums.add = float_sums
    if args.break_policy:
        checkpoint.save_policy = policy_without_update(checkpoint.save_policy)
    report, only = Report(), args.only.split(",")
    backends = ("default", "efficient", "math") if cuda else ("default", "math")
    parts = {"packing": lambda: check_packing(report, cfg, arch, layers, scale, backends, device),
             "merge": lambda: check_merge(report, cfg, arch, layers, scale, device),
             "memory": lambda: check_memory(report, cfg) if cuda else print("SKIP  memory: needs CUDA's allocator "
                                                                            "counters", flush=True),
             "deepspeed": lambda: check_deepspeed(report, cfg, arch, layers, scale, device, modes.split(","),
                                                  [int(stage) for stage in stages.split(",")])}
    modes, _, stages = args.deepspeed.partition(":")
    if set(modes.split(",")) - {"lora", "full"} or set(stages.split(",")) - {"2", "3"}:
        parser.error(f"--deepspeed {args.deepspeed}: MODES of lora, full; STAGES of 2, 3")
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
