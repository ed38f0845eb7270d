"""The rewards of `REWARD_FUNCS` (CANOE's four and an optional fifth, `grounding`), `score`, which calls the
configured ones on a rollout, and the R1-Zero math reward, which is not registered (its docstring says why).

A reward is `fn(completions, <dataset columns it needs>, **kwargs) -> list[float]`: `completions` holds one list of
chat messages per sample, whose first `content` is the text; adding one is that function and a line in
`REWARD_FUNCS`, in a file of its own under ideas/ that a config names (docs/reward-ideas.md). The rules are the original CANOE code's (`open_r1/grpo.py`), stated in full in docs/DESIGN.md:

| name        | 1.0 when                                                                                         |
|-------------|--------------------------------------------------------------------------------------------------|
| `accuracy`  | the answer span equals the solution's, as a string or mathematically (grader.MathGrader)          |
| `format`    | the text is exactly `<think>..</think> <long_answer>..</long_answer> <answer>..</answer>`         |
| `influence` | the stage-2 completion (regenerated from the long answer alone) has the solution's answer span    |
| `length`    | the long answer is strictly between 20% and 80% of the context, in characters                    |
| `grounding` | the `<answer>` is at most 12 words and a span of the context (not CANOE's: D22)                    |

The *answer span* of a text (`tags.answer_span`) is its first `<answer>...</answer>` stripped, else the whole text
stripped. Malformed input (not a list, a None text, a missing tag, a column of the wrong length) scores 0.0 for
the samples concerned, and shape errors are counted in `REWARD_ISSUES`; an exception from a reward's own code is a
bug and stops the run. `DEBUG_MODE=true` logs accuracy and influence per sample, as the original does (`LOG_PATH`,
else the run folder).
"""

from __future__ import annotations

import logging
import os
import re
from collections import Counter
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any, Callable

import torch

from grading.grader import MathGrader, default_grader
from grading.r1_grader import last_boxed, r1_grade
from grading.tags import answer_span, tag_content

logger = logging.getLogger(__name__)

# Counted problems, keyed "<reward>/malformed" (input not in the documented shape) and "debug_log/error" (the
# DEBUG_MODE log could not be written). The trainer logs their sum per step as `reward/issues`.
REWARD_ISSUES: Counter[str] = Counter()


def _note(key: str, detail: str, error: BaseException | None = None) -> None:
    REWARD_ISSUES[key] += 1
    if REWARD_ISSUES[key] == 1:  # log the first of each kind; the counter carries the rest
        logger.warning("reward %s: %s (further ones only counted in REWARD_ISSUES)", key, detail, exc_info=error)


# ------------------------------------------------------------------------------------------------ input shapes


def _entries(completions: Any, reward: str) -> list | None:
    """`completions` as a list of entries; None (counted) when it is not a list at all."""
    if isinstance(completions, Sequence) and not isinstance(completions, str):
        return list(completions)
    _note(f"{reward}/malformed", f"completions is a {type(completions).__name__}, not a list")
    return None


def _completion_text(completion: Any) -> str | None:
    """The text of one completion entry (a list of messages, first one's content); None if not in that shape."""
    if isinstance(completion, Sequence) and not isinstance(completion, str) and completion:
        message = completion[0]
        if isinstance(message, Mapping) and isinstance(message.get("content"), str):
            return message["content"]
    return None


def _texts(entries: list, reward: str) -> list[str | None]:
    texts = [_completion_text(c) for c in entries]
    if None in texts:
        _note(f"{reward}/malformed", "a completion is not a list of messages with a string 'content'")
    return texts


def _column(values: Any, n: int, reward: str, name: str) -> list[Any]:
    """A dataset column as a list of n values, padded with None if it is short (and counted)."""
    values = list(values) if isinstance(values, Sequence) and not isinstance(values, str) else []
    if len(values) != n:
        _note(f"{reward}/malformed", f"'{name}' has {len(values)} entries for {n} completions")
        values = (values + [None] * n)[:n]
    return values


# ------------------------------------------------------------------------------------------------ debug log


def _debug_log(file_name: str, header: str, rewards: list[float], contents: list, solutions: list,
               log_dir: Any) -> None:
    """Append one block per sample when DEBUG_MODE=true (the original's debug log). A log that cannot be written is
    counted and logged, not raised: it is a diagnostic, not part of the reward."""
    if os.environ.get("DEBUG_MODE") != "true":
        return
    path = os.environ.get("LOG_PATH") or os.path.join(str(log_dir) if log_dir else ".", file_name)
    now = datetime.now().strftime("%Y-%m-%d %H:%M:%S.%f")
    try:
        # backslashreplace: a lone surrogate in a completion must not stop the log (or the reward)
        with open(path, "a", encoding="utf-8", errors="backslashreplace") as log:
            for reward, content, solution in zip(rewards, contents, solutions):
                log.write(f"------------- {now} {header}: {reward} -------------\n")
                log.write(f"Content: {content}\nSolution: {solution}\n\n")
    except OSError as error:
        _note("debug_log/error", f"cannot write {path}", error)


# ------------------------------------------------------------------------------------------------ rewards


def accuracy_reward(completions: list, solution: list, grader: MathGrader | None = None, log_dir: str | None = None,
                    **kwargs: Any) -> list[float]:
    """1.0 if the completion's answer span equals the solution's, as a string or mathematically, else 0.0.

    Differs from CANOE (docs/differences.md, D1): only the answer spans are graded, gold first (`verify(gold, pred)`).
    Mathematical equivalence comes from `grader` (a `grader.MathGrader`, hard per-sample deadline, timed-out samples
    fall back to string match), else from the process-wide `grader.default_grader()`, created on first use.
    """
    entries = _entries(completions, "accuracy")
    if entries is None:
        return []
    texts = _texts(entries, "accuracy")
    solutions = _column(solution, len(texts), "accuracy", "solution")
    graded = [i for i, (text, gold) in enumerate(zip(texts, solutions)) if text is not None and isinstance(gold, str)]
    golds, preds = [answer_span(solutions[i]) for i in graded], [answer_span(texts[i]) for i in graded]
    # Machinery: True where CANOE's math_equal holds, False past the deadline (grading/grader.py).
    verdicts = (grader or default_grader()).equivalent_batch(golds, preds) if graded else []
    verdict = dict(zip(graded, verdicts))
    rewards = [1.0 if verdict.get(i) else 0.0 for i in range(len(texts))]
    _debug_log("accuracy_reward.log", "Accuracy reward", rewards, texts, solutions, log_dir)
    return rewards


_FORMAT_THINK_END = re.compile(r"</think>\s*<long_answer>")
_FORMAT_LONG_END = re.compile(r"</long_answer>\s*<answer>")


def _has_format(text: str) -> bool:
    """Whether the stripped text fully matches (DOTALL) the format pattern, decided in linear time:
    `<think>.*?</think>\\s*<long_answer>.*?</long_answer>\\s*<answer>.*?</answer>`.

    The lazy regex backtracks polynomially on hostile text with many tags. Taking the earliest
    `</think>\\s*<long_answer>` and then the earliest `</long_answer>\\s*<answer>` is exact: a later choice only
    leaves less room for the rest, and the text must end with `</answer>`.
    """
    if not text.startswith("<think>") or not text.endswith("</answer>"):
        return False
    think_end = _FORMAT_THINK_END.search(text, len("<think>"))
    if think_end is None:
        return False
    long_end = _FORMAT_LONG_END.search(text, think_end.end())
    return long_end is not None and long_end.end() <= len(text) - len("</answer>")


def format_reward(completions: list, **kwargs: Any) -> list[float]:
    """1.0 iff the text is exactly think, long answer, answer blocks, only whitespace between them (tags are
    case-sensitive). Differs from CANOE (docs/differences.md, D5): the outer whitespace is stripped first."""
    entries = _entries(completions, "format")
    if entries is None:
        return []
    return [1.0 if text is not None and _has_format(text.strip()) else 0.0 for text in _texts(entries, "format")]


def influence_reward(completions: list, solution: list, completions_long_answer: list, log_dir: str | None = None,
                     **kwargs: Any) -> list[float]:
    """1.0 iff the stage-2 completion's answer span equals the solution's answer span, as strings.

    `completions_long_answer[i]` is the completion regenerated from sample i's long answer in place of the
    context (or None when there was no long answer or no context: 0.0). Stage-1 `completions` are not read.
    """
    entries = _entries(completions, "influence")
    if entries is None:
        return []
    n = len(entries)
    stage2 = _column(completions_long_answer, n, "influence", "completions_long_answer")
    solutions = _column(solution, n, "influence", "solution")
    contents = [None if regenerated is None else _completion_text(regenerated) for regenerated in stage2]
    for regenerated, text in zip(stage2, contents):
        if regenerated is not None and text is None:
            _note("influence/malformed", "a stage-2 completion is not a list of messages with a string 'content'")
    rewards = [1.0 if text is not None and isinstance(gold, str) and answer_span(text) == answer_span(gold) else 0.0
               for text, gold in zip(contents, solutions)]
    _debug_log("influence_accuracy_reward.log", "influence_Accuracy reward", rewards, contents, solutions, log_dir)
    return rewards


def _problem_text(problem: Any) -> str | None:
    """The prompt text: the string itself, or the user message of a chat."""
    if isinstance(problem, str):
        return problem
    if isinstance(problem, Sequence):
        for message in problem:
            if isinstance(message, Mapping) and message.get("role") == "user":
                content = message.get("content")
                return content if isinstance(content, str) else None
    return None


def len_reward(completions: list, problem: list, **kwargs: Any) -> list[float]:
    """1.0 iff 0.2·len(context) < len(long answer) < 0.8·len(context), strictly, in characters.

    context = first `<context>` block of the problem, long answer = first `<long_answer>` block of the
    completion, both stripped; a missing block or an empty context gives 0.0.
    Differs from CANOE (docs/differences.md, D4): the length reward matches across lines.
    """
    entries = _entries(completions, "length")
    if entries is None:
        return []
    texts = _texts(entries, "length")
    problems = _column(problem, len(texts), "length", "problem")
    rewards = []
    for text, prompt in zip(texts, problems):
        prompt_text = _problem_text(prompt)
        context = None if prompt_text is None else tag_content(prompt_text, "context")
        long_answer = None if text is None else tag_content(text, "long_answer")
        ok = bool(context) and long_answer is not None and 0.2 * len(context) < len(long_answer) < 0.8 * len(context)
        rewards.append(1.0 if ok else 0.0)
    return rewards


def grounding_reward(completions: list, problem: list, **kwargs: Any) -> list[float]:
    """1.0 iff the first `<answer>` block holds 1-12 words that appear, in that order, in the problem's `<context>`
    (case and runs of whitespace ignored); 0.0 otherwise. Not CANOE's (docs/differences.md, D22): a lever that pays
    for answering from the passage itself, not from the prompt's worked example or from memory."""
    entries = _entries(completions, "grounding")
    if entries is None:
        return []
    texts = _texts(entries, "grounding")
    rewards = []
    for text, prompt in zip(texts, _column(problem, len(texts), "grounding", "problem")):
        context = " ".join((tag_content(_problem_text(prompt) or "", "context") or "").lower().split())
        words = (tag_content(text or "", "answer") or "").lower().split()
        rewards.append(1.0 if context and 0 < len(words) <= 12 and " ".join(words) in context else 0.0)
    return rewards


def score(names: Sequence[str], rows: list[dict], completions: list, stage2: list, G: int, **extra) -> torch.Tensor:
    """`(N, R)` float32: each reward of `names` (REWARD_FUNCS) for each of the N = B·G completions (rollout.py's),
    column j for names[j]. Every reward is called with `completions` and `completions_long_answer` (stage 2's, None
    where not regenerated) as chat messages, every dataset field as a column with one value per completion (the
    union of the rows' fields, None where a row lacks one), and `extra` (the trainer's grader and log folder)."""
    keys = list(dict.fromkeys(key for row in rows for key in row if key != "prompt_ids"))
    columns = {key: [row.get(key) for row in rows for _ in range(G)] for key in keys}
    messages = [[{"role": "assistant", "content": c.text}] for c in completions]
    long_answer = [None if c is None else [{"role": "assistant", "content": c.text}] for c in stage2]
    per_reward = torch.zeros(len(completions), len(names))  # (N, R)
    for j, name in enumerate(names):
        values = REWARD_FUNCS[name](messages, completions_long_answer=long_answer, **extra, **columns)
        per_reward[:, j] = torch.tensor(values, dtype=torch.float32)
    return per_reward


# The registry the trainer reads: config names -> functions.
REWARD_FUNCS: dict[str, Callable[..., list[float]]] = {
    "accuracy": accuracy_reward,
    "format": format_reward,
    "grounding": grounding_reward,
    "influence": influence_reward,
    "length": len_reward,
}


# ------------------------------------------------------------------------------------------------ R1-Zero


def r1_zero_reward_fn(response: str, ground_truth: str | int | float | list[str], fast: bool = True,
                      grader: MathGrader | None = None) -> dict[str, float]:
    """R1-Zero reward (understand-r1-zero's `r1_zero_reward_fn`, arXiv 2503.20783; docs/DESIGN.md, "The R1-Zero
    math reward"): a strict format gate, then a math grade.

    1. `response` must contain `</think> <answer>` (one space) and `</answer>`, else all three values are 0.0.
    2. The answer is the text after the last `<answer>`, with `</answer>` removed.
    3. If it has `\\boxed` (or `\\fbox`, the same box), only the last box's content counts; a box without
       balanced braces is a format error (all 0.0).
    4. `ground_truth`: str, int/float (as str) or a list of str (any may match); anything else, bool included
       (True is an int to Python, not an answer), is a TypeError.
    5. `r1_grader.r1_grade`: normalised strings, exact sympy, and with fast=False math-verify under the
       deadline of `grader` (default: `grader.default_grader()`).
    6. Correct: all 1.0; formatted but wrong: format 1.0, the others 0.0.

    Not in `REWARD_FUNCS`: it grades one response and returns three values, not a batch with the shared signature,
    and its gate asks for R1-Zero's format, which CANOE's prompt does not produce. docs/DESIGN.md, "The R1-Zero
    math reward", registers a wrapper and gives the config to train with it.

    >>> r1_zero_reward_fn("<think>6*7</think> <answer>\\\\boxed{42}</answer>", 42)
    {'format_reward': 1.0, 'answer_reward': 1.0, 'reward': 1.0}
    """
    if isinstance(ground_truth, bool) or not isinstance(ground_truth, (str, int, float, list)):
        raise TypeError(f"ground_truth must be str, int, float or list[str], not {type(ground_truth).__name__}")
    if isinstance(ground_truth, list) and not all(isinstance(g, str) for g in ground_truth):
        raise TypeError("ground_truth list must hold only str")
    golds = ground_truth if isinstance(ground_truth, list) else [str(ground_truth)]

    wrong_format = {"format_reward": 0.0, "answer_reward": 0.0, "reward": 0.0}
    if not isinstance(response, str) or "</think> <answer>" not in response or "</answer>" not in response:
        return wrong_format
    model_answer = response.split("<answer>")[-1].replace("</answer>", "")
    if "\\boxed" in model_answer or "\\fbox" in model_answer:
        boxed = last_boxed(model_answer)
        if boxed is None:
            return wrong_format
        model_answer = boxed
    correct = any(r1_grade(model_answer, gold, fast, grader) for gold in golds)
    return {"format_reward": 1.0, "answer_reward": float(correct), "reward": float(correct)}
