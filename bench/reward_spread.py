"""Whether a run's per-step rewards stay within the spread that seeds give: runs of a variant (for example the
default in bfloat16) against the same runs of a reference (in float32), one run per seed, paired by seed.

    python bench/reward_spread.py --reference runs/f32-s42 runs/f32-s7 --variant runs/default runs/bf16-s7

Reads `reward/total` of every step from each run's metrics.jsonl and prints:
- each run's mean over its steps and its quarter means;
- how many of the variant's step rewards lie inside the reference runs' [min, max] at that step (with two
  reference runs, a third draw from their own distribution lands inside about a third of the time);
- per seed, the mean over steps of variant − reference, and between the first two seeds the mean of seed 1 −
  seed 2 within each side, each with a 95 % bootstrap interval over steps (4000 draws, fixed seed). Steps of a
  run are correlated, so the intervals are a guide, not a test.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np


def rewards(run: Path) -> np.ndarray:
    """`(S,)` reward/total of each step of a run, in step order."""
    lines = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines() if line.strip()]
    return np.array([m["reward/total"] for m in sorted(lines, key=lambda m: m["step"])])


def quarters(values: np.ndarray) -> list[float]:
    """The means of the four quarters of the steps (the last few steps left over when S is not a multiple of 4)."""
    n = len(values) // 4
    return [float(values[i * n : (i + 1) * n].mean()) for i in range(4)]


def bootstrap_mean(values: np.ndarray, draws: int = 4000, seed: int = 0) -> tuple[float, float, float]:
    """(mean, 2.5th, 97.5th percentile) of the mean of `values` `(S,)`, resampled with replacement."""
    rng = np.random.default_rng(seed)
    means = values[rng.integers(0, len(values), size=(draws, len(values)))].mean(axis=1)  # (draws,)
    return float(values.mean()), float(np.percentile(means, 2.5)), float(np.percentile(means, 97.5))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--reference", nargs="+", type=Path, required=True, help="one run folder per seed")
    parser.add_argument("--variant", nargs="+", type=Path, required=True, help="the same seeds, in the same order")
    args = parser.parse_args()
    if len(args.reference) != len(args.variant):
        parser.error("give one variant run per reference run (the same seeds, in the same order)")
    reference, variant = [rewards(r) for r in args.reference], [rewards(r) for r in args.variant]
    steps = min(len(r) for r in reference + variant)
    reference, variant = [r[:steps] for r in reference], [r[:steps] for r in variant]
    for path, values in zip(args.reference + args.variant, reference + variant):
        quarter_means = " ".join(f"{q:.2f}" for q in quarters(values))
        print(f"{path}: {steps} steps, mean {values.mean():.3f}, quarters {quarter_means}")
    low, high = np.min(reference, axis=0), np.max(reference, axis=0)  # (S,) each
    inside = sum(int(((v >= low) & (v <= high)).sum()) for v in variant)
    print(f"variant step rewards inside the reference runs' [min, max] at that step: "
          f"{inside} of {steps * len(variant)}")
    for path, ref, var in zip(args.variant, reference, variant):
        print(f"{path} − its reference: per-step mean %.3f [%.3f, %.3f]" % bootstrap_mean(var - ref))
    if len(reference) >= 2:
        for name, runs in (("reference", reference), ("variant", variant)):
            difference = bootstrap_mean(runs[0] - runs[1])
            print(f"{name}, first seed − second seed: per-step mean %.3f [%.3f, %.3f]" % difference)


if __name__ == "__main__":
    main()
