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
      ─ advantages A = (r − mean_group) / (std_group + eps)
      ─ micro-batches of `prompts_per_device` prompts: clipped surrogate − β·KL on stage-1 tokens only, backward
      ─ DeepSpeed step (ZeRO-2/3) ─ push weights into vLLM and verify ─ log ─ checkpoint

The deliberate differences from the original CANOE code (a modified TRL GRPOTrainer) are listed, with their
reasons, in docs/differences.md; each place where this file differs names its entry there. Stage-2 completions are
scored only, never trained on (docs/DESIGN.md, "Rollout").

The command line is training/cli.py; the rewards are called and summed up in training/scoring.py; timing, metrics
and logging live in training/metrics.py, the set-up checks in
training/preflight.py, the DeepSpeed config and the learning-rate schedule in training/optimizer.py, the weight
push in plumbing/ (weight_sync.py, and lora.py for a LoRA policy); this file holds what a step does.
"""

from __future__ import annotations

from plumbing import runtime  # noqa: I001  (first: it sets the thread count and vLLM's mode before torch and vLLM load)

import dataclasses
import math
import os
import time
import warnings
from collections.abc import Sequence
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
from grpo_loss import decoupled_advantages, flat_groups, group_advantages, grpo_loss, trained_sequences

from grading.grader import MathGrader
from plumbing import checkpoint, lora, weight_sync
from plumbing.runtime import all_reduce_values, broadcast_values, init_distributed, print0, resolve_dtype, route_logs
from training import cli, packing, preflight
from training.metrics import RunLog, Step, step_metrics, timed, truncate_log, write_run_info
from training.optimizer import deepspeed_config, lr_lambda
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
    sampler: Any
    grader: Any
    total_steps: int
    probe: tuple[list[int], list[int]]  # (prompt ids, completion ids) used to verify every weight push
    sleep: bool
    out: Path
    step: int = 0
    bad_steps_in_a_row: int = 0
    bad_steps_total: int = 0
    times: dict[str, float] = dataclasses.field(default_factory=dict)  # seconds per phase of the current step
    last_step: Any = None  # the latest Step, for samples.jsonl
    checksum: torch.dtype | None = None  # the engine's dtype where pushes are also checked by weight sums
    adapter: Any = None  # lora.AdapterPush where vLLM applies the LoRA adapter itself (cfg.pushes_adapter)
    merged_push: Any = None  # lora.MergedPush where vLLM gets a LoRA policy merged

    @property
    def reward_weights(self) -> torch.Tensor:
        """`(R,)` the weight of each configured reward, in the order of `cfg.rewards` (and of `score`'s columns)."""
        return torch.tensor(list(self.cfg.rewards.values()), dtype=torch.float32)


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
    probe = weight_sync.make_probe(tokenizer, rows[0]["prompt_ids"])
    run = Run(cfg, rank, world_size, device, tokenizer, engine, reference, llm, rows, sampler, grader, total_steps,
              probe, sleep, out, checksum=None if dtype == torch.float32 else dtype,
              adapter=lora.AdapterPush(out / "vllm-adapter" / f"rank-{rank}") if adapter else None,
              merged_push=lora.MergedPush(cfg.lora_merge_rounding) if cfg.lora_rank and not adapter else None)
    if resume:
        restore(run)
    return run


def load_policy(model: str, dtype: torch.dtype):
    """The policy's weights, loaded straight in the training dtype (every rank loads its own copy).

    DeepSpeed casts the parameters to bfloat16 anyway, and only them (deepspeed/runtime/engine.py,
    `DeepSpeedEngine._configure_distributed_model` calls `_cast_module_mixed_precision`: "Cast params only; preserve
    fp32 buffers"); its float32 master weights are made from those bfloat16 parameters. Loading in bfloat16 gives
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
    run.sampler.load_state_dict(state["sampler"])
    run.bad_steps_total = state.get("bad_steps_total", 0)
    if run.rank == 0:  # steps after the checkpoint will be redone: drop their log lines so each step appears once
        for name in ("metrics.jsonl", "samples.jsonl"):
            truncate_log(run.out / name, run.step)
    # vLLM started from the original weights: give it the restored ones.
    if lora.is_lora(run.engine.module):
        lora.push(run.llm, run.engine.module, run.cfg.zero_stage, adapter=run.adapter)
    else:
        weight_sync.push(run.llm, run.engine.module, run.cfg.zero_stage)
    print0(f"resumed from {path} at step {run.step}")


# ==============================================================================================================
# The training step
# ==============================================================================================================


def train_step(run: Run) -> Step:
    """One Dual-GRPO step on this rank's next batch of B prompts (N = B·G completions); returns what happened."""
    cfg, G = run.cfg, run.cfg.num_generations
    counts_before = reward_counts(run)

    # 1. Rollout (vLLM). Stage 1: G samples per prompt. Stage 2: each sample's long answer in place of its
    #    prompt's context, one new sample from that (None where there is no long answer to put in).
    # 2. Rewards: each configured reward function, and their weighted sum. With dynamic sampling, groups whose
    #    rewards are all equal are replaced by groups of newly drawn prompts, up to `dynamic_sampling_draws` times.
    #    Then vLLM's memory goes to the trainer until step 6 (CUDA sleep mode; nothing happens on the CPU).
    rows, completions, stage2, per_reward, draw_counts = rollout_and_score(run)  # B, N, N entries, (N, R)
    weight_sync.sleep_engine(run.llm, run.sleep)
    reward_means = reward_metrics(run, rows, completions, per_reward, counts_before) | draw_counts
    rewards = per_reward @ run.reward_weights  # (N,)

    # 3. Group-relative advantages: of the weighted sum (CANOE), or the weighted sum of each reward's own
    #    group-normalised advantage (GDPO). Optionally some sequences leave the loss (DAPO): truncated ones, and
    #    groups whose advantages are all 0 (`flat`: only the KL term would train on them).
    if cfg.reward_aggregation == "normalize_then_sum":
        advantages = decoupled_advantages(per_reward, run.reward_weights, G, eps=cfg.advantage_eps,
                                          std=cfg.advantage_std)  # (N,)
    else:
        advantages = group_advantages(rewards, G, eps=cfg.advantage_eps, std=cfg.advantage_std)  # (N,)
    truncated = torch.tensor([c.finish_reason == "length" for c in completions])  # (N,)
    flat = flat_groups(per_reward, run.reward_weights, G, cfg.reward_aggregation)  # (B,) bool: advantages all 0
    kept = trained_sequences(flat, G, truncated, mask_truncated=cfg.mask_truncated,
                             skip_zero_variance_groups=cfg.skip_zero_variance_groups)  # (N,) bool

    # 4. Micro-batches, each packed into one row, and what does not change while training on this rollout:
    #    π_ref (for the KL) and π_old (the policy that sampled, for the ratio) of every sampled token.
    batches = micro_batches(run, rows, completions, advantages, kept)
    totals = loss_denominators(kept, batches)  # None when no rank kept a sequence: nothing to train on
    if totals:
        reference_logprobs(run, batches)
        old_logprobs(run, batches)

    # 5. Loss and backward per micro-batch; DeepSpeed applies the update at the last one of a pass. A pass is
    #    repeated num_iterations (μ) times on the same rollout: from the second pass on, π_θ ≠ π_old.
    #    Differs from CANOE (docs/differences.md, D15): optional loss variants (μ among them), all off by default.
    losses = []
    for _ in range(cfg.num_iterations if totals else 0):
        for batch in batches:
            losses.append(forward_backward(run, batch, totals))
            optimizer_step(run)
        skip_or_stop_on_bad_step(run, [loss for loss, _ in losses[-len(batches):]])

    # 6. Wake vLLM's weights, push the new ones into them and prove that they arrived (the engine is awake again).
    push_seconds, sync_diff, push_metrics = push_and_verify(run)

    run.step += 1
    return Step(rows, completions, stage2, rewards, reward_means, kept, losses, batches, push_seconds, sync_diff,
                flat, push_metrics)


def rollout_and_score(run: Run) -> tuple[list[dict], list, rollout.Stage2, torch.Tensor, dict[str, float]]:
    """This rank's next B prompts, sampled in both stages and scored: rows, N completions, stage 2, `(N, R)`
    scores, and the counts of extra draws and replaced groups (`rollout/` metrics).

    Dynamic sampling (DAPO, Yu et al. 2025, arXiv 2503.14476, section 3.2) with `dynamic_sampling_draws` = D > 0:
    a group whose weighted rewards are all equal has advantages 0 and teaches nothing, so while some rank holds
    such a group and fewer than D extra draws were made, every rank draws its next B prompts and samples and scores
    them; each flat group is replaced, in order, by a new group whose rewards vary (`refills`). Groups still flat
    after D draws stay. The ranks draw together, so their samplers stay in step (and a checkpoint resumes them).
    Differs from CANOE (docs/differences.md, D15): an option, off by default.
    """
    cfg, G = run.cfg, run.cfg.num_generations
    rows = [run.rows[i] for i in run.sampler.next_batch()]  # B prompts
    completions, stage2, per_reward = sample_and_score(run, rows, draw=0)
    counts = {"rollout/extra_draws": 0, "rollout/replaced_groups": 0}
    for draw in range(1, cfg.dynamic_sampling_draws + 1):
        flat = flat_groups(per_reward, run.reward_weights, G, cfg.reward_aggregation)  # (B,)
        (anyone,) = all_reduce_values([float(flat.any())], op=dist.ReduceOp.MAX)
        if not anyone:
            break
        counts["rollout/extra_draws"] += 1
        fresh_rows = [run.rows[i] for i in run.sampler.next_batch()]
        fresh, fresh_stage2, fresh_scores = sample_and_score(run, fresh_rows, draw)
        varied = ~flat_groups(fresh_scores, run.reward_weights, G, cfg.reward_aggregation)  # (B,)
        for slot, source in refills(flat, varied):
            rows[slot] = fresh_rows[source]
            into, out_of = slice(slot * G, (slot + 1) * G), slice(source * G, (source + 1) * G)
            completions[into], per_reward[into] = fresh[out_of], fresh_scores[out_of]
            stage2.problems[into] = fresh_stage2.problems[out_of]
            stage2.completions[into] = fresh_stage2.completions[out_of]
            counts["rollout/replaced_groups"] += 1
        stage2 = dataclasses.replace(stage2, too_long=stage2.too_long + fresh_stage2.too_long)  # over every draw
    return rows, completions, stage2, per_reward, counts


def refills(flat: torch.Tensor, varied: torch.Tensor) -> list[tuple[int, int]]:
    """(slot, source) pairs: the i-th flat group of the batch (`flat`, (B,) bool) is replaced by the i-th varied
    group of a new draw (`varied`, (B,) bool), as far as the varied groups go.

    >>> refills(torch.tensor([True, False, True]), torch.tensor([False, True, True]))
    [(0, 1), (2, 2)]
    """
    return list(zip(flat.nonzero().flatten().tolist(), varied.nonzero().flatten().tolist()))


def sample_and_score(run: Run, rows: list[dict], draw: int) -> tuple[list, rollout.Stage2, torch.Tensor]:
    completions = sample_stage1(run, rows, draw)  # N completions, prompt-major
    stage2 = sample_stage2(run, rows, completions, draw)  # N entries
    return completions, stage2, score(run, rows, completions, stage2)  # (N, R)


def sampling(run: Run, draw: int) -> dict[str, Any]:
    """The sampling settings of a step's `draw`-th rollout (0: the step's own; more only with dynamic sampling).

    Differs from CANOE (docs/differences.md, D8): sampling is seeded per step, stage and rank (and draw).
    """
    cfg = run.cfg
    step = run.step if draw == 0 else f"{run.step}+{draw}"
    return dict(temperature=cfg.temperature, top_p=cfg.top_p, max_tokens=cfg.max_completion_tokens, seed=cfg.seed,
                step=step, rank=run.rank, lora_request=run.adapter.request if run.adapter else None)


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
                                     num_generations=cfg.num_generations, render=render,
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
    sampler: torch.Tensor  # (M, C) vLLM's log-probabilities of the sampled tokens
    ref: torch.Tensor | None = None  # (M, C) π_ref, None when β = 0
    old: torch.Tensor | None = None  # (M, C) π_old, filled in when μ > 1 (else the first pass's own values)


def micro_batches(run: Run, rows: list[dict], completions, advantages: torch.Tensor, kept: torch.Tensor) -> list[Batch]:
    """Micro-batches of prompts_per_device prompts, each packed with every prompt once (packing.py).

    Differs from CANOE (docs/differences.md, D11): each prompt is scored once per micro-batch, not once per
    completion.
    """
    M, G = run.cfg.sequences_per_micro_batch, run.cfg.num_generations
    batches = []
    for start in range(0, len(completions), M):
        part = completions[start : start + M]
        prompts = [rows[(start + i) // G]["prompt_ids"] for i in range(len(part))]
        packed = packing.pack_micro_batch(prompts, [c.token_ids for c in part], run.device)
        mask = packed.completion_mask * kept[start : start + M, None].to(packed.completion_mask)  # (M, C)
        sampler = torch.zeros(mask.shape)  # (M, C)
        for i, c in enumerate(part):
            sampler[i, : len(c.logprobs)] = torch.tensor(c.logprobs)
        batches.append(Batch(start, part, packed, mask, advantages[start : start + M].to(run.device),
                             sampler.to(run.device)))
    return batches


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
    if run.cfg.num_iterations > 1:
        run.engine.train()  # as in the training passes
        for batch in batches:
            batch.old = packing.completion_logprobs(run.engine, batch.packed)


def loss_denominators(kept: torch.Tensor, batches: list[Batch]) -> dict[str, float] | None:
    """Global denominators, so that the micro-batch losses add up to the loss of the whole batch (grpo_loss.py).

    Differs from CANOE (docs/differences.md, D14): the loss does not depend on the micro-batch split.

    DeepSpeed averages gradients over ranks, so each rank's share is scaled to the mean over ranks. None when no
    rank kept any sequence (possible with skip_zero_variance_groups or mask_truncated): the step then trains
    nothing and costs no forward or backward pass.
    """
    local = [float(kept.sum()), float(sum(b.mask.sum() for b in batches))]
    sequences, tokens = (v / dist.get_world_size() for v in all_reduce_values(local))
    return {"total_sequences": sequences, "total_tokens": max(tokens, 1.0)} if sequences else None


@timed("forward_backward")
def forward_backward(run: Run, batch: Batch, totals: dict[str, float]) -> tuple[torch.Tensor, dict]:
    cfg = run.cfg
    run.engine.train()
    logprobs = packing.completion_logprobs(run.engine, batch.packed)  # (M, C)
    old = logprobs.detach() if batch.old is None else batch.old
    loss, metrics = grpo_loss(logprobs, old, batch.ref, batch.advantages, batch.mask, clip_eps_low=cfg.clip_eps_low,
                              clip_eps_high=cfg.clip_eps_high, beta=cfg.beta, aggregation=cfg.aggregation,
                              sampler_logprobs=batch.sampler, importance_cap=cfg.importance_cap,
                              ratio_level=cfg.ratio_level, max_completion_tokens=cfg.max_completion_tokens, **totals)
    # Our loss is already a share of the whole step: DeepSpeed must not divide it by the accumulation steps.
    run.engine.backward(loss, scale_wrt_gas=False)
    metrics["vllm_gap"] = vllm_gap(batch, old)
    return loss.detach(), metrics


@timed("optimizer")
def optimizer_step(run: Run) -> None:
    run.engine.step()  # applies the update only at the last micro-batch of a pass (the accumulation boundary)


def vllm_gap(batch: Batch, trainer: torch.Tensor) -> float:
    """Mean |vLLM sampling logprob − trainer logprob (π_old)| over the completion tokens of a micro-batch."""
    mask = batch.packed.completion_mask  # (M, C), every completion token, kept or not
    return float(((batch.sampler - trainer.float()).abs() * mask).sum() / mask.sum().clamp(min=1))


def skip_or_stop_on_bad_step(run: Run, losses: list[torch.Tensor]) -> None:
    """Count a step whose update DeepSpeed skipped, and stop when `max_bad_steps` come in a row.

    DeepSpeed skips an update with non-finite gradients without a word (ZeRO-1/2: deepspeed/runtime/zero/
    stage_1_and_2.py, `DeepSpeedZeroOptimizer.step`; ZeRO-3: runtime/zero/stage3.py,
    `DeepSpeedZeroOptimizer_Stage3.step`), and then `was_step_applied()` is False and the LR schedule stalls
    (runtime/engine.py, `DeepSpeedEngine._take_model_step`). A finite loss can have non-finite gradients, so the
    skip is read from the engine, reduced over ranks with the loss check.
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


@timed("weight_push")
def push_and_verify(run: Run) -> tuple[float, float, dict[str, float]]:
    """Push the weights into vLLM, then compare vLLM's and the trainer's logprobs of the probe completion; raises
    weight_sync.WeightSyncError when they disagree. Returns (push seconds, max |difference|, more sync/ metrics).
    Outside float32 the probe's tolerance must leave room for two sets of bf16 kernels, so the weights' sums are
    compared too (weight_sync.check_weight_sums: exact, blind to the kernels), and a merged LoRA push logs how much
    of the adapters' update reaches vLLM (lora.MergedPush).

    With sleep mode the engine arrives asleep (step 1 put it to sleep): its weights are woken first, because a
    push into a sleeping engine faults on unmapped memory (or, at level 1, is undone by the host copy put back at
    wake-up), then the KV cache, which the probe needs. The engine leaves awake, ready for the next rollout.

    Differs from CANOE (docs/differences.md, D7): every weight push into vLLM is verified.
    """
    weight_sync.wake_weights(run.llm, run.sleep)
    sums = weight_sync.WeightSums()
    summing = {"sums": sums if run.checksum else None, "dtype": run.checksum}
    if lora.is_lora(run.engine.module):  # the merged adapted projections, or the adapter (and W after a sleep)
        push_seconds = lora.push(run.llm, run.engine.module, run.cfg.zero_stage, adapter=run.adapter, base=run.sleep,
                                 merged_push=run.merged_push, **summing)
    else:
        push_seconds = weight_sync.push(run.llm, run.engine.module, run.cfg.zero_stage, **summing)
    if run.adapter:  # part of time/weight_push: the adapter's folder written and read back
        run.times["adapter_push"] = run.adapter.seconds
    more = run.merged_push.metrics() if run.merged_push else {}  # outside float32: how much of the update arrives
    if run.checksum:
        engine_sums = weight_sync.engine_weight_sums(run.llm, sums.scope)  # over what the push sent
        more["sync/weight_sums_gap"] = weight_sync.check_weight_sums(sums, engine_sums)
    weight_sync.wake_kv_cache(run.llm, run.sleep)
    prompt, completion = run.probe
    run.engine.eval()
    with torch.no_grad():
        trainer = packing.completion_logprobs(run.engine, packing.pack([(prompt, [completion])], run.device))[0]
    run.engine.train()
    vllm = weight_sync.vllm_token_logprobs(run.llm, prompt, completion, run.adapter.request if run.adapter else None)
    return push_seconds, weight_sync.check_sync(vllm, trainer, run.cfg.push_tolerance(run.checksum or torch.float32)), more


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
            state = {"step": run.step, "sampler": run.sampler.state_dict(), "bad_steps_total": run.bad_steps_total}
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
