"""The signal check: in minutes rather than hours, whether each reward of a config varies within a group (GRPO
learns nothing from a group whose rewards are all equal) and how the rewards move together, before a compare spends
hours.

    make signal CONFIG=recipes/brevity.toml
    .venv/bin/python bench/reward_signal.py --config recipes/brevity.toml [--model DIR] [--data FILE] [--per-task 6]

Samples as training's first step does (bench/pass_rates.py's `sample_as_training`: both stages, the config's
prompt, G, temperature, top_p, completion length and seed) for the first `--per-task` prompts of each task type of
the config's training data, scores every completion with every reward the config names, and prints one row per
reward and one for the weighted total: the mean over the N = B·G completions, the share of the B groups in which it
varies (training logs it as `signal/NAME`), and its Pearson correlation over the N completions with each reward
("-" where either is constant, which has none). The scores, the completions and the table are written to `--out`
(default runs/signal/CONFIG-NAME/signal.json).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

_spec = importlib.util.spec_from_file_location("pass_rates", ROOT / "bench" / "pass_rates.py")
pass_rates = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(pass_rates)  # first: it sets the thread count and vLLM's mode before torch loads

from config import ConfigError, load_config  # noqa: E402


def signal_table(scores: np.ndarray, names: list[str], G: int) -> dict[str, dict]:
    """Per column of `scores` `(N, R)` (N = B·G, prompt-major), named by `names`: its mean, the share of the B groups
    whose G values are not all equal, and its correlation with each column (None where either column is constant).

    >>> a = signal_table(np.array([[1.0, 0.0], [0.0, 0.0], [1.0, 1.0], [1.0, 1.0]]), ["a", "b"], G=2)["a"]
    >>> a["mean"], a["varies"], round(a["correlation"]["b"], 3)
    (0.75, 0.5, 0.577)
    """
    groups = scores.reshape(-1, G, scores.shape[1])  # (B, G, R)
    varies = (groups.max(axis=1) != groups.min(axis=1)).mean(axis=0)  # (R,)
    centred = scores - scores.mean(axis=0)  # (N, R)
    spread = np.sqrt((centred**2).sum(axis=0))  # (R,)
    table = {}
    for j, name in enumerate(names):
        correlation = {other: None if spread[j] == 0 or spread[k] == 0 else
                       float(centred[:, j] @ centred[:, k] / (spread[j] * spread[k]))
                       for k, other in enumerate(names)}
        table[name] = {"mean": float(scores[:, j].mean()), "varies": float(varies[j]), "correlation": correlation}
    return table


def print_table(table: dict[str, dict], rewards: list[str]) -> None:
    """The table: a row per reward and the total, the correlation with each reward in a column of its own."""
    width = max(10, *(len(name) + 2 for name in rewards))
    print(f"{'reward':<{width}}{'mean':>8}{'varies in':>11}" + "".join(f"{n:>{width}}" for n in rewards))
    for name, row in table.items():
        cells = "".join("-".rjust(width) if row["correlation"][n] is None else f"{row['correlation'][n]:>{width}.3f}"
                        for n in rewards)
        print(f"{name:<{width}}{row['mean']:>8.3f}{row['varies']:>11.3f}" + cells)
    print("(mean over the completions; varies in: the share of groups whose G rewards are not all equal; then the "
          "Pearson correlation over the completions, - where a reward is constant)")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", type=Path, required=True, help="the config whose rewards are checked")
    parser.add_argument("--model", help="policy folder (default: the config's model)")
    parser.add_argument("--data", help="JSONL in the project's format (default: the config's train_file)")
    parser.add_argument("--per-task", type=int, default=6, help="prompts per task type (4 types: 24 prompts)")
    parser.add_argument("--out", type=Path, help="where signal.json goes (default runs/signal/CONFIG-NAME)")
    args = parser.parse_args(argv)
    try:
        cfg = load_config(args.config)
    except ConfigError as error:
        raise SystemExit(f"error: {error}") from None
    from transformers import AutoTokenizer

    model, path, G = args.model or cfg.model, args.data or cfg.train_file, cfg.num_generations
    start = time.perf_counter()
    tokenizer = AutoTokenizer.from_pretrained(model)
    rows = pass_rates.training_prompts(cfg, tokenizer, path, args.per_task)
    out = args.out or ROOT / "runs" / "signal" / args.config.stem
    pass_rates.runtime.route_logs(out, 0)  # vLLM's log to out/vllm.log, its errors on the terminal
    print(f"sampling {len(rows)} prompts × G = {G} as training does ({'both stages' if cfg.dual else 'stage 1'}) …",
          flush=True)
    batch = pass_rates.sample_as_training(cfg, model, tokenizer, rows, out)
    rewards = list(cfg.rewards)
    weights = np.array([cfg.rewards[n] for n in rewards])
    scores = batch.scores.double().numpy()  # (N, R)
    table = signal_table(np.column_stack([scores, scores @ weights]), [*rewards, "total"], G)
    for row in table.values():
        del row["correlation"]["total"]
    print(f"\n{args.config} ({model}) on {path}: {len(rows)} prompts × G = {G}, temperature {cfg.temperature}, "
          f"{time.perf_counter() - start:.0f} s")
    print_table(table, rewards)
    report = {"config": str(args.config), "model": model, "data": path, "G": G, "rewards": cfg.rewards,
              "table": table, "scores": scores.tolist(), "problems": [r["problem"] for r in rows],
              "completions": [c.text for c in batch.completions],
              "stage2": [None if c is None else c.text for c in batch.stage2.completions]}
    (out / "signal.json").write_text(json.dumps(report, indent=1, ensure_ascii=False))
    print(f"written to {out / 'signal.json'}")


if __name__ == "__main__":
    main()
