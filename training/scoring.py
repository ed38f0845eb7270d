"""The logged means of a step's rewards: canoe.run_step takes `reward_counts` before the step's first rollout, so
that the counts cover every draw of the step, and `reward_metrics` of the batch it trained on."""

from __future__ import annotations

import data
from grpo_loss import zero_variance_groups
from rewards import REWARD_ISSUES


def reward_counts(run) -> tuple[int, int, int]:
    """The running counts of malformed reward inputs, grader timeouts and grader errors."""
    return sum(REWARD_ISSUES.values()), run.grader.timeouts, run.grader.errors


def reward_metrics(run, batch, counts_before: tuple[int, int, int]) -> dict[str, float]:
    """The logged means of the trained batch's rewards (`batch`: a rollout.Rollout), the counts since
    `counts_before`, and `signal/<name>`: the share of groups in which that reward varies (GRPO learns nothing where
    it does not)."""
    G, names = run.cfg.num_generations, list(run.cfg.rewards)
    rows, completions, per_reward = batch.rows, batch.completions, batch.scores
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
