"""canoe.reward_metrics' per-step counters: grading-worker errors reach the step's reward means (metrics.jsonl)."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import canoe
from config import Config
from rollout import Completion, Rollout, Stage2


class FailingGrader:
    """A MathGrader whose workers raise on every math pair: each pair counts one error (and falls back to False)."""

    def __init__(self) -> None:
        self.timeouts, self.errors = 0, 5  # errors from earlier steps must not count again

    def equivalent_batch(self, golds: list[str], preds: list[str]) -> list[bool]:
        self.errors += sum(gold != pred for gold, pred in zip(golds, preds))  # equal spans never reach a worker
        return [gold == pred for gold, pred in zip(golds, preds)]


def test_grader_errors_are_logged_per_step(tmp_path: Path):
    run = SimpleNamespace(cfg=Config(num_generations=2, rewards={"accuracy": 1.0}), grader=FailingGrader(),
                          out=tmp_path, times={})
    rows = [{"prompt_ids": [1], "problem": "<context>c</context>\n\nq", "solution": "<answer>x+1</answer>"}]
    completions = [Completion("<answer>1+x</answer>", (1,), (-0.1,), "stop"),
                   Completion("<answer>x+1</answer>", (1,), (-0.1,), "stop")]
    before = canoe.reward_counts(run)
    scores = canoe.score(run.cfg.rewards, rows, completions, [None, None], 2, grader=run.grader,
                         log_dir=str(tmp_path))  # (2, 1)
    means = canoe.reward_metrics(run, Rollout(rows, completions, Stage2.none(2), scores), before)
    # "1+x" against "x+1" goes to a worker, which raises (one error); the identical pair needs no worker
    assert means["reward/grader_errors"] == 1
    assert means["reward/timeouts"] == 0
