"""The run's settings: a TOML file (stdlib tomllib) read into a frozen dataclass whose fields carry their meaning.

    python canoe.py --describe-config     # every key, its default and what it means

Unknown keys, wrong types and values out of range are errors that name the key (and suggest the closest known
one). Rewards and their weights are one table (`[rewards]`, a `name = weight` line each); a reward idea in a file of
its own is loaded only for the configs that name the file in `reward_files` (`known_rewards`). A recipe names the
config it varies with `base` (a path relative to the recipe) and writes only the keys it changes; a table such as
`[rewards]`, if given, replaces the base's whole:

    base = "../config.toml"
    output_dir = "runs/variant"
    num_iterations = 2
"""

from __future__ import annotations

import dataclasses
import difflib
import hashlib
import importlib.util
import json
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from data import OVERFLOW_RULES, SYSTEM_PROMPT
from grpo_loss import ADVANTAGE_STDS
from rewards import REWARD_FUNCS
from variants import ADVANTAGE_RULES, AGGREGATIONS, RATIO_LEVELS

CANOE_REWARDS = {"accuracy": 1.0, "format": 1.0, "influence": 1.0, "length": 1.0}
# Every linear layer of a Llama/Qwen2 decoder block: attention and MLP ("LoRA Without Regret": adapters on the MLP
# matter most).
LORA_TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def _key(default: Any, help: str) -> Any:
    if isinstance(default, (list, dict)):  # mutable defaults: a fresh copy per Config
        return field(default_factory=lambda: type(default)(default), metadata={"help": help})
    return field(default=default, metadata={"help": help})


@dataclass(frozen=True)
class Config:
    """Every setting of a run; each field's help is what `--describe-config` prints.

    The defaults are the original CANOE run's, the paper's (lr 1e-6 cosine with 10 % warm-up, 2 prompts × 8
    accumulation steps a GPU, 1024 prompt and 1024 completion tokens, G = 7, β = 0.04, CANOE's system prompt, full
    fine-tuning), which the GPU recipes (recipes/) inherit. config.toml, the default run, is a small CPU run that
    overrides them (LoRA, lr 5e-5 constant, one prompt a step, 832 + 128 tokens, its own prompt and worked example).
    """

    # --- model
    model: str = _key("models/Qwen2.5-Coder-0.5B-Instruct", "policy to train: a Hugging Face model folder")
    dtype: str = _key("auto", "auto (bfloat16 where the GPU or CPU supports it, else float32), float32 or bfloat16")
    gradient_checkpointing: bool = _key(False, "recompute activations in backward to save memory")
    # --- data
    train_file: str = _key("data/synth/train.jsonl", "training data: .jsonl, .json, .parquet or a save_to_disk folder")
    eval_file: str = _key("data/synth/eval.jsonl", "data for --eval without --suite (as train_file, or ConFiQA JSON)")
    suite_max_tokens: int = _key(1024, "max new tokens per output in --eval --suite (the official evaluation's)")
    max_prompt_tokens: int = _key(1024, "longer prompts (chat template included) are handled by on_long_prompt")
    on_long_prompt: str = _key("drop", "drop (remove and report their ids) or error")
    system_prompt: str = _key("", "system prompt; empty = data.SYSTEM_PROMPT (CANOE's)")
    response_prefix: str = _key("", "text that opens every answer, e.g. \"<think>\" (R1-Zero's prompt end)")
    example_problem: str = _key("", "a worked example's user turn, shown before every prompt; empty: none")
    example_response: str = _key("", "the worked example's reply (set both or neither)")
    examples: list = _key([], "[problem, response] pairs instead: one worked example drawn per prompt (D23)")
    # --- rollout
    num_generations: int = _key(7, "G, samples per prompt in stage 1 (the group of the advantage)")
    max_completion_tokens: int = _key(1024, "max new tokens per completion, stage 1 and stage 2")
    temperature: float = _key(0.9, "sampling temperature, stage 1 and stage 2; π_θ, π_old, π_ref are taken at it")
    top_p: float = _key(1.0, "nucleus sampling, stage 1 and stage 2")
    dual: bool = _key(True, "run stage 2 (CANOE's do_long_answer); without it influence is always 0")
    vllm_gpu_memory_utilization: float = _key(0.7, "GPU memory share vLLM may take (`--plan-memory` shows what fits)")
    vllm_cpu_kv_cache_gib: float = _key(1.0, "vLLM KV cache size on a CPU, GiB")
    vllm_sleep: bool = _key(True, "release vLLM's memory during training where the platform supports it (CUDA)")
    sync_tolerance: float = _key(0.0, "push probe's bound on the trimmed max |logprob gap| (nats); 0: by the dtype")
    # --- rewards
    rewards: dict = _key(CANOE_REWARDS, "[rewards] table: name in rewards.REWARD_FUNCS = weight of a weighted sum")
    reward_files: list = _key([], "files whose rewards this run may name (from the repository root), e.g. "
                              "[\"ideas/brevity.py\"]: each registers its own in rewards.REWARD_FUNCS")
    reward_workers: int = _key(2, "processes grading math answers in parallel")
    reward_deadline_s: float = _key(1.0, "hard per-sample deadline of symbolic grading (then string match)")
    # --- optimisation
    prompts_per_device: int = _key(2, "prompts per micro-batch on each rank (each with G completions)")
    gradient_accumulation_steps: int = _key(8, "micro-batches per optimizer step (one rollout per step)")
    num_epochs: float = _key(2.0, "passes over the training prompts (used when max_steps is 0)")
    max_steps: int = _key(0, "training steps (one rollout each; μ optimizer steps); 0 = derive from num_epochs")
    max_minutes: float = _key(0.0, "stop after the step that ends this many minutes of training (0 = no limit)")
    learning_rate: float = _key(1e-6, "peak learning rate (AdamW)")
    lr_scheduler: str = _key("cosine", "cosine or constant, after linear warm-up")
    warmup_ratio: float = _key(0.1, "share of the steps spent in linear warm-up")
    weight_decay: float = _key(0.0, "AdamW weight decay")
    adam_betas: list = _key([0.9, 0.999], "AdamW betas")
    max_grad_norm: float = _key(1.0, "gradient clipping (global norm)")
    zero_stage: int = _key(2, "DeepSpeed ZeRO stage: 2 or 3")
    # --- LoRA (plumbing/lora.py): PEFT's adapters; the reference policy is the base with the adapters disabled
    lora_rank: int = _key(0, "r, rank of the LoRA adapters; 0 = full fine-tuning (every weight is trained)")
    lora_alpha: float = _key(32.0, "α: an adapter adds (α / r)·B·A to its layer's weight")
    lora_dropout: float = _key(0.0, "dropout on the adapters' input (0 keeps trainer and sampler log-probs equal)")
    lora_target_modules: list = _key(LORA_TARGETS, "modules (by name) that get adapters")
    lora_push: str = _key("auto", "how vLLM gets a LoRA policy: merged, adapter or auto (Config.pushes_adapter)")
    offload_optimizer: bool = _key(False, "keep optimizer state in CPU memory (DeepSpeed CPU Adam)")
    # --- loss (grpo_loss.py); the options beside CANOE's, all off by default (variants.py)
    beta: float = _key(0.04, "β, weight of the k3 KL to the frozen reference model (0 = no reference model)")
    clip_eps_low: float = _key(0.2, "ε_low: the ratio is clipped below at 1 − ε_low")
    clip_eps_high: float = _key(0.2, "ε_high: the ratio is clipped above at 1 + ε_high")
    aggregation: str = _key("seq-mean-token-mean", "variants.AGGREGATIONS: seq-mean-token-mean (CANOE), token-mean "
                            "(DAPO) or seq-mean-token-sum-norm (Dr. GRPO)")
    advantage_eps: float = _key(1e-4, "eps in (r − mean) / (std + eps)")
    advantage_rule: str = _key("sum_then_normalize", "variants.ADVANTAGE_RULES: sum_then_normalize (CANOE) or "
                               "normalize_then_sum (GDPO)")
    advantage_std: str = _key("unbiased", "unbiased (CANOE), biased, or none: A = r − mean (Dr. GRPO)")
    num_iterations: int = _key(1, "μ, updates per rollout (1 = CANOE); from the 2nd on, the ratio and clip act")
    importance_cap: float = _key(0.0, "C of truncated importance sampling, min(π_old/π_vLLM, C) per token; 0 = off")
    ratio_level: str = _key("token", "variants.RATIO_LEVELS: token (PPO/GRPO) or sequence (GSPO)")
    mask_truncated: bool = _key(False, "completions cut off by max_completion_tokens get no loss (DAPO)")
    skip_zero_variance_groups: bool = _key(False, "groups whose advantages are all equal get no loss (DAPO)")
    dynamic_sampling_draws: int = _key(0, "D: prompt redraws to replace groups of equal advantages (DAPO); 0 = off")
    # --- run
    output_dir: str = _key("runs/default", "run folder: config, metrics, samples, checkpoints")
    seed: int = _key(42, "seed of data order, sampling and initialisation")
    sample_every: int = _key(10, "write prompts and completions to samples.jsonl every N steps (0 = never)")
    save_every: int = _key(50, "checkpoint every N steps (the last step is always saved; 0 = only the last)")
    keep_checkpoints: int = _key(2, "how many checkpoints to keep")
    max_bad_steps: int = _key(3, "stop after this many steps in a row with a non-finite loss or gradients")
    dist_timeout_minutes: float = _key(60.0, "how long a collective may wait for the other ranks (DeepSpeed's: 10)")
    tensorboard: bool = _key(False, "also log to TensorBoard (OUTPUT_DIR/tensorboard)")
    wandb_project: str = _key("", "also log to this Weights & Biases project (needs `pip install wandb`)")

    # Derived sizes (per rank): a step trains on prompts_per_step prompts in gradient_accumulation_steps micro-batches.
    @property
    def prompts_per_step(self) -> int:
        return self.prompts_per_device * self.gradient_accumulation_steps

    @property
    def sequences_per_micro_batch(self) -> int:
        return self.prompts_per_device * self.num_generations

    @property
    def reward_weights(self) -> torch.Tensor:
        """`(R,)` float32: the weight of each reward of `rewards`, in its order (rewards.score's columns)."""
        return torch.tensor(list(self.rewards.values()), dtype=torch.float32)

    def lora_settings(self) -> dict[str, Any]:
        """lora.wrap's keywords."""
        return {"rank": self.lora_rank, "alpha": self.lora_alpha, "dropout": self.lora_dropout,
                "target_modules": list(self.lora_target_modules), "gradient_checkpointing": self.gradient_checkpointing}

    def pushes_adapter(self, dtype, *, cuda: bool) -> bool:
        """Whether vLLM gets the LoRA adapter itself (lora.AdapterPush) rather than merged weights (lora.MergedPush).

        "auto" means on a GPU outside float32, where a merged bfloat16 update below half a step of W would be lost;
        on a CPU vLLM's adapter kernels cost far more than a merged push (docs/library-notes.md).
        """
        if not self.lora_rank:
            return False
        return self.lora_push == "adapter" or (self.lora_push == "auto" and cuda and dtype != torch.float32)

    def push_tolerance(self, dtype) -> float:
        """The probe check's tolerance (weight_sync.check_sync): `sync_tolerance`, or by the dtype when it is 0."""
        return self.sync_tolerance or SYNC_TOLERANCE[dtype]

    def prompt_style(self) -> dict:
        """data.render_prompt's keywords, in training and evaluation alike; `example` only when one is set."""
        style = {"system_prompt": self.system_prompt or SYSTEM_PROMPT, "response_prefix": self.response_prefix}
        if self.example_problem:
            style["example"] = (self.example_problem, self.example_response)
        if self.examples:
            style["examples"] = tuple(map(tuple, self.examples))
        return style


# The push probe's bound on the trimmed maximum |Δ log-probability| (nats) between vLLM and the trainer, by dtype
# (weight_sync.check_sync sets the worst quarter of the tokens aside). float32 kernels agree far below 1e-3 while a
# push that did not land misses by more than 1e-2; bfloat16 kernels that round differently move a few tokens by
# tenths of a nat, stale weights most tokens by nats (the weights themselves are checked exactly as well).
SYNC_TOLERANCE = {torch.float32: 1e-3, torch.bfloat16: 0.5}

# The allowed values of each key; a registry's (a dict of variants.py) are its names when a config is validated, so a
# name a fork registers is accepted.
CHOICES = {
    "dtype": ("auto", "float32", "bfloat16"),
    "lora_push": ("auto", "merged", "adapter"),
    "on_long_prompt": OVERFLOW_RULES,
    "lr_scheduler": ("cosine", "constant"),
    "zero_stage": (2, 3),
    "aggregation": AGGREGATIONS,
    "advantage_std": ADVANTAGE_STDS,
    "ratio_level": RATIO_LEVELS,
    "advantage_rule": ADVANTAGE_RULES,
}


class ConfigError(ValueError):
    """A config file the run cannot use; the message names the key."""


def load_config(path: str | Path) -> Config:
    """Read a TOML file into a Config: unknown keys, wrong types and bad values are errors naming the key."""
    path = Path(path)
    raw = _read_toml(path)
    fields = {f.name: f for f in dataclasses.fields(Config)}
    values = {}
    for key, value in raw.items():
        if key not in fields:
            close = difflib.get_close_matches(key, fields, n=2, cutoff=0.75)
            hint = f" (did you mean {', '.join(close)}?)" if close else ""
            raise ConfigError(f"{path}: unknown key {key!r}{hint}; `python canoe.py --describe-config` lists them")
        values[key] = _checked(path, key, value, fields[key].type)
    cfg = Config(**values)
    _validate(path, cfg)
    return cfg


def _read_toml(path: Path, seen: tuple[Path, ...] = ()) -> dict[str, Any]:
    """The file's keys over those of its `base` chain (each base relative to the file naming it)."""
    if not path.exists():
        raise ConfigError(f"config file {path} does not exist")
    if path.resolve() in seen:
        raise ConfigError(f"{path}: `base` leads back to itself")
    try:
        raw = tomllib.loads(path.read_text())
    except tomllib.TOMLDecodeError as error:
        raise ConfigError(f"{path} is not valid TOML: {error}") from None
    base = raw.pop("base", None)
    if base is None:
        return raw
    if not isinstance(base, str):
        raise ConfigError(f"{path}: 'base' must be a path (a string), got {base!r}")
    return _read_toml(path.parent / base, (*seen, path.resolve())) | raw


def _checked(path: Path, key: str, value: Any, annotation: str) -> Any:
    expected = {"str": str, "int": int, "float": (int, float), "bool": bool, "list": list, "dict": dict}[annotation]
    # bool is an int in Python; a TOML `true` for a number (or 1 for a flag) is a mistake worth naming.
    if isinstance(value, bool) != (annotation == "bool") or not isinstance(value, expected):
        raise ConfigError(f"{path}: key {key!r} must be {annotation}, got {type(value).__name__} {value!r}")
    return float(value) if annotation == "float" else value


def _validate(path: Path, cfg: Config) -> None:
    def bad(key: str, why: str) -> ConfigError:
        return ConfigError(f"{path}: {key} = {getattr(cfg, key)!r}: {why}")

    for key, allowed in CHOICES.items():
        if getattr(cfg, key) not in allowed:
            raise bad(key, f"must be one of {tuple(allowed)}")
    if cfg.num_generations < 2:
        raise bad("num_generations", "GRPO needs at least 2 samples per prompt to compare them")
    for key in ("prompts_per_device", "gradient_accumulation_steps", "num_iterations", "max_prompt_tokens",
                "max_completion_tokens", "reward_workers", "keep_checkpoints", "max_bad_steps"):
        if getattr(cfg, key) < 1:
            raise bad(key, "must be at least 1")
    for key in ("max_steps", "dynamic_sampling_draws", "sample_every", "save_every", "beta", "weight_decay",
                "clip_eps_high", "advantage_eps", "num_epochs", "importance_cap",
                "max_minutes", "sync_tolerance", "lora_rank"):
        if getattr(cfg, key) < 0:
            raise bad(key, "must not be negative")
    if cfg.max_steps == 0 and cfg.num_epochs == 0:
        raise bad("num_epochs", "with max_steps = 0 this must be positive")
    if not 0 < cfg.learning_rate < 1:
        raise bad("learning_rate", "must lie in (0, 1)")
    for key in ("warmup_ratio", "clip_eps_low", "lora_dropout"):
        if not 0 <= getattr(cfg, key) < 1:
            raise bad(key, "must lie in [0, 1)")
    if not 0 < cfg.top_p <= 1:
        raise bad("top_p", "must lie in (0, 1]")
    if bool(cfg.example_problem) != bool(cfg.example_response):
        raise bad("example_problem", "set example_problem and example_response together, or neither")
    if cfg.examples and (cfg.example_problem or not all(isinstance(pair, list) and len(pair) == 2 and all(
            isinstance(text, str) and text for text in pair) for pair in cfg.examples)):
        raise bad("examples", "a list of [problem, response] pairs of text, set instead of example_problem")
    known = known_rewards(path, cfg.reward_files)
    unknown = [name for name in cfg.rewards if name not in known]
    if unknown or not cfg.rewards:
        raise bad("rewards", f"unknown {unknown}; known: {sorted(known)} (a new reward is registered in a file the "
                  "config names in reward_files, or in rewards.py)")
    not_numbers = [name for name, w in cfg.rewards.items() if isinstance(w, bool) or not isinstance(w, (int, float))]
    if not_numbers:
        raise bad("rewards", f"the weight of {not_numbers} must be a number")
    for key in ("lora_alpha", "dist_timeout_minutes", "temperature"):  # π_θ = softmax(logits / τ): τ = 0 has none
        if not getattr(cfg, key) > 0:
            raise bad(key, "must be positive")
    if not cfg.lora_target_modules or not all(isinstance(m, str) and m for m in cfg.lora_target_modules):
        raise bad("lora_target_modules", "must be a non-empty list of module names, e.g. [\"q_proj\", \"v_proj\"]")
    if len(cfg.adam_betas) != 2:
        raise bad("adam_betas", "need two numbers")


REPOSITORY = Path(__file__).resolve().parent  # reward_files are read from here, wherever the run starts
# Each reward file loaded in this process (its resolved path) -> the reward names it registered.
_FILE_REWARDS: dict[Path, tuple[str, ...]] = {}


def known_rewards(path: Path, reward_files: list) -> set[str]:
    """The rewards a config may name: rewards.py's and those its own `reward_files` register, each file imported
    once, as a module of its own. A reward that another config's file registered in this process is not known here,
    so that a config is accepted only where the trainer, loading it alone, accepts it."""
    for name in reward_files:
        file = (REPOSITORY / name).resolve() if isinstance(name, str) else None
        if file in _FILE_REWARDS:
            continue
        if file is None or not file.is_file():
            raise ConfigError(f"{path}: reward_files: {name!r}: no such file (paths are from the repository root)")
        before = dict(REWARD_FUNCS)
        module = f"reward_file_{hashlib.sha256(str(file).encode()).hexdigest()[:8]}"
        spec = importlib.util.spec_from_file_location(module, file)
        spec.loader.exec_module(importlib.util.module_from_spec(spec))
        added = tuple(k for k, fn in REWARD_FUNCS.items() if before.get(k) is not fn)
        replaced = [k for k in added if k in before]
        if replaced or not added:
            REWARD_FUNCS.update(before)
            why = f"replaces the registered {replaced}: give it a name of its own" if replaced else \
                'registers no reward (REWARD_FUNCS["name"] = function)'
            raise ConfigError(f"{path}: reward_files: {name}: {why}")
        _FILE_REWARDS[file] = added
    own = {k for name in reward_files for k in _FILE_REWARDS[(REPOSITORY / name).resolve()]}
    return set(REWARD_FUNCS) - {k for names in _FILE_REWARDS.values() for k in names} | own


def describe_config() -> str:
    """Every key with its default, written as TOML, and its meaning."""
    lines = ['base = "..."'.ljust(52) + "# optional: a config whose keys this file's keys override "
             "(path relative to it)"]
    for f in dataclasses.fields(Config):
        default = f.default_factory() if f.default is dataclasses.MISSING else f.default
        value = ("{" + ", ".join(f"{k} = {v}" for k, v in default.items()) + "}" if isinstance(default, dict)
                 else json.dumps(default))
        lines.append(f"{f.name} = {value}".ljust(52) + f"# {f.metadata['help']}")
    return "\n".join(lines)
