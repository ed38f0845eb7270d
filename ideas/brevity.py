"""A reward idea in a file of its own: a short `<answer>` pays. A config names this file in `reward_files` and the
reward in `[rewards]` (recipes/brevity.toml); no other run loads it (docs/reward-ideas.md)."""

from grading.tags import tag_content
from rewards import REWARD_FUNCS


def brevity_reward(completions: list, **kwargs) -> list[float]:
    """1.0 when the `<answer>` has one to five words; 0.0 when it is missing or empty, or the text is None."""
    answers = [tag_content(c[0]["content"] or "", "answer") for c in completions]
    return [1.0 if answer and len(answer.split()) <= 5 else 0.0 for answer in answers]


REWARD_FUNCS["brevity"] = brevity_reward
