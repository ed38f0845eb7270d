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

The draw is kept under `--draws` (runs/signal/draws/), named by a digest of what decides it: the config without its
rewards and output folder, the dtype, the model's files (name, size, time), the data file, `--per-task` and the
sampling code (the .py files of the root and plumbing/, rewards.py left out, and pass_rates.py). A later check of
any config that samples alike, such as the next version of an idea under ideas/, re-scores that draw in seconds
instead of sampling again; `--resample` draws anew.
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import importlib.util
import json
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

_spec = importlib.util.spec_from_file_location("pass_rates", ROOT / "bench" / "pass_rates.py")
pass_rates = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(pass_rates)  # first: it sets the thread count and vLLM's mode before torch loads

import rewards  # noqa: E402
from config import ConfigError, load_config  # noqa: E402
from grading.grader import MathGrader  # noqa: E402


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


def draw_path(folder: Path, cfg, model: str, data_file: str, per_task: int) -> Path:
    """The file that holds the draw of these settings: `folder`/DIGEST.json, the digest of what decides the draw
    (the module docstring's list)."""
    settings = dataclasses.asdict(dataclasses.replace(cfg, rewards={}, reward_files=[], output_dir=""))
    dtype = str(pass_rates.runtime.resolve_dtype(cfg.dtype))
    digest = hashlib.sha256(json.dumps([settings, dtype, model, per_task], sort_keys=True, default=str).encode())
    for file in sorted(f for f in Path(model).glob("*") if f.is_file()):  # none for a hub name
        digest.update(f"{file.name} {file.stat().st_size} {file.stat().st_mtime_ns}".encode())
    code = [*ROOT.glob("*.py"), *(ROOT / "plumbing").glob("*.py"), ROOT / "bench" / "pass_rates.py"]
    for file in [Path(data_file), *sorted(f for f in code if f.name != "rewards.py")]:
        digest.update(file.read_bytes())
    return folder / f"{digest.hexdigest()[:16]}.json"


def draw(cfg, model: str, tokenizer, rows: list[dict], path: Path, log_dir: Path) -> tuple[list[str], list]:
    """Every row's G stage-1 texts and their stage-2 texts (None where not regenerated), prompt-major: sampled as
    training's first step samples them and kept at `path`, or read from `path` where it holds them."""
    if path.exists():
        kept = json.loads(path.read_text())
        if kept["problems"] != [r["problem"] for r in rows]:
            raise SystemExit(f"error: {path} holds the draw of other prompts; --resample draws anew")
        print(f"re-scoring the draw kept in {path} ({len(kept['completions'])} samples; --resample draws anew)")
        return kept["completions"], kept["stage2"]
    print(f"sampling {len(rows)} prompts × G = {cfg.num_generations} as training does "
          f"({'both stages' if cfg.dual else 'stage 1'}) …", flush=True)
    scoreless = dataclasses.replace(cfg, rewards={})  # the rewards are scored afterwards, on the texts
    batch = pass_rates.sample_as_training(scoreless, model, tokenizer, rows, log_dir)
    texts = [c.text for c in batch.completions]
    stage2 = [None if c is None else c.text for c in batch.stage2.completions]
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"problems": [r["problem"] for r in rows], "completions": texts, "stage2": stage2}))
    return texts, stage2


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
    parser.add_argument("--draws", type=Path, default=ROOT / "runs" / "signal" / "draws", help="where draws are kept")
    parser.add_argument("--resample", action="store_true", help="sample again even where the draw is kept")
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
    kept = draw_path(args.draws, cfg, model, path, args.per_task)
    if args.resample:
        kept.unlink(missing_ok=True)
    texts, stage2 = draw(cfg, model, tokenizer, rows, kept, out)
    names = list(cfg.rewards)
    text = lambda t: None if t is None else SimpleNamespace(text=t)  # noqa: E731  (all that rewards.score reads)
    with MathGrader(workers=cfg.reward_workers, deadline_s=cfg.reward_deadline_s) as grader:
        scores = rewards.score(names, rows, [text(t) for t in texts], [text(t) for t in stage2], G, grader=grader,
                               log_dir=str(out)).double().numpy()  # (N, R)
    weights = np.array([cfg.rewards[n] for n in names])
    table = signal_table(np.column_stack([scores, scores @ weights]), [*names, "total"], G)
    for row in table.values():
        del row["correlation"]["total"]
    print(f"\n{args.config} ({model}) on {path}: {len(rows)} prompts × G = {G}, temperature {cfg.temperature}, "
          f"{time.perf_counter() - start:.0f} s")
    print_table(table, names)
    report = {"config": str(args.config), "model": model, "data": path, "G": G, "rewards": cfg.rewards,
              "table": table, "scores": scores.tolist(), "problems": [r["problem"] for r in rows],
              "completions": texts, "stage2": stage2, "draw": str(kept)}
    (out / "signal.json").write_text(json.dumps(report, indent=1, ensure_ascii=False))
    print(f"written to {out / 'signal.json'}")


if __name__ == "__main__":
    main()
