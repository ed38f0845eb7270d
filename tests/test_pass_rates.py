"""bench/pass_rates.py's table: format, accuracy and accuracy-signal shares per task type (hand-computed)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parent.parent / "bench" / "pass_rates.py"


@pytest.fixture(scope="module")
def pass_rates():
    spec = importlib.util.spec_from_file_location("pass_rates", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_table_per_task_and_overall(pass_rates):
    rows = [{"task": "counterfactual"}, {"task": "counterfactual"}, {"task": "multi_hop"}]  # B = 3, G = 2
    accuracy = [1.0, 0.0,  0.0, 0.0,  1.0, 1.0]  # groups: varies, constant, constant
    formats = [1.0, 1.0,  0.0, 1.0,  1.0, 1.0]
    table = pass_rates.pass_rates(rows, ["t"] * 6, accuracy, formats, G=2)
    # counterfactual: 4 samples, format 3/4, accuracy 1/4, 1 of 2 groups varies
    assert table["counterfactual"] == {"prompts": 2, "format": 0.75, "accuracy": 0.25, "accuracy_signal": 0.5}
    # multi_hop: both samples correct, so no signal although the accuracy rate is 1
    assert table["multi_hop"] == {"prompts": 1, "format": 1.0, "accuracy": 1.0, "accuracy_signal": 0.0}
    # overall: 6 samples, format 5/6, accuracy 3/6, 1 of 3 groups varies
    assert table["overall"] == pytest.approx({"prompts": 3, "format": 5 / 6, "accuracy": 0.5, "accuracy_signal": 1 / 3})
    assert list(table) == ["counterfactual", "multi_hop", "overall"]


def test_first_per_task_keeps_file_order(pass_rates):
    rows = [{"task": "a", "i": 0}, {"task": "b", "i": 1}, {"task": "a", "i": 2}, {"task": "a", "i": 3}, {"i": 4}]
    assert [r["i"] for r in pass_rates.first_per_task(rows, 2)] == [0, 1, 2, 4]
