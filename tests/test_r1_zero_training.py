"""docs/DESIGN.md, "The R1-Zero math reward": its wrapper, appended to rewards.py, scores a batch as a registered
reward does, and its config loads as the default with R1-Zero's prompt, stage 2 off and the one reward."""

from pathlib import Path

import rewards
from config import load_config

ROOT = Path(__file__).resolve().parent.parent
SECTION = (ROOT / "docs" / "DESIGN.md").read_text().split("## The R1-Zero math reward", 1)[1].split("\n## ", 1)[0]


def block(language: str) -> str:
    return SECTION.split(f"```{language}\n", 1)[1].split("```", 1)[0]


def chat(text):
    return [{"role": "assistant", "content": text}]


def test_the_wrapper_scores_a_batch_with_the_shared_signature():
    namespace = {**vars(rewards), "REWARD_FUNCS": dict(rewards.REWARD_FUNCS)}  # as if appended, registry untouched
    exec(compile(block("python"), "docs/DESIGN.md", "exec"), namespace)
    reward = namespace["REWARD_FUNCS"]["r1_zero"]
    # After the prefix "<think>": right and R1-Zero's format; wrong; right but CANOE's format (no "</think> <answer>");
    # a None text; a None solution.
    texts = ["6*7</think> <answer>\\boxed{42}</answer>", "6*7</think> <answer>41</answer>",
             "6*7</think><long_answer>42</long_answer><answer>42</answer>", None, "x</think> <answer>42</answer>"]
    solutions = ["<answer>42</answer>"] * 4 + [None]
    assert reward([chat(t) for t in texts], solution=solutions, problem=["p"] * 5) == [1.0, 0.0, 0.0, 0.0, 0.0]


def test_the_config_loads(tmp_path, monkeypatch):
    monkeypatch.setitem(rewards.REWARD_FUNCS, "r1_zero", lambda completions, **kwargs: [0.0] * len(completions))
    (tmp_path / "recipes").mkdir()
    (tmp_path / "config.toml").write_text((ROOT / "config.toml").read_text())
    (tmp_path / "recipes" / "r1-zero.toml").write_text(block("toml"))
    cfg = load_config(tmp_path / "recipes" / "r1-zero.toml")
    assert not cfg.dual and cfg.rewards == {"r1_zero": 1.0}
    assert not cfg.example_problem and "</think> <answer>" in cfg.system_prompt
