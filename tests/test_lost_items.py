"""bench/lost_items.py: the items a policy loses to the plain base (NQ-Swap, or a synthetic-format file), sorted
by what it answered instead."""

import doctest
import importlib.util
import json
import shutil
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
_spec = importlib.util.spec_from_file_location("lost_items", ROOT / "bench" / "lost_items.py")
lost_items = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(lost_items)
suites = lost_items.suites

NAMES = ["Osric Hallam", "Varnel Bridge"]  # config.toml's example, as scoreboard.example_names reads it
QUESTION = "who plays captain vell in the salt road"
ITEM = suites.Item(0, "q0", QUESTION, suites.PROMPT_A.format(
    "Tamsin Orrow plays Captain Vell, and the ship was built by Brann Keddle.", QUESTION), ("Tamsin Orrow",))


@pytest.mark.parametrize("output, kind", [
    ("<think>t</think><answer>Osric Hallam</answer>", "example"),
    ("<answer>The.</answer>", "empty"),
    ("<answer>Captain Vell</answer>", "question"),
    ("<answer>the salt road</answer>", "question"),
    ("<answer>Brann Keddle</answer>", "passage"),
    ("<answer>Mira Dalt</answer>", "elsewhere"),
    ("<answer>Orrow plays Capt</answer>", "elsewhere"),  # whole words only: "Capt" is not "Captain"
])
def test_lost_kind(output, kind):
    assert lost_items.lost_kind(output, ITEM, NAMES) == kind


def test_an_example_name_the_item_itself_holds_is_not_a_copy():
    problem = suites.PROMPT_A.format("Osric Hallam designed it.", "who designed it")
    item = suites.Item(0, "q", "who designed it", problem, ("Mira Castell",))
    assert lost_items.lost_kind("<answer>Osric Hallam</answer>", item, NAMES) == "passage"


def test_tally_counts_lost_by_kind_and_won():
    items = [ITEM] * 4
    policy = ["<answer>Captain Vell</answer>", "<answer>Brann Keddle</answer>", "<answer>Tamsin Orrow</answer>",
              "<answer>Tamsin Orrow</answer>"]
    plain = ["Tamsin Orrow plays him.", "Tamsin Orrow.", "Mira Dalt plays him.", "Tamsin Orrow plays him."]
    target = lost_items.scoreboard.Target("cnq500", Path("unread.json"), "cnq")
    counts = lost_items.tally(target, items, policy, plain, NAMES)
    assert (counts["lost"], counts["question"], counts["passage"], counts["won"]) == (2, 1, 1, 1)
    assert counts["example"] == counts["elsewhere"] == counts["empty"] == 0


def test_main_reads_the_scoreboards_files(tmp_path, capsys):
    shutil.copy(ROOT / "tests" / "suites" / "conflict_dev_filtered.json", tmp_path / "cnq-nqswap.dev500.json")
    items = suites.read_suite("cnq", tmp_path / "cnq-nqswap.dev500.json")
    run = tmp_path / "run" / "checkpoints" / "step-000024" / "policy"
    run.mkdir(parents=True)
    answers = ["<answer>Osric Hallam</answer>"] + ["<answer>x</answer>"] * (len(items) - 1)
    rows = [{"file": "cnq500", "index": i, "policy": answer, "plain": item.golds[0]}
            for i, (item, answer) in enumerate(zip(items, answers))]
    (run.parent / "scoreboard.predictions.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (run.parent / "scoreboard.json").write_text(json.dumps({"model": str(run), "seed": 7}))
    lost_items.main(["--benchmarks", str(tmp_path), str(run.parent / "scoreboard.predictions.jsonl")])
    line = next(l for l in capsys.readouterr().out.splitlines() if l.startswith("run seed 7"))
    assert line.split()[3:] == [str(len(items)), "1", "0", "0", "0", str(len(items) - 1), "0"]


def test_the_held_out_items_lost_are_listed_with_gold_and_answer(tmp_path, capsys):
    rows = [json.loads(line) for line in (ROOT / "data" / "heldout" / "faithfulness.jsonl").read_text().splitlines()]
    golds = [lost_items.answer_span(row["solution"]) for row in rows]
    answers = {5: "10", 22: "Dmitri Pelt"}  # "ten legs" in the passage; the husband, not his job
    predictions = tmp_path / "scoreboard.predictions.jsonl"
    predictions.write_text("".join(json.dumps({"file": "heldout", "index": i, "plain": f"It is {gold}.",
                                               "policy": f"<answer>{answers.get(i, gold)}</answer>"}) + "\n"
                                   for i, gold in enumerate(golds)))
    lost_items.main(["--file", "heldout", "--items", str(predictions)])
    out = capsys.readouterr().out.splitlines()
    assert next(line for line in out if line.startswith("run 1")).split()[2:] == ["2", "0", "0", "0", "1", "1", "0"]
    assert [line for line in out if ": item " in line] == [
        "run 1: item 5 (counterfactual), elsewhere: gold 'ten', answered '10'",
        "run 1: item 22 (multi_hop), passage: gold 'lighthouse keeper', answered 'Dmitri Pelt'"]


def test_cnq500_without_benchmarks_is_refused(tmp_path, capsys):
    with pytest.raises(SystemExit):
        lost_items.main([str(tmp_path / "p.jsonl")])
    assert "cnq500 needs --benchmarks DIR" in capsys.readouterr().err


def test_main_without_the_nq_swap_file_says_so(tmp_path):
    with pytest.raises(SystemExit, match="cnq-nqswap.dev500.json not found"):
        lost_items.main(["--benchmarks", str(tmp_path), str(tmp_path / "p.jsonl")])


def test_doctests():
    result = doctest.testmod(lost_items)
    assert result.attempted > 0 and result.failed == 0
