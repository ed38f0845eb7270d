"""The rewards of a step: every configured reward function called on the completions, and the logged means.

canoe.py calls `reward_counts` before a step's first rollout, `score` on each draw, `reward_metrics` once on the batch
it trains on (so the counts cover every draw).
"""

from __future__ import annotations

import torch

import data
from grpo_loss import zero_variance_groups
from rewards import REWARD_FUNCS, REWARD_ISSUES
from training.metrics import timed


def reward_columns(rows: list[dict], G: int) -> dict[str, list]:
    """Every dataset field of any row (in order of first appearance) as a column with one value per completion
    (N = B·G), None where a row lacks it."""
    keys = list(dict.fromkeys(key for row in rows for key in row if key != "prompt_ids"))
    return {key: [row.get(key) for row in rows for _ in range(G)] for key in keys}


@timed("rewards")
def score(run, rows: list[dict], completions, stage2) -> torch.Tensor:
    """The per-reward scores `(N, R)` of `cfg.rewards`, each called with the dataset fields as columns and the
    stage-2 completions as `completions_long_answer`. A reward that raises stops the run (malformed inputs are
    the rewards' to score 0 and count in REWARD_ISSUES)."""
    names = list(run.cfg.rewards)
    columns = reward_columns(rows, run.cfg.num_generations)
    messages = [[{"role": "assistant", "content": c.text}] for c in completions]
    long_answer = [None if c is None else [{"role": "assistant", "content": c.text}] for c in stage2.completions]
    per_reward = torch.zeros(len(completions), len(names))  # (N, R)
    for j, name in enumerate(names):
        scores = REWARD_FUNCS[name](messages, completions_long_answer=long_answer, grader=run.grader,
                                    log_dir=str(run.out), **columns)
        per_reward[:, j] = torch.tensor(scores, dtype=torch.float32)
    return per_reward


def reward_counts(run) -> tuple[int, int, int]:
    """The running counts of malformed reward inputs, grader timeouts and grader errors."""
    return sum(REWARD_ISSUES.values()), run.grader.timeouts, run.grader.errors


def reward_metrics(run, rows: list[dict], completions, per_reward: torch.Tensor,
                   counts_before: tuple[int, int, int]) -> dict[str, float]:
    """The logged means of the trained batch's rewards `(N, R)`, the counts since `counts_before`, and
    `signal/<name>`: the share of groups in which that reward varies (GRPO learns nothing where it does not)."""
    G, names = run.cfg.num_generations, list(run.cfg.rewards)
    means = {f"reward/{name}": float(per_reward[:, j].mean()) for j, name in enumerate(names)}
    varies = (~zero_variance_groups(per_reward, G)).float().mean(dim=0)  # (R,) share of the B groups
    means |= {f"signal/{name}": float(varies[j]) for j, name in enumerate(names)}
    issues, timeouts, errors = (now - before for now, before in zip(reward_counts(run), counts_before))
    means |= {"reward/issues": issues, "reward/timeouts": timeouts,
              "reward/grader_errors": errors}  # grader errors: a worker raised, string match decided
    # The evaluation metric, watched during training: normalised exact match of the stage-1 answers.
    solutions = [row.get("solution") for row in rows for _ in range(G)]
    em = [data.exact_match(data.answer_span(c.text), data.answer_span(s)) for c, s in zip(completions, solutions)]
    means["faithfulness/em"] = sum(em) / len(em)
    return means
