"""Benchmark: accuracy grading of 10,000 mixed completions, the original way vs ours.

(a) plain loop, as the original CANOE code graded: math-verify parses the whole completion and the whole solution
    with its default settings and `verify(pred, gold)` decides; if that is not 1, the `<answer>` spans are compared
    as strings. One sample after another in this (main) thread, so math-verify's own signal-based timeouts
    (5 s parse, 5 s verify) work and are left on.
(b) ours: `rewards.accuracy_reward` on GRPO-sized batches (16 prompts x 7 completions) with a
    `grader.MathGrader(workers=2)`: text answers are settled by string match in this process, math answers are
    graded in 2 worker processes under a 1 s per-sample deadline.

The completions are generated from a seed in this script: integers, fractions and decimals, LaTeX (roots, sets,
intervals, polynomials, matrices), short text answers as in CANOE's QA data, and ~1% hostile ones (None, a
megabyte of text, `\\frac{` x 10,000, lone surrogates, a power tower, 300 nested parentheses, 2,000 `<answer>`
tags). The two ways do not give identical rewards, by design (docs/differences.md, D1-D3); the disagreements are
counted.
A last batch with four answers that hang math-verify (factorials of ten million) shows the deadline at work.

Run: .venv/bin/python bench/bench_rewards.py [--n 10000] [--seed 0]
"""

from __future__ import annotations

import argparse
import logging
import random
import re
import sys
import time
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from math_verify import parse, verify  # noqa: E402

from grading.grader import MathGrader  # noqa: E402
from rewards import accuracy_reward  # noqa: E402

DEADLINE_S = 1.0
GROUP = 7  # completions per prompt (G)
PROMPTS_PER_BATCH = 16

NAMES = ["Marie Curie", "Paris", "Lyon", "Albert Einstein", "Mount Everest", "the Nile", "Tokyo", "Ada Lovelace",
         "Charles Darwin", "Canberra", "yes", "no", "Jupiter", "Pacific Ocean", "Leonardo da Vinci", "Toni Morrison"]
MONTHS = ["January", "March", "May", "July", "September", "November"]


def _latex_set(values: list[int]) -> str:
    return "\\{" + ", ".join(map(str, values)) + "\\}"


def _math_item(rng: random.Random) -> tuple[str, list[str]]:
    """A gold answer and some ways a model might answer it (equivalent forms first, then wrong ones)."""
    kind = rng.choice(["int", "int", "frac", "decimal", "sqrt", "set", "interval", "poly", "matrix", "power"])
    if kind == "int":
        n = rng.randint(0, 99_999)
        return str(n), [str(n), f"{n:,}", f"{n}.0", str(n + 1), f"$${n}$$"]
    if kind == "frac":
        p, q = rng.randint(1, 9), rng.randint(2, 12)
        forms = [f"\\frac{{{p * 2}}}{{{q * 2}}}", f"{p}/{q}", f"\\dfrac{{{p}}}{{{q}}}", f"\\frac{{{q}}}{{{p}}}"]
        return f"\\frac{{{p}}}{{{q}}}", forms
    if kind == "decimal":
        p = rng.choice([1, 3, 5, 7]) / rng.choice([2, 4, 8])
        return str(p), [str(p), f"\\frac{{{int(p * 8)}}}{{8}}", str(p + 0.5)]
    if kind == "sqrt":
        a, b = rng.randint(2, 5), rng.choice([2, 3, 5])
        return f"{a}\\sqrt{{{b}}}", [f"\\sqrt{{{a * a * b}}}", f"{a}\\sqrt{{{b}}}", f"{a + 1}\\sqrt{{{b}}}", str(a)]
    if kind == "set":
        items = rng.sample(range(1, 20), 3)
        shuffled = rng.sample(items, 3)
        return _latex_set(items), [_latex_set(shuffled), ", ".join(map(str, shuffled[:2]))]
    if kind == "interval":
        a, b = sorted(rng.sample(range(-9, 10), 2))
        return f"({a}, {b}]", [f"({a},{b}]", f"[{a}, {b}]", f"({b}, {a}]"]
    if kind == "poly":
        a = rng.randint(1, 9)
        return f"(x+{a})^2", [f"x^2+{2 * a}x+{a * a}", f"x^2+{a * a}", f"(x+{a})^2"]
    if kind == "matrix":
        a, b = rng.randint(1, 9), rng.randint(1, 9)
        gold = f"\\begin{{pmatrix}} {a} \\\\ {b} \\end{{pmatrix}}"
        swapped = f"\\begin{{pmatrix}} {b} \\\\ {a} \\end{{pmatrix}}"
        return gold, [f"\\begin{{bmatrix}} {a} \\\\ {b} \\end{{bmatrix}}", swapped]
    e = rng.randint(2, 6)
    return str(10**e), [f"10^{{{e}}}", f"10^{e + 1}", str(10**e)]


def _text_item(rng: random.Random) -> tuple[str, list[str]]:
    kind = rng.choice(["name", "name", "year", "date"])
    if kind == "name":
        gold = rng.choice(NAMES)
        return gold, [gold, gold.lower(), rng.choice(NAMES), f"{gold}."]
    if kind == "year":
        year = rng.randint(1500, 2024)
        return str(year), [str(year), str(year + rng.choice([-1, 1])), f"{year} AD"]
    day, month, year = rng.randint(1, 28), rng.choice(MONTHS), rng.randint(1900, 2024)
    gold = f"{day} {month} {year}"
    return gold, [gold, f"{month} {day}, {year}", f"{day + 1} {month} {year}"]


def _hostile(rng: random.Random) -> str | None:
    kind = rng.randrange(7)
    if kind == 0:
        return None
    if kind == 1:
        return "<think>" + "blah " * 200_000 + "</think><long_answer>x</long_answer><answer>1</answer>"
    if kind == 2:
        return "<answer>" + "\\frac{" * 10_000 + "</answer>"
    if kind == 3:
        return "<think>\ud800</think><answer>\ud800\udfff</answer>"
    if kind == 4:
        return "<answer>9^{9^{9^{9}}}</answer>"
    if kind == 5:
        return "<answer>" + "(" * 300 + "1" + ")" * 300 + "</answer>"
    return "<answer>" * 2_000  # the original's `<answer>(.*?)</answer>` is quadratic: 100,000 tags take minutes


def _completion(rng: random.Random, answer: str) -> str:
    numbers = ", ".join(str(rng.randint(0, 500)) for _ in range(rng.randint(1, 4)))
    think = f"The context mentions {numbers}. Let me check which one the question asks about. " * rng.randint(1, 3)
    long_answer = f"According to the context, the answer is {answer}, as stated in the passage."
    sep = rng.choice(["", "\n"])
    return f"<think>{think}</think>{sep}<long_answer>{long_answer}</long_answer>{sep}<answer>{answer}</answer>"


def make_dataset(n: int, seed: int) -> tuple[list[str | None], list[str], list[bool]]:
    """n completions in groups of GROUP sharing a solution; returns (completions, solutions, is_hostile)."""
    rng = random.Random(seed)
    completions: list[str | None] = []
    solutions: list[str] = []
    hostile: list[bool] = []
    while len(completions) < n:
        gold, forms = _text_item(rng) if rng.random() < 0.45 else _math_item(rng)
        for _ in range(GROUP):
            if rng.random() < 0.01:
                completions.append(_hostile(rng))
                hostile.append(True)
            else:
                completions.append(_completion(rng, rng.choice(forms)))
                hostile.append(False)
            solutions.append(f"<answer>{gold}</answer>")
    return completions[:n], solutions[:n], hostile[:n]


def plain_accuracy(content: str | None, solution: str) -> float:
    """One sample the original way: math-verify on the whole texts, then string match of the answer spans."""
    reward = 0.0
    try:
        reward = float(verify(parse(content), parse(solution)))  # type: ignore[arg-type]
    except Exception:  # the original treated any failure as "not verified" and went on to string match
        pass
    if reward == 0.0:
        try:
            gold = re.search(r"<answer>(.*?)</answer>", solution)
            pred = re.search(r"<answer>(.*?)</answer>", content)  # type: ignore[arg-type]
            gold_span = gold.group(1).strip() if gold else solution.strip()
            pred_span = pred.group(1).strip() if pred else content.strip()  # type: ignore[union-attr]
            reward = float(pred_span == gold_span)
        except Exception:  # None content and the like: 0.0, as in the original
            pass
    return reward


def run_plain(completions: list[str | None], solutions: list[str]) -> tuple[list[float], float, float]:
    rewards, slowest = [], 0.0
    start = time.perf_counter()
    for content, solution in zip(completions, solutions):
        t0 = time.perf_counter()
        rewards.append(plain_accuracy(content, solution))
        slowest = max(slowest, time.perf_counter() - t0)
    return rewards, time.perf_counter() - start, slowest


def run_ours(completions: list[str | None], solutions: list[str], grader: MathGrader) -> tuple[list[float], float]:
    batch = GROUP * PROMPTS_PER_BATCH
    messages = [[{"role": "assistant", "content": c}] for c in completions]
    rewards: list[float] = []
    start = time.perf_counter()
    for i in range(0, len(messages), batch):
        rewards += accuracy_reward(messages[i : i + batch], solutions[i : i + batch], grader=grader)
    return rewards, time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--n", type=int, default=10_000)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    logging.disable(logging.WARNING)  # math-verify logs every timeout of the plain loop

    completions, solutions, hostile = make_dataset(args.n, args.seed)
    print(f"{args.n} completions (seed {args.seed}): {sum(hostile)} hostile, "
          f"{len(set(zip(completions, solutions)))} distinct (completion, solution) pairs")

    start = time.perf_counter()
    grader = MathGrader(workers=2, deadline_s=DEADLINE_S)
    grader.wait_ready()
    print(f"ours: worker start-up (paid once per run) {time.perf_counter() - start:.2f} s")

    ours, ours_s = run_ours(completions, solutions, grader)
    plain, plain_s, plain_slowest = run_plain(completions, solutions)
    print(f"(a) plain loop : {args.n / plain_s:8.1f} samples/s ({plain_s:.1f} s), slowest sample {plain_slowest:.2f} s")
    print(f"(b) ours       : {args.n / ours_s:8.1f} samples/s ({ours_s:.1f} s), "
          f"slowest sample {grader.slowest_s:.2f} s, {grader.timeouts} timeouts, {grader.errors} errors")
    print(f"speed-up (b)/(a): {plain_s / ours_s:.2f}x")

    calm = [i for i, h in enumerate(hostile) if not h]
    calm_c, calm_s = [completions[i] for i in calm], [solutions[i] for i in calm]
    _, ours_calm_s = run_ours(calm_c, calm_s, grader)
    _, plain_calm_s, _ = run_plain(calm_c, calm_s)
    print(f"without the hostile samples ({len(calm)}): plain {len(calm) / plain_calm_s:.1f}/s, "
          f"ours {len(calm) / ours_calm_s:.1f}/s, speed-up {plain_calm_s / ours_calm_s:.2f}x")

    differ = Counter((p, o) for p, o in zip(plain, ours) if p != o)
    print(f"mean reward: plain {sum(plain) / args.n:.3f}, ours {sum(ours) / args.n:.3f}; "
          f"disagreements (plain, ours): {dict(differ)}")
    verdict = "OK" if grader.slowest_s <= DEADLINE_S + 0.5 else "OVER"
    print(f"slowest of ours vs deadline + 0.5 s ({DEADLINE_S + 0.5:.1f} s): {verdict}")

    # The hostile samples above are settled before math-verify (too long, power tower, deep nesting), so none
    # reached the deadline. Show the deadline itself: one batch with 4 answers that hang math-verify for minutes.
    grader.wait_ready()
    hangs = [f"<answer>{10_000_000 + k}!</answer>" for k in range(4)]  # factorials of ten million
    batch = calm_c[: GROUP * PROMPTS_PER_BATCH - len(hangs)] + hangs
    golds = calm_s[: len(batch) - len(hangs)] + ["<answer>1</answer>"] * len(hangs)
    before, start = grader.timeouts, time.perf_counter()
    run_ours(batch, golds, grader)
    print(f"deadline check: a batch of {len(batch)} with {len(hangs)} hanging answers took "
          f"{time.perf_counter() - start:.2f} s, {grader.timeouts - before} timeouts, "
          f"slowest sample {grader.slowest_s:.2f} s ({'OK' if grader.slowest_s <= DEADLINE_S + 0.5 else 'OVER'})")
    grader.close()


if __name__ == "__main__":
    main()
