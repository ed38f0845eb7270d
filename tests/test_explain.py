"""The step's page (training/explain.py) without a run: the page shipped in docs/step/ is what today's code renders
from the numbers beside it, and a bad trace gets one line that names the file. tests/test_train.py holds the
page's numbers against a real run: its loss, its advantages, its log-probabilities."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from training.explain import derive, main, read_trace, render

ROOT = Path(__file__).resolve().parent.parent
SHIPPED = sorted((ROOT / "docs" / "step").glob("step-*.json"))


def test_a_default_step_page_is_shipped():
    assert len(SHIPPED) == 1, SHIPPED
    assert SHIPPED[0].with_suffix(".html").is_file() and SHIPPED[0].with_suffix(".png").is_file()


@pytest.mark.parametrize("numbers", SHIPPED, ids=lambda path: path.stem)
def test_the_shipped_page_is_what_the_code_renders_from_its_numbers(numbers):
    trace = json.loads(numbers.read_text())
    recorded = trace.pop("derived")
    assert derive(trace) == recorded  # JSON keeps every float exactly
    assert trace["model"] == "models/Qwen2.5-Coder-0.5B-Instruct" and len(trace["completions"]) == 7
    page = render({**trace, "derived": recorded}, Path("runs/default"))
    assert page == numbers.with_suffix(".html").read_text(), "rerun `make explain` and copy the page to docs/step/"
    # the default's loss, added up on the page, is the one metrics.jsonl logged
    assert recorded["rank_loss"] == pytest.approx(trace["logged"]["loss"], rel=1e-5, abs=1e-7)


def write_trace(folder: Path, lines: list[str]) -> Path:
    folder.mkdir(exist_ok=True)
    (folder / "trace.jsonl").write_text("".join(line + "\n" for line in lines))
    return folder


def test_a_bad_trace_gets_one_line_naming_the_file(tmp_path, capsys):
    with pytest.raises(SystemExit, match=r"trace.jsonl does not exist: train first"):
        read_trace(tmp_path, None)
    run = write_trace(tmp_path / "run", ['{"step": 5}', '{"step": 10'])
    with pytest.raises(SystemExit, match=r"run/trace.jsonl, line 2: not JSON"):
        read_trace(run, None)
    run = write_trace(tmp_path / "other", ['{"step": 5}', '{"step": 10}'])
    with pytest.raises(SystemExit, match=r"step 7 is not in .*other/trace.jsonl; its steps: 5, 10"):
        main([str(run), "--step", "7"])
    assert read_trace(run, None) == {"step": 10}  # the last step unless one is named
