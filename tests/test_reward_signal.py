"""bench/reward_signal.py (`make signal`), run for real on the smoke model with the docs' brevity idea: its printed
table against a second computation from the scores it saved, and the saved scores against the rewards themselves."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from conftest import SMOKE_MODEL

from test_train import smoke_data, write_config  # noqa: F401  (smoke_data: the fixture, shared)

ROOT = Path(__file__).resolve().parent.parent
HALF = 0.0005 + 1e-12  # half the last printed digit (three decimals)
REWARDS = {"accuracy": 1.0, "format": 1.0, "influence": 1.0, "length": 1.0, "brevity": 0.5}


def printed_table(stdout: str) -> dict[str, list[str]]:
    """The table's rows as {name: [mean, varies, correlation with each reward...]}, as printed."""
    lines = stdout.splitlines()
    start = next(i for i, line in enumerate(lines) if line.split()[:4] == ["reward", "mean", "varies", "in"])
    rows = {}
    for line in lines[start + 1:]:
        if line.startswith("("):
            break
        name, *cells = line.split()
        rows[name] = cells
    return rows


@pytest.mark.skipif(not SMOKE_MODEL.exists(), reason="run `make setup` first (makes models/smoke-llama)")
def test_the_signal_check_prints_each_rewards_mean_spread_and_correlations(tmp_path, smoke_data):  # noqa: F811
    config = write_config(tmp_path, smoke_data, reward_files=["ideas/brevity.py"], rewards=REWARDS)
    result = subprocess.run([sys.executable, str(ROOT / "bench" / "reward_signal.py"), "--config", str(config),
                             "--per-task", "8", "--out", str(tmp_path / "out")], cwd=ROOT, capture_output=True,
                            text=True, timeout=900)
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-4000:]
    saved = json.loads((tmp_path / "out" / "signal.json").read_text())
    scores = np.array(saved["scores"])  # (N, R)
    G = 4  # the smoke recipe's
    assert scores.shape == (8 * G, len(REWARDS)) and set(scores.flat) <= {0.0, 1.0}
    # the saved scores are the rewards' own on the saved completions (brevity: the idea file's rule, by hand)
    import rewards

    messages = [[{"role": "assistant", "content": text}] for text in saved["completions"]]
    assert scores[:, 1].tolist() == rewards.format_reward(messages)
    words = [rewards.tag_content(text, "answer") for text in saved["completions"]]
    assert scores[:, 4].tolist() == [1.0 if w and len(w.split()) <= 5 else 0.0 for w in words]

    table = printed_table(result.stdout)
    columns = {**{name: scores[:, j] for j, name in enumerate(REWARDS)},
               "total": scores @ np.array(list(REWARDS.values()))}
    assert list(table) == [*REWARDS, "total"]
    for name, values in columns.items():
        mean, varies, *correlations = table[name]
        groups = values.reshape(-1, G)
        assert float(mean) == pytest.approx(values.mean(), abs=HALF)
        assert float(varies) == pytest.approx(np.mean([len(set(g)) > 1 for g in groups]), abs=HALF)
        for other, printed in zip(REWARDS, correlations, strict=True):
            if values.std() == 0 or columns[other].std() == 0:
                assert printed == "-"
            else:
                assert float(printed) == pytest.approx(np.corrcoef(values, columns[other])[0, 1], abs=HALF)
    # the smoke model's answers are short and mostly formatted: at least one reward varies, or nothing was checked
    assert any(float(table[name][1]) > 0 for name in REWARDS)
