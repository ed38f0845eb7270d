"""Draw a run's metrics.jsonl as one PNG: rewards, KL, completion length and exact match over steps.

    python plot.py runs/default                 # writes runs/default/metrics.png
    python plot.py runs/default --out curve.png
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

PANELS = (
    ("rewards (mean over samples)", ("reward/accuracy", "reward/format", "reward/influence", "reward/length")),
    ("total reward", ("reward/total",)),
    ("KL to the reference (k3)", ("loss/kl",)),
    ("completion length (tokens)", ("completion/length_mean",)),
    ("exact match of stage-1 answers", ("faithfulness/em",)),
    ("seconds per step", ("time/step",)),
)


def smooth(values: list[float], window: int) -> list[float]:
    """Trailing moving average (the raw points are drawn too)."""
    return [sum(values[max(0, i - window + 1) : i + 1]) / len(values[max(0, i - window + 1) : i + 1])
            for i in range(len(values))]


def plot(run_dir: Path, out: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    path = run_dir / "metrics.jsonl"
    if not path.exists():
        raise SystemExit(f"error: {path} does not exist")
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    if not rows:
        raise SystemExit(f"error: {path} is empty")
    steps = [row["step"] for row in rows]
    window = max(1, len(rows) // 10)
    fig, axes = plt.subplots(2, 3, figsize=(15, 8))
    for ax, (title, keys) in zip(axes.flat, PANELS):
        for key in keys:
            if key not in rows[0]:
                continue
            values = [row[key] for row in rows]
            line, = ax.plot(steps, values, alpha=0.25)
            ax.plot(steps, smooth(values, window), color=line.get_color(), label=key.split("/")[-1])
        ax.set_title(title)
        ax.set_xlabel("step")
        ax.grid(alpha=0.3)
        if len(keys) > 1:
            ax.legend(fontsize=8)
    fig.suptitle(f"{run_dir} ({len(rows)} steps; lines: moving average over {window})")
    fig.tight_layout()
    fig.savefig(out, dpi=100)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run_dir", type=Path)
    parser.add_argument("--out", type=Path, help="PNG path (default RUN_DIR/metrics.png)")
    args = parser.parse_args()
    print(plot(args.run_dir, args.out or args.run_dir / "metrics.png"))


if __name__ == "__main__":
    main()
