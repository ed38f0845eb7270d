"""The gradient DeepSpeed applies is the whole batch's, however the batch is split into micro-batches and ranks.

`canoe.train_step` hands DeepSpeed micro-batch losses that are already shares of the whole batch's loss: each is
divided by the batch's sequence count over the ranks (`canoe.loss_denominators`), so DeepSpeed's average over ranks
restores the sum, and `engine.backward(loss, scale_wrt_gas=False)` keeps DeepSpeed from dividing by the
accumulation steps again. Either slip halves the gradient, which AdamW's first step, m/√v ≈ sign(g), would hide
from every check of the weights; so this test reads the gradient itself.

One fixed batch (B = 4 prompts × G = 3 completions, fixed rewards) is trained for one step of the real driver
(`canoe.load_models`, `canoe.train_step` from the rewards on) in each of WAYS, each in processes of its own (this
file, run as a script; test_collectives.run_ranks). At the accumulation boundary, before DeepSpeed's optimizer step,
each way reads the full gradient DeepSpeed holds (`deepspeed.utils.safe_get_full_grad`: ZeRO-2's reduced partition
or ZeRO-3's fp32 partition, gathered; "only available immediately after backward and before engine step",
utils/tensor_fragment.py). Each must equal plain autograd of the whole batch's loss, one unpacked sequence at a
time, to float32 round-off. A fifth way turns truncated importance sampling on, with sampler log-probabilities that
make its weights far from 1 and its cap bind on half the tokens.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
from pathlib import Path

if __name__ == "__main__":  # a way's process computes on the CPU wherever it runs, as the comparison does
    os.environ["CUDA_VISIBLE_DEVICES"] = ""

import pytest  # noqa: E402
import torch  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from test_collectives import run_ranks  # noqa: E402
from test_sleep_order import tiny_model  # noqa: E402

G, TEMPERATURE = 3, 0.9
PROMPTS = [[1, 5, 9], [2, 6, 10, 14, 18], [3, 7], [4, 8, 12, 16]]  # B = 4 prompts
COMPLETIONS = [[20, 21, 22, 23], [24], [25, 26], [27, 28, 29], [30, 31], [32],  # N = 12, G = 3 per prompt,
               [33, 34, 35, 36, 37], [38], [39, 40], [41, 42], [43, 44, 45], [46, 47, 48, 49]]  # of 1 to 5 tokens
REWARDS = [1.0, 0.0, 0.0, 0.0, 1.0, 1.0, 1.0, 0.0, 1.0, 0.0, 0.0, 1.0]  # (N,), no group constant
# The sampler's log-probability of each token, by its position in its completion: π_old ≈ 1/64 at the start, so the
# truncated importance weight min(π_old / π_sampler, C) is about e^-2 at even positions and capped at odd ones.
SAMPLER_LOGPROBS = [-2.0, -9.0] * 3
CAP = 2.0

# world: ranks; each rank trains its B / world prompts in `gradient_accumulation_steps` micro-batches
WAYS = {
    "1 rank": dict(world=1, prompts_per_device=4, gradient_accumulation_steps=1, zero_stage=2),
    "1 rank, accumulation 2": dict(world=1, prompts_per_device=2, gradient_accumulation_steps=2, zero_stage=2),
    "2 ranks": dict(world=2, prompts_per_device=2, gradient_accumulation_steps=1, zero_stage=2),
    "2 ranks, ZeRO-3, accumulation 2": dict(world=2, prompts_per_device=1, gradient_accumulation_steps=2,
                                            zero_stage=3),
    # the same update weighted by truncated importance sampling, with a cap that binds
    "1 rank, accumulation 2, importance cap": dict(world=1, prompts_per_device=2, gradient_accumulation_steps=2,
                                                   zero_stage=2, importance_cap=CAP),
}


def whole_batch_gradients(model: torch.nn.Module, cap: float) -> tuple[dict[str, torch.Tensor], int]:
    """∇ of the whole batch's loss by plain autograd, each sequence alone and unpacked, and the capped tokens. With
    μ = 1 the ratio is 1 (π_old is π_θ detached), so the clipped surrogate's gradient is that of
    L = -(1/N) Σ_i A_i · mean_t w_it log π(o_it), π = softmax(logits / T), w = 1 or, with a `cap`,
    min(π_old / π_sampler, cap); the k3 KL's gradient, β(1 − π_ref/π_θ), is 0 at π_θ = π_ref."""
    model.zero_grad()
    rewards = torch.tensor(REWARDS).reshape(-1, G)  # (B, G)
    A = ((rewards - rewards.mean(1, keepdim=True)) / (rewards.std(1, keepdim=True) + 1e-4)).reshape(-1)  # (N,)
    loss, capped = torch.zeros(()), 0
    for i, completion in enumerate(COMPLETIONS):
        ids = torch.tensor([PROMPTS[i // G] + completion])  # (1, P + C)
        logits = model(input_ids=ids).logits[0, len(PROMPTS[i // G]) - 1 : -1] / TEMPERATURE  # (C, V)
        logp = torch.log_softmax(logits, -1).gather(1, torch.tensor(completion)[:, None])[:, 0]  # (C,)
        w = torch.ones_like(logp)  # (C,)
        if cap:
            w = (logp.detach() - torch.tensor(SAMPLER_LOGPROBS[: len(completion)])).exp()  # (C,)
            capped += int((w > cap).sum())
            w = w.clamp(max=cap)
        loss = loss - A[i] * (w * logp).mean() / len(COMPLETIONS)
    loss.backward()
    return {name: p.grad.clone() for name, p in model.named_parameters()}, capped


@pytest.fixture(scope="module")
def expected(tmp_path_factory) -> tuple[Path, dict[float, tuple[dict[str, torch.Tensor], int]]]:
    """The tiny model, saved for the ways to load, and its whole-batch gradient without and with the cap."""
    folder = tmp_path_factory.mktemp("tiny-model")
    model = tiny_model()
    model.save_pretrained(folder)
    return folder, {cap: whole_batch_gradients(model, cap) for cap in (0.0, CAP)}


@pytest.fixture(scope="module")
def applied(expected) -> dict[str, list[dict]]:
    """Each way's result per rank: the gradient rank 0 read at the boundary, and what the ranks counted. The ways
    of a world size share its processes (imports cost more than the steps); ZeRO-3 comes last in them."""
    results = {}
    for world in (1, 2):
        ways = [way for way in WAYS if WAYS[way]["world"] == world]
        ranks = run_ranks(json.dumps({"ways": ways, "model": str(expected[0])}), world, script=__file__)
        results |= {way: [result[way] for result in ranks] for way in ways}
    return results


def gradients(result: dict, like: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    return {name: torch.tensor(result["gradients"][name]).reshape(like[name].shape) for name in like}


@pytest.mark.parametrize("way", WAYS)
def test_the_gradient_at_the_boundary_is_the_whole_batchs(way, expected, applied):
    want, capped = expected[1][WAYS[way].get("importance_cap", 0.0)]
    ranks = applied[way]
    for result in ranks:  # one boundary, at the last micro-batch; no rank skipped its update
        assert result["micro_batches"] == WAYS[way]["gradient_accumulation_steps"]
        assert result["boundaries"] == 1 and result["global_steps"] == 1 and result["step_applied"]
    assert sum(result["capped"] for result in ranks) == capped  # 0 without a cap
    if capped:  # the weights move the gradient far beyond the tolerance below: a correction that did nothing fails
        unweighted = expected[1][0.0][0]
        assert sum((want[n] - unweighted[n]).norm() for n in want) > 0.1 * sum(g.norm() for g in want.values())
    got = gradients(ranks[0], want)
    assert got.keys() == want.keys()
    scale = max(g.abs().max() for g in want.values())
    assert scale > 1e-3  # the batch has a gradient to get wrong
    for name in want:  # float32 round-off (2e-7 × scale measured): packed vs one by one, sums in another order
        torch.testing.assert_close(got[name], want[name], rtol=1e-5, atol=1e-6 * scale, msg=lambda m: f"{name}: {m}")


def test_the_four_ways_agree(expected, applied):
    want, _ = expected[1][0.0]
    scale = max(g.abs().max() for g in want.values())
    ways = [way for way in WAYS if "importance_cap" not in WAYS[way]]
    first, *others = [gradients(applied[way][0], want) for way in ways]
    for way, other in zip(ways[1:], others):
        for name in want:
            torch.testing.assert_close(other[name], first[name], rtol=1e-5, atol=1e-6 * scale,
                                       msg=lambda m: f"{way}, {name}: {m}")


# ------------------------------------------------------------------------------------------- one way, one rank


class NoPush:
    """Step 6 without vLLM: nothing to push into (this test reads the update, not the push)."""

    sleep = False

    def __call__(self, engine) -> dict:
        return {}


def train_one_step(way: str, model: str) -> dict:
    """This rank's share of the batch trained for one step of `canoe.train_step` on an engine of `canoe.load_models`;
    returns the full gradient read when the boundary's `engine.step` begins (on rank 0) and the counts."""
    import deepspeed.utils

    import canoe
    import rollout
    from config import Config
    from plumbing import runtime
    from variants import Variants

    settings = dict(WAYS[way])
    world = settings.pop("world")
    cfg = Config(model=model, dtype="float32", num_generations=G, temperature=TEMPERATURE, rewards={"accuracy": 1.0},
                 max_completion_tokens=8, **settings)
    rank, world_size = runtime.init_distributed(cfg.dist_timeout_minutes)
    assert world_size == world
    engine, reference = canoe.load_models(cfg, torch.float32, torch.device("cpu"), world_size, total_steps=1)
    mine = range(rank * cfg.prompts_per_step, (rank + 1) * cfg.prompts_per_step)  # this rank's prompts
    rows = [{"prompt_ids": PROMPTS[b]} for b in mine]
    completions = [rollout.Completion("", tuple(COMPLETIONS[i]), tuple(SAMPLER_LOGPROBS[: len(COMPLETIONS[i])]), "stop")
                   for b in mine for i in range(b * G, (b + 1) * G)]
    scores = torch.tensor([REWARDS[i] for b in mine for i in range(b * G, (b + 1) * G)])[:, None]  # (N_rank, 1)
    batch = rollout.Rollout(rows, completions, rollout.Stage2.none(len(completions)), scores)
    run = canoe.Run(cfg, rank, world_size, torch.device("cpu"), None, engine, reference, None, rows, None, None, 1,
                    Variants.create(cfg), NoPush(), Path(tempfile.mkdtemp()))
    canoe.rollout_batch = lambda run, draw=0: batch  # the step samples and scores this batch

    seen = {"micro_batches": 0, "boundaries": 0}
    engine_step = engine.step

    def step_reading_the_gradient(*args, **kwargs):
        seen["micro_batches"] += 1
        if engine.is_gradient_accumulation_boundary():  # every rank: the reads are collectives
            seen["boundaries"] += 1
            seen["gradients"] = {name: deepspeed.utils.safe_get_full_grad(p).flatten().tolist()
                                 for name, p in engine.module.named_parameters()}
        return engine_step(*args, **kwargs)

    engine.step = step_reading_the_gradient
    step = canoe.train_step(run)
    result = {**seen, "global_steps": engine.global_steps, "step_applied": engine.was_step_applied(),
              "capped": int(sum(metrics["importance_capped"] for _, metrics in step.losses))}
    return result if rank == 0 else {k: v for k, v in result.items() if k != "gradients"}


if __name__ == "__main__":
    from plumbing import runtime

    scenario = json.loads(sys.argv[1])
    print("RESULT " + json.dumps({way: train_one_step(way, scenario["model"]) for way in scenario["ways"]}), flush=True)
    runtime.leave_process_group()
