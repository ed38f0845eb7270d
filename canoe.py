"""CANOE Dual-GRPO: the driver. Config → set-up → the training step → the loop.

    deepspeed canoe.py --config config.toml              # train (1 rank on a CPU, one rank per GPU otherwise)
    deepspeed canoe.py --config config.toml --resume     # continue from the run's latest checkpoint
    deepspeed canoe.py --config config.toml --verbose    # vLLM's log on the terminal too (always in OUTPUT_DIR/vllm.log)
    python canoe.py --config config.toml --eval [--model DIR] [--eval-file F]   # greedy faithfulness evaluation
    python canoe.py --eval --suite confiqa --eval-file F [--predictions P]      # a paper benchmark
    python canoe.py --describe-config                    # every config key with its meaning and default
    python canoe.py --config config.toml --plan-memory   # the memory plan per GPU (training/cli.py)

One training step (CANOE, arXiv 2505.16483; docs/DESIGN.md, "The step, in one picture"):

    batch of B prompts (this rank) ─ stage 1: G samples each (vLLM)
      ─ stage 2: each long answer in place of the context, 1 sample each
      ─ rewards: accuracy, format (stage 1), influence (stage 2), length; weighted sum
      ─ group-relative advantages (grpo_loss.py's docstring holds the equations)
      ─ micro-batches of `prompts_per_device` prompts: clipped surrogate − β·KL on stage-1 tokens only, backward
      ─ DeepSpeed step (ZeRO-2/3) ─ push weights into vLLM and verify ─ log ─ checkpoint

The deliberate differences from the original CANOE code (a modified TRL GRPOTrainer) are listed, with their
reasons, in docs/differences.md; each place where this file differs names its entry there. Stage-2 completions are
scored only, never trained on (docs/DESIGN.md, "Rollout").

The command line is training/cli.py; the rewards are called and summed up in training/scoring.py; timing, metrics
and logging live in training/metrics.py, the set-up checks in training/preflight.py, the DeepSpeed config and the
learning-rate schedule in training/optimizer.py, the weight push and its proof in training/push.py (on
plumbing/weight_sync.py, and plumbing/lora.py for a LoRA policy); this file holds what a step does.
"""

from __future__ import annotations

from plumbing import runtime  # noqa: I001  (first: it sets the thread count and vLLM's mode before torch and vLLM load)

import dataclasses
import math
import os
import time
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import deepspeed
import torch
import torch.distributed as dist
from tqdm import tqdm
from transformers import AutoModelForCausalLM, AutoTokenizer

import data
import rollout
from config import Config, ConfigError
from grpo_loss import grpo_loss
from variants import Variants

from grading.grader import MathGrader
from plumbing import checkpoint, lora, weight_sync
from plumbing.runtime import all_reduce_values, broadcast_values, init_distributed, print0, resolve_dtype, route_logs
from training import cli, packing, preflight
from training.metrics import RunLog, Step, step_metrics, timed, timing, truncate_log, write_run_info
from training.optimizer import deepspeed_config, lr_lambda
from training.push import WeightPush
from training.scoring import reward_counts, reward_metrics, score


# ==============================================================================================================
# Set-up: distributed, models, DeepSpeed, vLLM, data
# ==============================================================================================================


@dataclass
class Run:
    """Everything the loop needs, built once by `setup`."""

    cfg: Config
    rank: int
    world_size: int
    device: Any
    tokenizer: Any
    engine: Any  # DeepSpeed engine around the policy (with LoRA: a PEFT model, adapters trained, base frozen)
    reference: Any  # frozen reference model (or its DeepSpeed engine under ZeRO-3); None when β = 0 or with LoRA
    llm: Any  # this rank's vLLM engine
    rows: list[dict]
    prompt_sampler: data.PromptSampler  # this rank's prompts, step by step
    grader: Any
    total_steps: int
    variants: Variants  # the GRPO variants the config turns on (none by default)
    rollout: Callable[..., rollout.Rollout]  # `rollout_batch`, or it wrapped in dynamic sampling
    push: WeightPush  # step 6: the push into vLLM and its checks
    out: Path
    step: int = 0
    bad_steps_in_a_row: int = 0
    bad_steps_total: int = 0
    times: dict[str, float] = dataclasses.field(default_factory=dict)  # seconds per phase of the current step
    last_step: Any = None  # the latest Step, for samples.jsonl


def setup(cfg: Config, *, resume: bool) -> Run:
    rank, world_size = init_distributed(cfg.dist_timeout_minutes)
    torch.manual_seed(cfg.seed + rank)
    device = torch.device("cuda", int(os.environ["LOCAL_RANK"])) if torch.cuda.is_available() else torch.device("cpu")
    if device.type == "cuda":
        torch.cuda.set_device(device)
    out = Path(cfg.output_dir)
    dtype = resolve_dtype(cfg.dtype, say=True)
    if rank == 0:
        out.mkdir(parents=True, exist_ok=True)
        write_run_info(cfg, out, world_size, dtype)

    # Data: every rank loads and renders the same prompts; the sampler gives each rank its own slice.
    tokenizer = AutoTokenizer.from_pretrained(cfg.model)
    with warnings.catch_warnings(record=True):  # the report below lists the dropped prompts
        warnings.simplefilter("always", data.PromptOverflowWarning)
        loaded = data.load_dataset(cfg.train_file)
        preflight.check_reward_fields(loaded, cfg.train_file)
        rows, report = data.prepare_prompts(tokenizer, loaded, cfg.max_prompt_tokens, cfg.on_long_prompt,
                                            **cfg.prompt_style())
    print0(f"data: {cfg.train_file}: {report.summary()}")
    try:
        sampler = data.PromptSampler(len(rows), cfg.prompts_per_step, cfg.seed, rank, world_size)
    except ValueError as error:  # e.g. fewer prompts than one global batch
        raise ConfigError(f"prompts_per_device × gradient_accumulation_steps × ranks = {cfg.prompts_per_step} × "
                          f"{world_size}: {error}") from None
    total_steps = cfg.max_steps or max(1, math.ceil(cfg.num_epochs * sampler.steps_per_epoch))

    # Policy under DeepSpeed (with LoRA: adapters on the frozen base, lora.py), reference model frozen beside it
    # (with LoRA: none, the policy with its adapters disabled is π_ref).
    policy = load_policy(cfg.model, dtype)
    if cfg.gradient_checkpointing:
        policy.gradient_checkpointing_enable()
    policy.config.use_cache = False
    if cfg.lora_rank:
        policy = lora.wrap(policy, **cfg.lora_settings())
    preflight.check_fits(cfg, sum(p.numel() for p in policy.parameters()), dtype, lora.trainable_parameters(policy))
    engine, _, _, _ = deepspeed.initialize(
        model=policy, model_parameters=[p for p in policy.parameters() if p.requires_grad],
        config=deepspeed_config(cfg, world_size, dtype, train=True),
        lr_scheduler=lambda optimizer: torch.optim.lr_scheduler.LambdaLR(optimizer, lr_lambda(cfg, total_steps * cfg.num_iterations)),
    )
    reference = None
    if cfg.beta > 0 and not cfg.lora_rank:
        reference = AutoModelForCausalLM.from_pretrained(cfg.model, dtype=dtype).eval().requires_grad_(False)
        if cfg.zero_stage == 3:
            reference, *_ = deepspeed.initialize(model=reference,
                                                 config=deepspeed_config(cfg, world_size, dtype, train=False))
            reference.eval()
        else:
            reference = reference.to(device)

    # vLLM, colocated in this process. Stage-2 prompts carry a long answer in place of the context, so the
    # engine's context must hold a prompt plus two completions.
    # Differs from CANOE (docs/differences.md, D16): vLLM shares each GPU with the trainer, with a share from a plan.
    sleep = cfg.vllm_sleep and device.type == "cuda" and weight_sync.sleep_supported()
    if device.type == "cuda":
        preflight.check_engine_can_start(cfg)
    # Differs from CANOE (docs/differences.md, D17): with LoRA, vLLM receives new merged tensors or the adapter.
    adapter = cfg.pushes_adapter(dtype, cuda=device.type == "cuda")  # vLLM applies the LoRA adapter itself
    llm = rollout.make_engine(cfg.model, dtype=str(dtype).removeprefix("torch."), seed=cfg.seed,
                              max_model_len=cfg.max_prompt_tokens + 2 * cfg.max_completion_tokens,
                              gpu_memory_utilization=cfg.vllm_gpu_memory_utilization, enable_sleep_mode=sleep,
                              cpu_kv_cache_gib=cfg.vllm_cpu_kv_cache_gib, trainer_seed=cfg.seed + rank,
                              lora_rank=cfg.lora_rank if adapter else 0)
    grader = MathGrader(workers=cfg.reward_workers, deadline_s=cfg.reward_deadline_s)
    push = WeightPush.create(cfg, llm, weight_sync.make_probe(tokenizer, rows[0]["prompt_ids"]), dtype,
                             adapter=adapter, sleep=sleep, folder=out / "vllm-adapter" / f"rank-{rank}")
    variants = Variants.create(cfg)
    run = Run(cfg, rank, world_size, device, tokenizer, engine, reference, llm, rows, sampler, grader, total_steps,
              variants, variants.rollout(rollout_batch), push, out)
    if resume:
        restore(run)
    return run


def load_policy(model: str, dtype: torch.dtype):
    """The policy's weights, loaded straight in the training dtype (every rank loads its own copy).

    DeepSpeed casts the parameters, and only them, to bfloat16 anyway (docs/library-notes.md, "bfloat16 mode and
    LoRA"); its float32 master weights are made from those bfloat16 parameters. Loading in bfloat16 gives
    the same parameters and the same float32 buffers (transformers computes the rotary tables in float32 whatever
    the dtype; tests/test_config.py checks it), and a rank does not hold 4 bytes per parameter on the host before
    the cast: 59 GB for Qwen2.5-14B, 8 ranks at once on an 8-GPU node. On the CPU the dtype is float32.
    """
    return AutoModelForCausalLM.from_pretrained(model, dtype=dtype)


def restore(run: Run) -> None:
    path = checkpoint.latest_checkpoint(run.out)
    if path is None:
        raise SystemExit(f"error: --resume given but {run.out}/checkpoints has no complete checkpoint")
    state = checkpoint.load_checkpoint(path, engine=run.engine, rank=run.rank)
    run.step = state["step"]
    run.prompt_sampler.load_state_dict(state["sampler"])
    run.bad_steps_total = state.get("bad_steps_total", 0)
    if run.rank == 0:  # steps after the checkpoint will be redone: drop their log lines so each step appears once
        for name in ("metrics.jsonl", "samples.jsonl"):
            truncate_log(run.out / name, run.step)
    run.push(run.engine, asleep=False)  # vLLM started from the original weights: give it the restored ones
    print0(f"resumed from {path} at step {run.step}")


# ==============================================================================================================
# The training step
# ==============================================================================================================


def train_step(run: Run) -> Step:
    """One Dual-GRPO step on this rank's next batch of B prompts (N = B·G completions); returns what happened."""

    # 1. Rollout (vLLM). Stage 1: G samples per prompt. Stage 2: each sample's long answer in place of its
    #    prompt's context, one new sample from that (None where there is no long answer to put in).
    # 2. Rewards: every configured reward function scores every completion; the total is their weighted sum.
    sampled = sample_and_score(run)  # B rows, N completions, N stage-2 entries, (N, R) scores
    rewards = sampled.scores @ run.variants.reward_weights  # (N,)

    # 3. Group-relative advantages (grpo_loss.py), and the sequences that enter the loss: all of them, unless a
    #    variant masks some (variants.py).
    advantages = run.variants.advantages(sampled.scores)  # (N,)
    kept = run.variants.kept(advantages, sampled.completions)  # (N,) bool

    # 4. Micro-batches, each packed into one row, and what does not change while training on this rollout:
    #    π_ref (for the KL) and π_old (the policy that sampled, for the ratio) of every sampled token.
    micro = micro_batches(run, sampled, advantages, kept)
    totals = loss_constants(run, micro, kept)  # the loss's denominators; None: no rank kept a sequence

    # 5. Loss and backward per micro-batch; DeepSpeed applies the update at the last one.
    losses = update(run, micro, totals)

    # 6. Push the new weights into vLLM and prove that they arrived (training/push.py).
    pushed = run.push(run.engine)

    run.step += 1
    return Step(sampled, rewards, advantages, kept, losses, micro, pushed)


def sample_and_score(run: Run) -> rollout.Rollout:
    """Steps 1 and 2: the rollout (`run.rollout`) with its rewards' logged means; then vLLM's memory goes to the
    trainer until step 6 (CUDA sleep mode; nothing happens on the CPU)."""
    counts_before = reward_counts(run)
    batch = run.rollout(run)
    weight_sync.sleep_engine(run.llm, run.push.sleep)
    means = reward_metrics(run, batch.rows, batch.completions, batch.scores, counts_before)
    return dataclasses.replace(batch, metrics=batch.metrics | means)


def rollout_batch(run: Run, draw: int = 0) -> rollout.Rollout:
    """This rank's next B prompts, sampled in both stages and scored (`draw` > 0: dynamic sampling's extra draws)."""
    rows = [run.rows[i] for i in run.prompt_sampler.next_batch()]  # B prompts
    completions = sample_stage1(run, rows, draw)  # N completions, prompt-major
    stage2 = sample_stage2(run, rows, completions, draw)  # N entries
    return rollout.Rollout(rows, completions, stage2, score(run, rows, completions, stage2))  # scores (N, R)


def sampling(run: Run, draw: int) -> dict[str, Any]:
    """The sampling settings of a step's `draw`-th rollout (0: the step's own; more only with dynamic sampling).

    Differs from CANOE (docs/differences.md, D8): sampling is seeded per step, stage and rank (and draw).
    """
    cfg = run.cfg
    step = run.step if draw == 0 else f"{run.step}+{draw}"
    return dict(temperature=cfg.temperature, top_p=cfg.top_p, max_tokens=cfg.max_completion_tokens, seed=cfg.seed,
                step=step, rank=run.rank, lora_request=run.push.lora_request)


def with_prefix(cfg: Config, completion: rollout.Completion | None) -> rollout.Completion | None:
    """The response prefix sits in the prompt, but the rewards judge the whole answer: put it back in the text."""
    if completion is None or not cfg.response_prefix:
        return completion
    return dataclasses.replace(completion, text=cfg.response_prefix + completion.text)


@timed("stage1")
def sample_stage1(run: Run, rows: list[dict], draw: int) -> list[rollout.Completion]:
    completions = rollout.generate_stage1(run.llm, [r["prompt_ids"] for r in rows],
                                          num_generations=run.cfg.num_generations, **sampling(run, draw))
    return [with_prefix(run.cfg, c) for c in completions]


@timed("stage2")
def sample_stage2(run: Run, rows: list[dict], completions: list[rollout.Completion], draw: int) -> rollout.Stage2:
    cfg = run.cfg
    if not cfg.dual:
        return rollout.Stage2([None] * len(completions), [None] * len(completions), 0)

    def render(problem: str) -> list[int]:  # the stage-2 prompt: same system prompt and chat template as stage 1
        return run.tokenizer(data.render_prompt(run.tokenizer, problem, **cfg.prompt_style()),
                             add_special_tokens=False)["input_ids"]

    stage2 = rollout.generate_stage2(run.llm, [r["problem"] for r in rows], completions,
                                     group_size=cfg.num_generations, render=render,
                                     max_prompt_tokens=cfg.max_prompt_tokens + cfg.max_completion_tokens, **sampling(run, draw))
    return dataclasses.replace(stage2, completions=[with_prefix(cfg, c) for c in stage2.completions])


@dataclass
class Batch:
    """One micro-batch: `sequences_per_micro_batch` completions (M) packed into one row, and their constants."""

    start: int  # index of its first completion in the step's N
    completions: list  # M rollout.Completion
    packed: packing.Packed
    mask: torch.Tensor  # (M, C) trained tokens: completion tokens of the kept sequences
    advantages: torch.Tensor  # (M,)
    vllm_logprobs: torch.Tensor  # (M, C) vLLM's log-probabilities of the sampled tokens
    ref: torch.Tensor | None = None  # (M, C) π_ref, None when β = 0
    old: torch.Tensor | None = None  # (M, C) π_old: before the first update when μ > 1, else the first pass's own


def micro_batches(run: Run, batch: rollout.Rollout, advantages: torch.Tensor, kept: torch.Tensor) -> list[Batch]:
    """Micro-batches of prompts_per_device prompts, each packed with every prompt once (packing.py).

    Differs from CANOE (docs/differences.md, D11): each prompt is scored once per micro-batch, not once per
    completion.
    """
    M, G = run.cfg.sequences_per_micro_batch, run.cfg.num_generations
    batches = []
    for start in range(0, len(batch.completions), M):
        part = batch.completions[start : start + M]
        prompts = [batch.rows[(start + i) // G]["prompt_ids"] for i in range(len(part))]
        packed = packing.pack_micro_batch(prompts, [c.token_ids for c in part], run.device)
        mask = packed.completion_mask * kept[start : start + M, None].to(packed.completion_mask)  # (M, C)
        vllm_logprobs = torch.zeros(mask.shape)  # (M, C)
        for i, c in enumerate(part):
            vllm_logprobs[i, : len(c.logprobs)] = torch.tensor(c.logprobs)
        batches.append(Batch(start, part, packed, mask, advantages[start : start + M].to(run.device),
                             vllm_logprobs.to(run.device)))
    return batches


def loss_constants(run: Run, batches: list[Batch], kept: torch.Tensor) -> dict[str, float] | None:
    """The loss's global denominators (`loss_denominators`), and π_ref and π_old of every micro-batch; None, and
    no forward pass, when no rank kept a sequence (possible only under a DAPO mask)."""
    totals = loss_denominators(kept, batches)
    if totals:
        reference_logprobs(run, batches)
        old_logprobs(run, batches)
    return totals


@timed("ref_logprobs")
@torch.no_grad()
def reference_logprobs(run: Run, batches: list[Batch]) -> None:
    """π_ref of every sampled token: the frozen reference model, or with LoRA the policy, adapters disabled."""
    if run.cfg.beta == 0:
        return
    reference = run.engine if run.reference is None else run.reference
    reference.eval()
    with lora.adapters_disabled(reference):
        for batch in batches:
            batch.ref = packing.completion_logprobs(reference, batch.packed)


@timed("old_logprobs")
@torch.no_grad()
def old_logprobs(run: Run, batches: list[Batch]) -> None:
    """π_old before the first update. With μ = 1 the first pass's own (detached) values are π_old, for free.

    Differs from CANOE (docs/differences.md, D12): the loss takes π_old as an argument.
    """
    if run.variants.num_iterations > 1:
        run.engine.train()  # as in the training passes
        for batch in batches:
            batch.old = packing.completion_logprobs(run.engine, batch.packed)


def loss_denominators(kept: torch.Tensor, batches: list[Batch]) -> dict[str, float] | None:
    """Global denominators, so that the micro-batch losses add up to the loss of the whole batch (grpo_loss.py).

    Differs from CANOE (docs/differences.md, D14): the loss does not depend on the micro-batch split.

    DeepSpeed averages gradients over ranks, so each rank's share is scaled to the mean over ranks. None when no
    rank kept any sequence.
    """
    local = [float(kept.sum()), float(sum(b.mask.sum() for b in batches))]
    sequences, tokens = (v / dist.get_world_size() for v in all_reduce_values(local))
    return {"total_sequences": sequences, "total_tokens": max(tokens, 1.0)} if sequences else None


def update(run: Run, batches: list[Batch], totals: dict[str, float] | None) -> list[tuple[torch.Tensor, dict]]:
    """μ passes (`num_iterations`, 1 in CANOE) over the micro-batches: loss and backward for each, DeepSpeed's
    optimizer step after each (it applies the update at the last micro-batch of a pass, the accumulation
    boundary); from the second pass on π_θ ≠ π_old. Returns (loss, grpo_loss metrics) per micro-batch and pass;
    none when `totals` is None."""
    losses = []
    for _ in range(run.variants.num_iterations if totals else 0):
        passed = []
        for batch in batches:
            passed.append(forward_backward(run, batch, totals))
            with timing(run, "optimizer"):
                run.engine.step()
        skip_or_stop_on_bad_step(run, [loss for loss, _ in passed])
        losses += passed
    return losses


@timed("forward_backward")
def forward_backward(run: Run, batch: Batch, totals: dict[str, float]) -> tuple[torch.Tensor, dict]:
    run.engine.train()
    logprobs = packing.completion_logprobs(run.engine, batch.packed)  # (M, C)
    if batch.old is None:  # μ = 1: the policy that sampled is the one being trained
        batch.old = logprobs.detach()
    loss, metrics = grpo_loss(logprobs, batch.old, batch.ref, batch.advantages, batch.mask,
                              vllm_logprobs=batch.vllm_logprobs, **totals, **run.variants.loss)
    # Our loss is already a share of the whole step: DeepSpeed must not divide it by the accumulation steps.
    run.engine.backward(loss, scale_wrt_gas=False)
    return loss.detach(), metrics


def skip_or_stop_on_bad_step(run: Run, losses: list[torch.Tensor]) -> None:
    """Count a step whose update DeepSpeed skipped, and stop when `max_bad_steps` come in a row.

    DeepSpeed skips an update with non-finite gradients without a word (and then `was_step_applied()` is False
    and the LR schedule stalls). A finite loss can have non-finite gradients, so the skip is read from the engine,
    reduced over ranks with the loss check.
    """
    skipped = not run.engine.was_step_applied()
    nonfinite = float(not all(bool(torch.isfinite(loss)) for loss in losses))
    bad_loss, bad_update = all_reduce_values([nonfinite, float(skipped)], op=dist.ReduceOp.MAX)  # every rank first
    if bad_loss and not skipped:
        raise RuntimeError("the loss was not finite but DeepSpeed applied the update; the weights are suspect")
    if not (bad_loss or bad_update):
        run.bad_steps_in_a_row = 0
        return
    run.bad_steps_in_a_row += 1
    run.bad_steps_total += 1
    cause = "a non-finite loss" if bad_loss else "non-finite gradients from a finite loss"
    print0(f"DeepSpeed skipped this step's update ({cause}): {run.bad_steps_in_a_row} in a row, "
           f"{run.bad_steps_total} in all")
    if run.bad_steps_in_a_row >= run.cfg.max_bad_steps:
        raise RuntimeError(f"{run.bad_steps_in_a_row} steps in a row had a non-finite loss or gradient, and DeepSpeed "
                           f"skipped their updates; stopping (max_bad_steps = {run.cfg.max_bad_steps}). Lower the "
                           f"learning rate or check the data.")


# ==============================================================================================================
# The loop
# ==============================================================================================================


def run_step(run: Run) -> dict[str, float]:
    """One training step, timed; returns its metrics (averaged over ranks)."""
    run.times.clear()
    start = time.perf_counter()
    run.last_step = train_step(run)
    return step_metrics(run, run.last_step, seconds=time.perf_counter() - start)


def train(cfg: Config, resume: bool, verbose: bool = False) -> None:
    preflight.check_paths(cfg, train=True)  # before anything is written to the output folder
    route_logs(Path(cfg.output_dir), int(os.environ.get("RANK", "0")), verbose=verbose)  # before vLLM starts
    run = setup(cfg, resume=resume)
    log = RunLog(cfg, run.out, enabled=run.rank == 0)
    print0(f"training {cfg.model} for {run.total_steps} steps on {run.world_size} rank(s): "
           f"{cfg.prompts_per_step} prompts × {cfg.num_generations} samples per rank per step")
    bar = tqdm(total=run.total_steps, initial=run.step, disable=run.rank != 0, desc="steps", dynamic_ncols=True)
    deadline = time.monotonic() + 60 * cfg.max_minutes
    while run.step < run.total_steps:
        metrics = run_step(run)
        if cfg.max_minutes and out_of_time(deadline):  # the time budget is spent: this step is the last
            run.total_steps = run.step
        log.metrics(metrics)
        if cfg.sample_every and run.step % cfg.sample_every == 0:
            log.samples(run.step, run.last_step, G=cfg.num_generations)
        bar.update(1)
        bar.set_postfix(reward=f"{metrics['reward/total']:.2f}", kl=f"{metrics['loss/kl']:.4f}",
                        len=f"{metrics['completion/length_mean']:.0f}", s=f"{metrics['time/step']:.1f}")
        if run.step == run.total_steps or (cfg.save_every and run.step % cfg.save_every == 0):
            state = {"step": run.step, "sampler": run.prompt_sampler.state_dict(),
                     "bad_steps_total": run.bad_steps_total}
            checkpoint.save_checkpoint(run.out, run.step, engine=run.engine, tokenizer=run.tokenizer,
                                       zero_stage=cfg.zero_stage, trainer_state=state, rank=run.rank,
                                       keep=cfg.keep_checkpoints)
    bar.close()
    log.close()
    run.grader.close()
    if run.rank == 0:  # only rank 0's output folder is sure to hold the checkpoint (a node-local disk may not)
        print0(f"done: {run.step} steps; policy in {checkpoint.latest_checkpoint(run.out) / 'policy'}")


def out_of_time(deadline: float) -> bool:
    """Rank 0's clock decides, so that every rank stops after the same step."""
    (spent,) = broadcast_values([float(time.monotonic() >= deadline)], src=0)
    return bool(spent)


def main(argv: Sequence[str] | None = None) -> None:
    """`python canoe.py ...`: training, or the commands that share its config (training/cli.py)."""
    cli.main(argv, train)


if __name__ == "__main__":
    main()
