"""Dynamic sampling (variants.dynamic_sampling): flat groups are replaced by varied groups of newly drawn prompts.

The rollouts are stand-ins (a table of scripted rewards per prompt) and the all-reduce a stand-in that can say
another rank still holds a flat group (the ranks' agreement is tested here only); the real path runs end to end on
one rank in tests/test_train.py (test_dynamic_sampling_draws_again_and_the_sampler_counts_every_draw).
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

import variants
from config import Config
from data import PromptSampler
from rollout import Completion, Rollout, Stage2

G = 3
# The rewards each prompt's G samples get in the stand-in rollout: prompts 1, 2, 4 and 6 give flat groups.
SCRIPT = {0: [1.0, 0.0, 2.0], 1: [1.0, 1.0, 1.0], 2: [0.0, 0.0, 0.0], 3: [2.0, 1.0, 1.0], 4: [3.0, 3.0, 3.0],
          5: [0.0, 1.0, 0.0], 6: [2.0, 2.0, 2.0], 7: [1.0, 2.0, 3.0]}


@pytest.fixture
def scripted(monkeypatch):
    """A Run over 8 prompts drawn in file order, B prompts a step, whose rollouts follow SCRIPT; returns
    (make_run, the draws made)."""
    draws = []

    def rollout(run, draw=0):
        rows = [run.rows[i] for i in run.prompt_sampler.next_batch()]
        draws.append(([row["index"] for row in rows], draw))
        completions = [Completion(f"p{row['index']} s{i}", (row["index"],), (-0.5,), "stop") for row in rows for i in range(G)]
        stage2 = Stage2([f"problem {row['index']}" for row in rows for _ in range(G)], [None] * len(completions), 1)
        return Rollout(rows, completions, stage2, torch.tensor([SCRIPT[row["index"]] for row in rows]).reshape(-1, 1))

    def all_reduce_values(values, op):  # this rank's flag, or 1 when another rank is said to hold a flat group
        return [max(values[0], float(other_rank_flat[0]))]

    other_rank_flat = [False]
    monkeypatch.setattr(variants, "all_reduce_values", all_reduce_values)

    def make_run(B: int, D: int, other_flat: bool = False):
        """(the run, its rollout as canoe.train_step draws it)"""
        other_rank_flat[0] = other_flat
        sampler = PromptSampler(8, B, seed=0)
        sampler.epoch_order = lambda epoch: list(range(8))  # file order, so the script reads top to bottom
        cfg = Config(num_generations=G, prompts_per_device=B, dynamic_sampling_draws=D, rewards={"accuracy": 1.0})
        run = SimpleNamespace(cfg=cfg, rows=[{"index": i} for i in range(8)], prompt_sampler=sampler, step=0)

        def sample(run):  # canoe.train_step's first draw, and dynamic sampling when the config turns it on
            batch = rollout(run)
            return variants.dynamic_sampling(run, batch, rollout) if run.cfg.dynamic_sampling_draws else batch

        return run, sample

    return make_run, draws


def test_flat_groups_are_replaced_in_order_by_varied_groups_of_new_draws(scripted):
    make_run, draws = scripted
    run, rollout = make_run(B=4, D=2)
    batch = rollout(run)
    rows, completions, stage2, scores, counts = batch.rows, batch.completions, batch.stage2, batch.scores, batch.metrics
    # first draw 0-3 (1 and 2 flat); the second draw 4-7 has varied groups 5 and 7: 5 replaces 1, 7 replaces 2
    assert draws == [([0, 1, 2, 3], 0), ([4, 5, 6, 7], 1)]
    assert [row["index"] for row in rows] == [0, 5, 7, 3]
    assert scores.flatten().tolist() == SCRIPT[0] + SCRIPT[5] + SCRIPT[7] + SCRIPT[3]
    assert [c.text for c in completions[3:6]] == ["p5 s0", "p5 s1", "p5 s2"]  # the completions moved with them
    assert stage2.problems[6:9] == ["problem 7"] * 3 and stage2.too_long == 2  # counted over both draws
    assert counts == {"rollout/extra_draws": 1, "rollout/replaced_groups": 2}  # no flat group left: no third draw


def test_draws_stop_at_the_limit_and_flat_groups_stay(scripted):
    make_run, draws = scripted
    run, rollout = make_run(B=1, D=2)
    run.prompt_sampler.next_batch()  # start at prompt 1: flat, and so are 2 (the first extra draw); 3 varies
    batch = rollout(run)
    rows, counts = batch.rows, batch.metrics
    assert [row["index"] for row in rows] == [3] and counts == {"rollout/extra_draws": 2, "rollout/replaced_groups": 1}
    assert draws == [([1], 0), ([2], 1), ([3], 2)]

    draws.clear()
    run, rollout = make_run(B=1, D=1)
    run.prompt_sampler.next_batch()
    batch = rollout(run)
    rows, scores, counts = batch.rows, batch.scores, batch.metrics
    assert [row["index"] for row in rows] == [1] and scores.flatten().tolist() == SCRIPT[1]  # one draw, still flat
    assert counts == {"rollout/extra_draws": 1, "rollout/replaced_groups": 0}


def test_off_by_default_and_every_rank_draws_while_any_rank_needs_to(scripted):
    make_run, draws = scripted
    run, rollout = make_run(B=1, D=0)
    run.prompt_sampler.next_batch()  # prompt 1, flat: with D = 0 the rollout is the plain one and nothing more is drawn
    batch = rollout(run)
    assert [row["index"] for row in batch.rows] == [1] and draws == [([1], 0)] and batch.metrics == {}

    draws.clear()
    run, rollout = make_run(B=1, D=2, other_flat=True)  # this rank's group varies (prompt 0), another's does not
    batch = rollout(run)
    rows, counts = batch.rows, batch.metrics
    assert draws == [([0], 0), ([1], 1), ([2], 2)]  # drawn in step with the other rank (the samplers stay aligned)
    assert [row["index"] for row in rows] == [0] and counts == {"rollout/extra_draws": 2, "rollout/replaced_groups": 0}
    assert run.prompt_sampler.position == 3


@pytest.mark.parametrize("rule", ["sum_then_normalize", "normalize_then_sum"])
def test_a_group_is_flat_when_its_advantages_are_all_equal(rule):
    scores = torch.tensor([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0], [1.0, 1.0], [0.0, 2.0], [0.0, 3.0]])  # (N = 3·2, R = 2)
    for weights, flat in {"sum_then_normalize": [([1.0, 1.0], [True, True, False])],  # sums 1, 1 | 2, 2 | 2, 3
                          # GDPO: in group 0 both rewards vary but their advantages cancel in the sum; a reward of
                          # weight 0 gives no advantage
                          "normalize_then_sum": [([1.0, 1.0], [True, True, False]), ([0.0, 1.0], [False, True, False]),
                                                 ([1.0, 0.0], [False, True, True])]}[rule]:
        chosen = Config(advantage_rule=rule, num_generations=2, rewards={"accuracy": weights[0], "format": weights[1]})
        weights = chosen.reward_weights  # as canoe.train_step computes the advantages
        advantages = variants.ADVANTAGE_RULES[rule](scores @ weights, scores, weights, 2, chosen.advantage_eps,
                                                    chosen.advantage_std).reshape(3, 2)  # (B, G)
        assert variants.flat_groups(scores, chosen).tolist() == flat
        for group, is_flat in enumerate(flat):  # flat: the group's advantages are equal; else they differ
            assert (advantages[group, 0] == advantages[group, 1]) == is_flat
