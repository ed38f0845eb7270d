"""bench/reward_signal.py (`make signal`), run for real on the smoke model with the docs' brevity idea: its printed
table against a second computation from the scores it saved, and the saved scores against the rewards themselves;
then a second config that samples alike re-scores the kept draw without an engine."""

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


def signal_check(config: Path, out: Path, draws: Path) -> subprocess.CompletedProcess:
    result = subprocess.run([sys.executable, str(ROOT / "bench" / "reward_signal.py"), "--config", str(config),
                             "--per-task", "8", "--out", str(out), "--draws", str(draws)], cwd=ROOT,
                            capture_output=True, text=True, timeout=900)
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-4000:]
    return result


@pytest.mark.skipif(not SMOKE_MODEL.exists(), reason="run `make setup` first (makes models/smoke-llama)")
def test_the_signal_check_prints_each_rewards_mean_spread_and_correlations(tmp_path, smoke_data):  # noqa: F811
    config = write_config(tmp_path, smoke_data, reward_files=["ideas/brevity.py"], rewards=REWARDS)
    result = signal_check(config, tmp_path / "out", tmp_path / "draws")
    assert "sampling 8 prompts" in result.stdout
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

    # Another config that samples alike (other rewards and output folder) re-scores the kept draw: no engine starts,
    # the texts are the same and its scores are its own rewards' on them.
    kept_times = [p.stat().st_mtime_ns for p in (tmp_path / "draws").iterdir()]
    assert len(kept_times) == 1
    (tmp_path / "second").mkdir()
    second = write_config(tmp_path / "second", smoke_data, rewards={"format": 1.0, "accuracy": 2.0})
    again = signal_check(second, tmp_path / "out2", tmp_path / "draws")
    assert "re-scoring the draw kept in" in again.stdout and "sampling" not in again.stdout
    assert [p.stat().st_mtime_ns for p in (tmp_path / "draws").iterdir()] == kept_times
    rescored = json.loads((tmp_path / "out2" / "signal.json").read_text())
    assert rescored["completions"] == saved["completions"] and rescored["stage2"] == saved["stage2"]
    assert [row[0] for row in rescored["scores"]] == rewards.format_reward(messages)
    assert [row[1] for row in rescored["scores"]] == scores[:, 0].tolist()  # accuracy, graded again


@pytest.mark.skipif(not SMOKE_MODEL.exists(), reason="run `make setup` first (makes models/smoke-llama)")
def test_the_kept_draw_is_named_by_what_decides_the_sampling(tmp_path, smoke_data):  # noqa: F811
    """The rewards, reward files and output folder leave the draw's name; the temperature, G, the data and the
    number of prompts each change it."""
    other_data = tmp_path / "other.jsonl"
    other_data.write_text(smoke_data.read_text() + "\n")
    configs = {"base": {}, "rewards": {"rewards": {"format": 1.0}, "reward_files": ["ideas/brevity.py"],
                                       "output_dir": str(tmp_path / "elsewhere")},
               "temperature": {"temperature": 0.7}, "G": {"num_generations": 2},
               "data": {"train_file": str(other_data)}}
    paths = []
    for name, overrides in configs.items():
        (tmp_path / name).mkdir()
        paths.append(str(write_config(tmp_path / name, smoke_data, **overrides)))
    code = ("import sys; sys.path.insert(0, 'bench'); import reward_signal as s; from pathlib import Path\n"
            "name = lambda cfg, n: s.draw_path(Path('d'), cfg, cfg.model, cfg.train_file, n).name\n"
            "for c in sys.stdin.read().split():\n"
            "    cfg = s.load_config(Path(c)); print('DRAW', name(cfg, 8))\n"
            "print('DRAW', name(cfg, 7))")
    result = subprocess.run([sys.executable, "-c", code], input=" ".join(paths), cwd=ROOT, capture_output=True,
                            text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    names = [line.split()[1] for line in result.stdout.splitlines() if line.startswith("DRAW ")]
    base, rewards_only, *changed = names
    assert rewards_only == base
    assert len({base, *changed}) == 1 + len(changed) == 5  # temperature, G, data, then the last config at 7 prompts
