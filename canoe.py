"""CANOE Dual-GRPO: the driver. Config → set-up → the training step → the loop.

    deepspeed canoe.py --config config.toml              # train (1 rank on a CPU, one rank per GPU otherwise)
    deepspeed canoe.py --config config.toml --resume     # continue from the run's latest checkpoint
    deepspeed canoe.py --config config.toml --verbose    # vLLM's log on the terminal (and in OUTPUT_DIR/vllm.log)
    python canoe.py --config config.toml --eval [--model DIR] [--eval-file F]   # greedy faithfulness evaluation
    python canoe.py --eval --suite confiqa --eval-file F [--predictions P]      # a paper benchmark
    python canoe.py --describe-config                    # every config key with its meaning and default
    python canoe.py --config config.toml --plan-memory   # the memory plan per GPU (training/cli.py)

`train_step` is CANOE's step (arXiv 2505.16483) in six numbered steps; it calls the step's maths itself, with the
config's values, and each variant the config names beside CANOE's (variants.py). docs/reading-map.md lists every
function below it that computes a quantity of its equations, with its depth; the README walks it in nine stops.
The machinery (the weight push and its probe, answer equivalence, packing, sleep, seeds, timing, metrics,
checkpoints, the command line) sits behind one call each, whose comment says what it guarantees. Each deliberate
difference from the original CANOE code names its entry of docs/differences.md where it happens.
"""

from __future__ import annotations

from plumbing import runtime  # noqa: I001  (first: it sets the thread count and vLLM's mode before torch and vLLM load)

import math
import os
import time
import warnings
from collections.abc import Sequence
from dataclasses import dataclass, field
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
from grpo_loss import completion_logprobs, grpo_loss
from rewards import score
from variants import ADVANTAGE_RULES, Variants, dynamic_sampling, kept_sequences

from grading.grader import MathGrader
from plumbing import checkpoint, lora, weight_sync
from plumbing.runtime import (all_reduce_values, broadcast_values, init_distributed, print0, resolve_dtype, route_logs,
                              stop_together)
from training import cli, packing, preflight
from training.metrics import RunLog, Step, step_metrics, timing, truncate_log, write_run_info
from training.optimizer import deepspeed_config, lr_schedule
from training.push import WeightPush
from training.scoring import reward_counts, reward_metrics


# === Set-up: distributed, models, DeepSpeed, vLLM, data ===========================================================


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
    variants: Variants  # what `update` reads: μ and the loss's options (variants.py)
    push: WeightPush  # step 6: the push into vLLM and its checks
    out: Path
    step: int = 0
    bad_steps_in_a_row: int = 0
    bad_steps_total: int = 0
    times: dict[str, float] = field(default_factory=dict)  # seconds per phase of the current step
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
        write_run_info(cfg, out, world_size, dtype,  # how pushes reach vLLM, which evaluation then follows
                       pushes_adapter=cfg.pushes_adapter(dtype, cuda=device.type == "cuda"))
    tokenizer = AutoTokenizer.from_pretrained(cfg.model)
    rows, sampler = load_prompts(cfg, tokenizer, rank, world_size)
    total_steps = cfg.max_steps or max(1, math.ceil(cfg.num_epochs * sampler.steps_per_epoch))
    engine, reference = load_models(cfg, dtype, device, world_size, total_steps)

    # vLLM, colocated in this process. Stage-2 prompts carry a long answer in place of the context, so the
    # engine's context must hold a prompt plus two completions.
    # Differs from CANOE (docs/differences.md, D16): vLLM shares each GPU with the trainer, with a share from a plan.
    sleep = cfg.vllm_sleep and device.type == "cuda" and weight_sync.sleep_supported()
    if device.type == "cuda":
        preflight.check_engine_can_start(cfg)
    adapter = cfg.pushes_adapter(dtype, cuda=device.type == "cuda")  # vLLM applies the LoRA adapter itself
    llm = rollout.make_engine(cfg.model, dtype=str(dtype).removeprefix("torch."), seed=cfg.seed,
                              max_model_len=cfg.max_prompt_tokens + 2 * cfg.max_completion_tokens,
                              gpu_memory_utilization=cfg.vllm_gpu_memory_utilization, enable_sleep_mode=sleep,
                              cpu_kv_cache_gib=cfg.vllm_cpu_kv_cache_gib, trainer_seed=cfg.seed + rank,
                              lora_rank=cfg.lora_rank if adapter else 0)
    grader = MathGrader(workers=cfg.reward_workers, deadline_s=cfg.reward_deadline_s)
    push = WeightPush.create(cfg, llm, weight_sync.make_probe(tokenizer, rows[0]["prompt_ids"]), dtype,
                             adapter=adapter, sleep=sleep, folder=out / "vllm-adapter" / f"rank-{rank}")
    run = Run(cfg, rank, world_size, device, tokenizer, engine, reference, llm, rows, sampler, grader, total_steps,
              Variants.create(cfg), push, out)
    if resume:
        restore(run)
    return run


def load_prompts(cfg: Config, tokenizer, rank: int, world_size: int) -> tuple[list[dict], data.PromptSampler]:
    """The training prompts, rendered alike on every rank, and this rank's sampler over them."""
    with warnings.catch_warnings(record=True):  # the report below lists the dropped prompts
        warnings.simplefilter("always", data.PromptOverflowWarning)
        loaded = data.load_dataset(cfg.train_file)
        preflight.check_reward_fields(loaded, cfg.train_file)
        rows, report = data.prepare_prompts(tokenizer, loaded, cfg.max_prompt_tokens, cfg.on_long_prompt,
                                            **cfg.prompt_style())
    print0(f"data: {cfg.train_file}: {report.summary()}")
    try:
        return rows, data.PromptSampler(len(rows), cfg.prompts_per_step, cfg.seed, rank, world_size)
    except ValueError as error:  # e.g. fewer prompts than one global batch
        raise ConfigError(f"prompts_per_device × gradient_accumulation_steps × ranks = {cfg.prompts_per_step} × "
                          f"{world_size}: {error}") from None


def load_models(cfg: Config, dtype: torch.dtype, device, world_size: int, total_steps: int):
    """The policy under DeepSpeed (with LoRA: adapters on the frozen base, plumbing/lora.py), and the frozen
    reference model beside it: None when β = 0 or with LoRA (the policy with its adapters disabled is π_ref)."""
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
        lr_scheduler=lambda optimizer: lr_schedule(cfg, optimizer, total_steps * cfg.num_iterations),
    )
    if cfg.beta == 0 or cfg.lora_rank:
        return engine, None
    reference = AutoModelForCausalLM.from_pretrained(cfg.model, dtype=dtype).eval().requires_grad_(False)
    if cfg.zero_stage != 3:
        return engine, reference.to(device)
    reference, *_ = deepspeed.initialize(model=reference, config=deepspeed_config(cfg, world_size, dtype, train=False))
    return engine, reference.eval()


def load_policy(model: str, dtype: torch.dtype):
    """The policy's weights, loaded straight in the training dtype: DeepSpeed would cast the parameters anyway, and
    a rank then never holds 4 bytes per parameter on the host (docs/library-notes.md, "bfloat16 mode and LoRA")."""
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
        for name in ("metrics.jsonl", "samples.jsonl", "trace.jsonl"):
            truncate_log(run.out / name, run.step)
    run.push(run.engine, asleep=False)  # vLLM started from the original weights: give it the restored ones
    print0(f"resumed from {path} at step {run.step}")


# === The training step ============================================================================================


def train_step(run: Run) -> Step:
    """One Dual-GRPO step on this rank's next batch of B prompts (N = B·G completions); returns what happened."""

    cfg, G = run.cfg, run.cfg.num_generations

    # 1. Rollout (vLLM). Stage 1: G samples per prompt. Stage 2: each sample's long answer in place of its
    #    prompt's context, one new sample from that (None where there is no long answer to put in).
    # 2. Rewards: every configured reward function scores every completion; the total is their weighted sum.
    sampled = rollout_batch(run)  # B rows, N completions, their (N, R) scores
    # DAPO's dynamic sampling (off by default): each group whose advantages are all equal is refilled from new draws.
    sampled = dynamic_sampling(run, sampled, rollout_batch) if cfg.dynamic_sampling_draws else sampled
    weight_sync.sleep_engine(run.llm, run.push.sleep)  # vLLM's memory goes to the trainer until step 6 (CUDA only)
    rewards = sampled.scores @ cfg.reward_weights  # (N,): (N, R) @ (R,), the [rewards] table's weights

    # 3. Group-relative advantages by the config's rule (CANOE's: variants.canoe_advantages, which calls
    #    grpo_loss.group_advantages; GDPO's beside it), and the (N,) bool sequences that enter the loss: all of
    #    them, unless a DAPO mask drops some.
    rule = ADVANTAGE_RULES[cfg.advantage_rule]
    advantages = rule(rewards, sampled.scores, cfg.reward_weights, G, cfg.advantage_eps, cfg.advantage_std)  # (N,)
    kept = kept_sequences(advantages, sampled.completions, G, cfg.mask_truncated, cfg.skip_zero_variance_groups)

    # 4. Micro-batches, each packed into one row, the loss's denominators over every rank, and what does not
    #    change while training on this rollout: π_ref (for the KL) and π_old (the policy that sampled, for ρ).
    micro = micro_batches(run, sampled, advantages, kept)
    totals = loss_denominators(kept, micro)  # None: no rank kept a sequence (only under a DAPO mask)
    fixed_logprobs(run, micro, totals)

    # 5. π_θ, the loss and its backward per micro-batch; DeepSpeed applies the update at the last one.
    losses = update(run, micro, totals)

    # 6. Machinery: the new weights into vLLM, and the probe's proof that vLLM now gives the trainer's log-probabilities
    #    (training/push.py; it raises when they did not arrive).
    pushed = run.push(run.engine)

    run.step += 1
    return Step(sampled, rewards, advantages, kept, losses, micro, pushed)


def rollout_batch(run: Run, draw: int = 0) -> rollout.Rollout:
    """Steps 1 and 2 on this rank's next B prompts: both stages sampled (seeded by step, stage, rank and draw),
    every reward scored. `draw` > 0: dynamic sampling's extra draws."""
    cfg, G = run.cfg, run.cfg.num_generations
    rows = [run.rows[i] for i in run.prompt_sampler.next_batch()]  # B prompts
    sampling = dict(temperature=cfg.temperature, top_p=cfg.top_p, max_tokens=cfg.max_completion_tokens, seed=cfg.seed,
                    step=run.step if draw == 0 else f"{run.step}+{draw}", rank=run.rank,
                    lora_request=run.push.lora_request, prefix=cfg.response_prefix)
    with timing(run, "stage1"):
        completions = rollout.generate_stage1(run.llm, [r["prompt_ids"] for r in rows], num_generations=G,
                                              **sampling)  # N completions, prompt-major
    # Machinery: data.render_prompt renders a problem as stage 1's prompts are (system prompt, example, template).
    render = lambda problem: run.tokenizer(data.render_prompt(run.tokenizer, problem, **cfg.prompt_style()),
                                           add_special_tokens=False)["input_ids"]
    with timing(run, "stage2"):  # N entries; none without `dual`
        stage2 = rollout.generate_stage2(run.llm, [r["problem"] for r in rows], completions, group_size=G,
                                         render=render,
                                         max_prompt_tokens=cfg.max_prompt_tokens + cfg.max_completion_tokens,
                                         **sampling) if cfg.dual else rollout.Stage2.none(len(completions))
    with timing(run, "rewards"):
        scores = score(cfg.rewards, rows, completions, stage2.completions, G, grader=run.grader,
                       log_dir=str(run.out))  # (N, R)
    return rollout.Rollout(rows, completions, stage2, scores)


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
    passes: list[dict] = field(default_factory=list)  # per pass: its rate, π_θ, the loss and grpo_loss's trace


def micro_batches(run: Run, batch: rollout.Rollout, advantages: torch.Tensor, kept: torch.Tensor) -> list[Batch]:
    """Micro-batches of prompts_per_device prompts, each packed into one row with every prompt once (packing.py)."""
    M, G = run.cfg.sequences_per_micro_batch, run.cfg.num_generations  # M = prompts_per_device · G
    batches = []
    for start in range(0, len(batch.completions), M):
        part = batch.completions[start : start + M]
        prompts = [batch.rows[(start + i) // G]["prompt_ids"] for i in range(len(part))]
        # Machinery: one row per micro-batch; completion_mask (M, C) is 1 exactly on each completion's tokens, and
        # grpo_loss.completion_logprobs reads it as plain_completion_logprobs does each sequence alone.
        packed = packing.pack_micro_batch(prompts, [c.token_ids for c in part], run.device)
        mask = packed.completion_mask * kept[start : start + M, None].to(packed.completion_mask)  # (M, C)
        vllm_logprobs = torch.zeros(mask.shape)  # (M, C)
        for i, c in enumerate(part):
            vllm_logprobs[i, : len(c.logprobs)] = torch.tensor(c.logprobs)
        batches.append(Batch(start, part, packed, mask, advantages[start : start + M].to(run.device),
                             vllm_logprobs.to(run.device)))
    return batches


def loss_denominators(kept: torch.Tensor, batches: list[Batch]) -> dict[str, float] | None:
    """The whole batch's sequences and trained tokens, over every rank, so that the micro-batch losses add up to
    the loss of the whole batch (grpo_loss.py); None when no rank kept any sequence. DeepSpeed averages gradients
    over ranks, so each count is divided by the ranks. Differs from CANOE (docs/differences.md, D14): the loss does
    not depend on the micro-batch split."""
    local = [float(kept.sum()), float(sum(b.mask.sum() for b in batches))]
    # Machinery: all_reduce_values is the element-wise sum over every rank.
    sequences, tokens = (v / dist.get_world_size() for v in all_reduce_values(local))
    return {"total_sequences": sequences, "total_tokens": max(tokens, 1.0)} if sequences else None


@torch.no_grad()
def fixed_logprobs(run: Run, batches: list[Batch], totals: dict | None) -> None:
    """What stays fixed while training on this rollout, for every sampled token: π_ref (the frozen reference model,
    or with LoRA the policy with its adapters disabled; none when β = 0) and π_old when μ > 1 (with μ = 1 `update`
    takes its first pass's own values, detached). Nothing when `totals` is None. Every π here and in `update` is the
    softmax of the logits divided by the sampling temperature, the distribution that drew the tokens; differs from
    CANOE (docs/differences.md, D21), which uses the unscaled logits."""
    if totals is None:
        return
    with timing(run, "ref_logprobs"):
        if run.cfg.beta:
            reference = run.engine if run.reference is None else run.reference
            reference.eval()
            with lora.adapters_disabled(reference):  # machinery: under LoRA the policy with its adapters off
                for batch in batches:  # completion_logprobs: plain_completion_logprobs of each sequence, packed
                    batch.ref = completion_logprobs(reference, batch.packed, run.cfg.temperature)
    with timing(run, "old_logprobs"):
        if run.cfg.num_iterations > 1:
            run.engine.train()  # as in the training passes
            for batch in batches:
                batch.old = completion_logprobs(run.engine, batch.packed, run.cfg.temperature)


def update(run: Run, batches: list[Batch], totals: dict[str, float] | None) -> list[tuple[torch.Tensor, dict]]:
    """μ passes (`num_iterations`, 1 in CANOE) over the micro-batches: π_θ, the loss and its backward for each, then
    DeepSpeed's optimizer step (it applies the update at the last micro-batch of a pass, the accumulation boundary);
    from the second pass on π_θ ≠ π_old. Returns (loss, grpo_loss metrics) per micro-batch and pass; none when
    `totals` is None."""
    losses = []
    for _ in range(run.variants.num_iterations if totals else 0):
        passed, lr = [], run.engine.get_lr()[0]  # the rate of this pass's update (the schedule steps after it)
        for batch in batches:
            with timing(run, "forward_backward"):
                run.engine.train()
                logprobs = completion_logprobs(run.engine, batch.packed, run.cfg.temperature)  # (M, C)
                if batch.old is None:  # μ = 1: the policy that sampled is the one being trained
                    batch.old = logprobs.detach()
                trace = {}  # ρ, the clip, the KL and ℓ per token, for the step's page (training/explain.py)
                loss, metrics = grpo_loss(logprobs, batch.old, batch.ref, batch.advantages, batch.mask,
                                          vllm_logprobs=batch.vllm_logprobs, **totals, **run.variants.loss, trace=trace)
                batch.passes.append({"lr": lr, "logprobs": logprobs.detach(), "loss": loss.detach(), **totals, **trace})
                # The loss is already a share of the whole step: DeepSpeed must not divide it by the accumulation.
                run.engine.backward(loss, scale_wrt_gas=False)
            passed.append((loss.detach(), metrics))
            with timing(run, "optimizer"):
                run.engine.step()
        skip_or_stop_on_bad_step(run, [loss for loss, _ in passed])
        losses += passed
    return losses


def skip_or_stop_on_bad_step(run: Run, losses: list[torch.Tensor]) -> None:
    """Count a step whose update DeepSpeed skipped, and stop when `max_bad_steps` come in a row. DeepSpeed skips an
    update with non-finite gradients without a word, and a finite loss can have them: the skip is read from the
    engine (`was_step_applied()`), reduced over ranks with the loss check."""
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


# === The loop =====================================================================================================


def run_step(run: Run) -> dict[str, float]:
    """One training step, timed; returns its metrics (averaged over ranks)."""
    run.times.clear()
    start, counts = time.perf_counter(), reward_counts(run)
    step = run.last_step = train_step(run)
    return step_metrics(run, step, time.perf_counter() - start, reward_metrics(run, step.rollout, counts))


def train(cfg: Config, resume: bool, verbose: bool = False) -> None:
    preflight.check_paths(cfg, train=True)  # before anything is written to the output folder
    route_logs(Path(cfg.output_dir), int(os.environ.get("RANK", "0")), verbose=verbose)  # before vLLM starts
    init_distributed(cfg.dist_timeout_minutes)
    with stop_together():  # an error on any rank, in set-up or in any phase of a step, stops every rank at once
        run = setup(cfg, resume=resume)
        loop(run)
    if run.rank == 0:  # only rank 0's output folder is sure to hold the checkpoint (a node-local disk may not)
        print0(f"done: {run.step} steps; policy in {checkpoint.latest_checkpoint(run.out) / 'policy'}")
    # Every rank, on this path only: after a failure NCCL's shutdown could wait for a rank that is gone.
    runtime.leave_process_group()


def loop(run: Run) -> None:
    """Steps until `total_steps`: each logged, its samples dumped every `sample_every`, a checkpoint every
    `save_every` and after the last."""
    cfg = run.cfg
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
            log.trace(run, run.last_step, metrics)
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


def out_of_time(deadline: float) -> bool:
    """Rank 0's clock decides, so that every rank stops after the same step."""
    (spent,) = broadcast_values([float(time.monotonic() >= deadline)], src=0)
    return bool(spent)


def main(argv: Sequence[str] | None = None) -> None:
    """`python canoe.py ...`: training, or the commands that share its config (training/cli.py)."""
    cli.main(argv, train)


if __name__ == "__main__":
    main()
