"""One configuration's scoreboard over several seeds: each seed's paired difference against the plain base, and the
difference pooled over the seeds, with items and seeds resampled together.

    .venv/bin/python bench/pool_seeds.py --benchmarks DIR RUN_A/.../scoreboard.predictions.jsonl RUN_B/... RUN_C/...

Each file is what bench/scoreboard.py wrote beside a policy (both sides' outputs, item by item); the plain base is
the same model and prompt for every seed (greedy, so its outputs are the same). The pooled difference is the mean
over seeds of (policy − plain). Its interval is a bootstrap in which each draw takes S seeds with replacement and
n items with replacement, the same items for every seed and both sides: the spread between seeds and the spread
between items both widen it (`pooled_bootstrap`). Prints one table, rows and metrics as the scoreboard's.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import sys
from collections import defaultdict
from pathlib import Path
from typing import Callable

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

_spec = importlib.util.spec_from_file_location("scoreboard", ROOT / "bench" / "scoreboard.py")
scoreboard = importlib.util.module_from_spec(_spec)
sys.modules["scoreboard"] = scoreboard  # its dataclasses look their module up there
_spec.loader.exec_module(scoreboard)


def pooled_bootstrap(policies: list[dict[str, np.ndarray]], base: dict[str, np.ndarray] | list[dict[str, np.ndarray]],
                     stat: Callable[[dict[str, np.ndarray]], np.ndarray], *, draws: int = scoreboard.DRAWS,
                     seed: int = 0) -> list[float]:
    """[estimate, lo, hi] of mean over seeds of stat(policy_s) − stat(base_s): the 95 % percentile interval over
    `draws` resamples of the seeds and, jointly, of the n items (every array (n,)). `base` is one side for every
    seed (the plain base) or one per seed, paired with the policy of the same seed (another config's run of it).

    >>> same = {"em": np.array([1.0, 0.0, 1.0, 1.0])}
    >>> pooled_bootstrap([same, same], same, scoreboard.mean_of("em", 1.0), draws=100)
    [0.0, 0.0, 0.0]
    """
    bases = base if isinstance(base, list) else [base] * len(policies)
    S, n = len(policies), len(next(iter(bases[0].values())))
    rng = np.random.default_rng(seed)
    seeds = rng.integers(0, S, size=(draws, S))  # (draws, S)
    items = rng.integers(0, n, size=(draws, n))  # (draws, n)

    def drawn_stat(hits: dict[str, np.ndarray]) -> np.ndarray:
        return stat({k: v[items] for k, v in hits.items()})  # (draws,)

    per_seed = np.stack([drawn_stat(p) - drawn_stat(b) for p, b in zip(policies, bases)], axis=1)  # (draws, S)
    drawn = np.take_along_axis(per_seed, seeds, axis=1).mean(axis=1)  # (draws,)
    estimate = float(np.mean([stat(p) - stat(b) for p, b in zip(policies, bases)]))
    lo, hi = np.percentile(drawn, [2.5, 97.5])
    return [estimate, float(lo), float(hi)]


def differences(policies: list[dict[str, np.ndarray]], bases: list[dict[str, np.ndarray]],
                stat: Callable[[dict[str, np.ndarray]], np.ndarray], draws: int = scoreboard.DRAWS) -> dict:
    """Each seed's paired difference policy − base (scoreboard.bootstrap) and the difference pooled over the seeds
    (`pooled_bootstrap`), each [estimate, lo, hi]: {"seeds": [...], "pooled": [...]}."""
    each = [scoreboard.bootstrap(p, b, stat, draws=draws)["difference"] for p, b in zip(policies, bases)]
    return {"seeds": each, "pooled": pooled_bootstrap(policies, bases, stat, draws=draws)}


def read_predictions(path: Path) -> dict[str, dict[str, list[str]]]:
    """file name → {"policy": outputs, "plain": outputs}, in item order."""
    sides: dict[str, dict[str, list[str]]] = defaultdict(lambda: {"policy": [], "plain": []})
    for line in path.read_text().splitlines():
        row = json.loads(line)
        sides[row["file"]]["policy"].append(row["policy"])
        sides[row["file"]]["plain"].append(row["plain"])
    return dict(sides)


def run_label(predictions: Path, index: int) -> str:
    """"seed S" from the scoreboard.json written beside the predictions, else the file's place in the list."""
    report = predictions.with_name("scoreboard.json")
    seed = json.loads(report.read_text()).get("seed") if report.exists() else None
    return f"seed {seed}" if seed is not None else f"run {index + 1}"


def read_hits(targets: list, runs: list[dict[str, dict[str, list[str]]]]) -> dict[str, list[dict]]:
    """file → per run {"policy": hits, "plain": hits} (scoreboard.per_item_hits), for the targets the runs hold."""
    hits: dict[str, list[dict]] = {}
    for target in targets:
        items, _ = scoreboard.read_items(target)
        hits[target.name] = [{side: scoreboard.per_item_hits(target, items, run[target.name][side])
                              for side in ("policy", "plain")} for run in runs if target.name in run]
    return hits


def row_hits(hits: dict[str, list[dict]], files: tuple[str, ...], side: str) -> list[dict[str, np.ndarray]]:
    """Per run, `side`'s hits on a row of scoreboard.ROWS: its files' items one after the other."""
    return [{k: np.concatenate([hits[f][s][side][k] for f in files]) for k in hits[files[0]][s][side]}
            for s in range(len(hits[files[0]]))]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("predictions", nargs="+", type=Path, help="scoreboard.predictions.jsonl, one per seed")
    parser.add_argument("--benchmarks", type=Path, help="the folder the scoreboards read (--benchmarks)")
    parser.add_argument("--unchecked-benchmarks", action="store_true", help="read --benchmarks files whose sha256 "
                        "is not the recorded one (the scoreboards' own --unchecked-benchmarks)")
    parser.add_argument("--draws", type=int, default=scoreboard.DRAWS)
    args = parser.parse_args(argv)
    targets = scoreboard.decision_set(args.benchmarks, checked=not args.unchecked_benchmarks)
    runs = [read_predictions(path) for path in args.predictions]
    if any(run[name]["plain"] != runs[0][name]["plain"] for run in runs for name in run):
        raise SystemExit("error: the plain base's outputs differ between these files: not one configuration's seeds "
                         "scored against one base")
    hits = read_hits(targets, runs)
    labels = [run_label(path, i) for i, path in enumerate(args.predictions)]
    print(f"{'file':<12}{'metric':<10}" + "".join(f"{label:>24}" for label in labels) + f"{'pooled':>24}")
    for row, files, metrics in scoreboard.ROWS:
        if not all(len(hits.get(f, [])) == len(runs) for f in files):
            continue
        percent = not row.startswith(("synthetic", "heldout"))
        policies, plains = row_hits(hits, files, "policy"), row_hits(hits, files, "plain")
        for metric in metrics:
            found = differences(policies, [plains[0]] * len(runs), scoreboard.statistic(metric, percent), args.draws)
            print(f"{row:<12}{metric:<10}" + "".join(f"{scoreboard.fmt(d, percent):>24}" for d in found["seeds"])
                  + f"{scoreboard.fmt(found['pooled'], percent):>24}")
    print("(policy − plain, 95 % bootstrap intervals; pooled: seeds and items resampled together)")


if __name__ == "__main__":
    main()
