"""Draw a run's metrics.jsonl as one PNG: rewards, KL, completion length, exact match and step time, over steps.
Several runs share the panels, one line style each, against wall-clock minutes, to compare them at equal time.

    python -m training.plot runs/default                 # writes runs/default/metrics.png
    python -m training.plot runs/default runs/variant --out compare.png
"""

from __future__ import annotations

import argparse
import itertools
import json
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only, no screen
import matplotlib.pyplot as plt  # noqa: E402

PANELS = (
    ("rewards (mean over samples)", ("reward/accuracy", "reward/format", "reward/influence", "reward/length")),
    ("total reward", ("reward/total",)),
    ("KL to the reference (k3)", ("loss/kl",)),
    ("completion length (tokens)", ("completion/length_mean",)),
    ("exact match of stage-1 answers", ("faithfulness/em",)),
    ("seconds per step", ("time/step",)),
)


def smooth(values: list[float], window: int) -> list[float]:
    """Trailing moving average over `window` points."""
    chunks = [values[max(0, i - window + 1) : i + 1] for i in range(len(values))]
    return [sum(chunk) / len(chunk) for chunk in chunks]


def read_metrics(run_dir: Path) -> list[dict]:
    path = run_dir / "metrics.jsonl"
    if not path.exists():
        raise SystemExit(f"error: {path} does not exist")
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    if not rows:
        raise SystemExit(f"error: {path} is empty")
    return rows


def plot(run_dirs: Path | list[Path], out: Path) -> Path:
    """Draw one run (a Path: over steps) or several (a list: over minutes) into `out`; returns `out`."""
    runs = [run_dirs] if isinstance(run_dirs, Path) else list(run_dirs)
    fig, axes = plt.subplots(2, 3, figsize=(15, 8))
    windows = []
    for run_dir, style in zip(runs, itertools.cycle(["-", "--", ":", "-."])):
        rows = read_metrics(run_dir)
        window = max(1, len(rows) // 10)
        windows.append(window)
        x = ([row["step"] for row in rows] if len(runs) == 1
             else list(itertools.accumulate(row["time/step"] / 60 for row in rows)))
        for ax, (title, keys) in zip(axes.flat, PANELS):
            for key in (key for key in keys if key in rows[0]):
                values = [row[key] for row in rows]
                label = key.split("/")[-1] if len(runs) == 1 else f"{run_dir.name}: {key.split('/')[-1]}"
                line, = ax.plot(x, values, alpha=0.2, linestyle=style)
                ax.plot(x, smooth(values, window), color=line.get_color(), linestyle=style, label=label)
            ax.set_title(title)
            ax.set_xlabel("step" if len(runs) == 1 else "minutes")
            ax.grid(alpha=0.3)
            if len(keys) > 1 or len(runs) > 1:
                ax.legend(fontsize=7)
    fig.suptitle(f"{', '.join(map(str, runs))} (lines: moving average over {'/'.join(map(str, windows))} steps)")
    fig.tight_layout()
    fig.savefig(out, dpi=100)
    plt.close(fig)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run_dirs", type=Path, nargs="+")
    parser.add_argument("--out", type=Path, help="PNG path (default RUN_DIR/metrics.png of the first run)")
    args = parser.parse_args()
    print(plot(args.run_dirs, args.out or args.run_dirs[0] / "metrics.png"))


if __name__ == "__main__":
    main()
