"""The paper's benchmarks (suites.py) and their runner (evaluate.py --suite), on small files of our own in each
official format (tests/suites/): every prompt string, extraction and scoring rule, with hand-computed scores."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import SMOKE_MODEL

import data
from evaluation import evaluate
from evaluation import suites
from synthetic import synth
from config import load_config

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = Path(__file__).resolve().parent / "suites"

# ---------------------------------------------------------------------------------------------------------------
# Prompts, extraction, normalisation
# ---------------------------------------------------------------------------------------------------------------


def test_prompt_a_is_the_official_string():
    assert suites.PROMPT_A.format("Lyon is the capital.", "What is the capital?") == (
        "<context>Lyon is the capital.</context>\n\nRefer to the passages above, first think about the reasoning "
        "process internally and then answer the following question with just a few words. \n Question:What is the "
        "capital?")


def test_prompt_b_with_options_is_the_official_string():
    prompt = suites.faitheval_prompt("Rome is the capital.", "Which city?", ["A", "B"], ["Paris", "Rome"])
    assert prompt == ("<context> Rome is the capital. </context>\n\nPlease select the correct option according to "
                      "the question, and just output the option letter (e.g. A/B/C/D) Question: Which city?\n"
                      "Options: \nA: Paris\n B: Rome")


def test_evaluation_system_prompt_indents_every_non_empty_line_by_four_spaces():
    indented = suites.indent_system_prompt(data.SYSTEM_PROMPT)
    lines = indented.split("\n")
    assert all(line.startswith("    ") for line in lines if line)
    assert "" in lines  # the blank lines between paragraphs stay empty
    assert "\n".join(line.removeprefix("    ") for line in lines) == data.SYSTEM_PROMPT


@pytest.mark.parametrize("output, expected", [
    (" <think> t </think><long_answer>L</long_answer><answer> Rome </answer> ", ("t", "L", "Rome")),
    ("<answer>Rome</answer><answer>Milan</answer>", (None, None, "Rome")),  # the first match
    # no DOTALL: a section with a newline inside is no match, so the whole stripped output stands for it
    ("<think>a\nb</think><answer>Ro\nme</answer>", (None, None, None)),
    ("Rome", (None, None, None)),  # no tags at all
    ("<answer></answer>", (None, None, "")),
])
def test_extract_is_non_dotall_with_the_whole_output_as_fallback(output, expected):
    whole = output.strip()
    sections = suites.extract(output)
    assert (sections["think"], sections["long_answer"], sections["answer"]) == tuple(
        whole if e is None else e for e in expected)


@pytest.mark.parametrize("text, expected", [
    ("The Eiffel-Tower!", "eiffeltower"),  # deleted, not replaced by a space
    ("$5 + 2 = 7", "5 2 7"),  # the ASCII symbols $ + = are punctuation to SQuAD
    ("<a>|b|~c^`d\\", "abcd"),  # and so are < > | ~ ^ ` \ (deleted first, so "a" is no longer a word)
    ("A", ""),  # a lone option letter is an article
    ("\u201cLyon\u201d", "\u201clyon\u201d"),  # curly quotes are not in string.punctuation
    ("  An   apple  ", "apple"),
])
def test_normalize_is_squads(text, expected):
    assert suites.normalize(text) == expected


# ---------------------------------------------------------------------------------------------------------------
# Scoring rules
# ---------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("prediction, golds, guard, expected", [
    ("No Doubt", ["No Doubt"], True, True),  # the raw guard is case-sensitive: "No" slips through
    ("no doubt", ["No Doubt"], True, False),  # "no" does not
    ("nothing.", ["nothing"], True, True),  # punctuation stays attached in the raw guard: "nothing." slips through
    ("nothing", ["nothing"], True, False),
    ("without", ["without"], True, False),  # "without" and "hardly" are on the official list
    ("hardly", ["hardly"], True, False),
    ("not Paris", ["Paris"], False, False),  # no guard, but "not paris" != "paris" anyway
    ("no", ["No"], False, True),  # CNQ/FollowRAG: no guard
    ("the Paris.", ["Lyon", "Paris"], True, True),  # aliases: any gold
    ("", ["A"], False, True),  # "A" normalises to "": an empty answer matches it
])
def test_exact_match(prediction, golds, guard, expected):
    assert suites.exact_match(prediction, golds, negation_guard=guard) is expected


@pytest.mark.parametrize("prediction, golds, guard, expected", [
    ("Brian", ["Ian"], True, True),  # substring, not word: "ian" is in "brian"
    ("It is Lyon, France", ["Lyon"], True, True),
    ("No Doubt", ["No Doubt"], True, False),  # the recall guard reads the normalised text: "no" is caught
    ("No Doubt", ["No Doubt"], False, True),
    ("Nothing but Lyon", ["Lyon"], True, False),
])
def test_recall(prediction, golds, guard, expected):
    assert suites.recall(prediction, golds, negation_guard=guard) is expected


LABELS, TEXTS = ["A", "B", "C", "D"], ["Paris", "London", "Rome", "Berlin"]


@pytest.mark.parametrize("prediction, official, fixed", [
    # key C; official golds after normalisation: c, paris, paris, b london, london, c rome, rome, d berlin, berlin
    ("C", True, True),
    ("A", False, False),  # "A" -> "": not among the official golds; and not the key
    ("Paris", True, False),  # the bug: any option's text scores
    ("A: Paris", True, False),  # "a paris" -> article removed -> "paris"
    ("A. Paris", True, False),
    ("(A)", False, False),  # "(a)" -> "a" -> ""
    ("Rome", True, True),
    ("C: Rome", True, True),  # "c rome"
    ("(C)", True, True),  # official: "(c)" -> "c"; fixed: the letter C
    ("", False, False),
])
def test_faitheval_examples_official_and_fixed(prediction, official, fixed):
    golds = suites.faitheval_golds("C", LABELS, TEXTS)
    assert golds == ["C", "A: Paris", "Paris", "B: London", "London", "C: Rome", "Rome", "D: Berlin", "Berlin"]
    assert suites.exact_match(prediction, golds, negation_guard=False) is official
    assert suites.faitheval_fixed(prediction, "C", LABELS, TEXTS) is fixed


def test_faitheval_key_a_lets_an_empty_answer_score_officially_but_not_fixed():
    golds = suites.faitheval_golds("A", LABELS, TEXTS)
    assert suites.exact_match("", golds, negation_guard=False) is True  # normalize("") == normalize("A") == ""
    assert suites.faitheval_fixed("", "A", LABELS, TEXTS) is False
    assert suites.faitheval_fixed("a", "A", LABELS, TEXTS) is True


def test_mr_is_po_over_ps_plus_po_and_zero_when_both_are_zero():
    items = [suites.Item(0, 0, "q", "p", ("Lyon",), ("Paris",)), suites.Item(1, 1, "q", "p", ("Rome",), ("Milan",))]
    # item 0 "Paris" -> po; item 1 "Rome" -> ps, em: ps 50, po 50, mr = 50 / (50 + 50) * 100 = 50
    assert suites.score("confiqa", items, ["Paris", "Rome"]) == {"n": 2, "em": 50.0, "ps": 50.0, "po": 50.0,
                                                                  "mr": 50.0}
    assert suites.score("confiqa", items, ["x", "y"])["mr"] == 0.0
    with pytest.raises(ValueError, match="one prediction per item"):
        suites.score("confiqa", items, ["x"])


# ---------------------------------------------------------------------------------------------------------------
# The fixtures, one per suite, scored as the official scripts would
# ---------------------------------------------------------------------------------------------------------------

# suite -> (benchmark file, predictions file, expected scores); the reasoning is in the tests below.
# `answer`: the share of outputs with an <answer> span (ConFiQA's last output has a newline inside it, CNQ's fourth
# too); an official result file holds no outputs, so FiQA's is None.
CASES = {
    "confiqa": ("ConFiQA-QA-test.json", "confiqa.predictions.jsonl",
                {"n": 8, "em": 37.5, "ps": 50.0, "po": 25.0, "mr": 100 * 25.0 / 75.0, "answer": 7 / 8}),
    "fiqa": ("ConFiQA-QA-test.json", "fiqa.official-result.json",
             {"n": 8, "em": 75.0, "ps": 75.0, "po": 12.5, "mr": 100 * 12.5 / 87.5, "answer": None}),
    "cnq": ("conflict_dev_filtered.json", "cnq.predictions.jsonl", {"n": 4, "em": 50.0, "answer": 3 / 4}),
    "faitheval": ("faitheval-counterfactual.jsonl", "faitheval.predictions.jsonl",
                  {"n": 8, "acc": 75.0, "acc_fixed": 25.0, "answer": 1.0}),
    "followrag": ("hq.json", "followrag.predictions.jsonl", {"n": 4, "em": 50.0, "answer": 1.0}),
}


def hits(suite: str) -> list[dict[str, bool]]:
    file, predictions, _ = CASES[suite]
    items = suites.read_suite(suite, FIXTURES / file)
    found = evaluate.read_predictions(FIXTURES / predictions, items)
    return [suites.item_hits(suite, item, f["pred"]) for item, f in zip(items, found)]


def test_confiqa_fixture_item_by_item():
    # answers (extracted from the outputs) against gold [cf_answer, *cf_alias] and other [orig_answer, *orig_alias]
    assert hits("confiqa") == [
        {"em": True, "ps": True, "po": False},  # 0 "Lyon." vs Lyon; other Paris / City of Light absent
        {"em": True, "ps": False, "po": False},  # 1 "No Doubt": "No" slips the raw EM guard, not the recall guard
        {"em": False, "ps": False, "po": False},  # 2 "no doubt": caught by both guards
        {"em": False, "ps": True, "po": False},  # 3 "Brian" vs Ian: substring recall
        {"em": False, "ps": False, "po": True},  # 4 "Bonn": the original answer
        {"em": False, "ps": False, "po": True},  # 5 "Rome or Milan": gold and other both in it, so ps is 0
        {"em": True, "ps": True, "po": False},  # 6 "the UK": the alias UK
        # 7 "<answer>Lyon\nFrance</answer>" has a newline: the whole output is the answer, normalised to
        #   "thinktthinkanswerlyon franceanswer", which holds "lyon" (ps) but equals nothing (em)
        {"em": False, "ps": True, "po": False},
    ]
    # em 3/8 = 37.5, ps 4/8 = 50, po 2/8 = 25, mr = 25 / (50 + 25) * 100 = 33.33
    assert suites.score("confiqa", *_items_and_preds("confiqa")) | {"answer": CASES["confiqa"][2]["answer"]} == CASES["confiqa"][2]


def test_fiqa_fixture_from_an_official_result_file():
    # FiQA: gold [orig_answer, *orig_alias], other the cf answers; `pred` of the result file is used as it is
    assert hits("fiqa") == [
        {"em": True, "ps": True, "po": False},  # 0 "City of Light": the alias of Paris
        {"em": True, "ps": True, "po": False},  # 1 "Nirvana"
        {"em": False, "ps": False, "po": False},  # 2 "not Nirvana": both guards
        {"em": True, "ps": True, "po": False},  # 3 "Mary"
        {"em": False, "ps": False, "po": True},  # 4 "Berlin": the counterfactual answer
        {"em": True, "ps": True, "po": False},  # 5 "Milan"
        {"em": True, "ps": True, "po": False},  # 6 "France"
        {"em": True, "ps": True, "po": False},  # 7 "Paris"
    ]
    # em 6/8 = 75, ps 6/8 = 75, po 1/8 = 12.5, mr = 12.5 / 87.5 * 100 = 14.29
    assert suites.score("fiqa", *_items_and_preds("fiqa")) | {"answer": CASES["fiqa"][2]["answer"]} == CASES["fiqa"][2]


def test_cnq_fixture():
    # 0 "abraham lincoln" = Abraham Lincoln; 1 "no" = No (CNQ has no negation guard); 2 "Superior" is not
    # "Lake Superior" (EM only, no recall); 3 "Mount\nEverest" inside <answer> -> the whole output, no match.
    assert hits("cnq") == [{"em": True}, {"em": True}, {"em": False}, {"em": False}]  # 2/4 = 50


def test_followrag_fixture_splits_gold_on_every_slash_and_cuts_the_context():
    items = suites.read_suite("followrag", FIXTURES / "hq.json")
    assert items[0].golds == ("Seattle", "Seattle, Washington")
    assert items[1].golds == ("AC", "DC")  # a real "/" inside an answer is split too, as in the official script
    assert items[3].golds == ("1969",)
    record = json.loads((FIXTURES / "hq.json").read_text())[0]
    # the passages: between "Given the following information:" and "Answer the following question", stripped
    passages = ("Passage-0: The Space Needle is in Seattle.\nPassage-1: Seattle is in Washington.\n"
                "Passage-2: Needles are sharp.")
    assert suites.followrag_context(record["prompt"]) == passages
    assert items[0].problem == suites.PROMPT_A.format(passages, "where is the space needle")
    # 0 "Seattle, Washington" (the 2nd alias); 1 "AC/DC" -> "acdc", neither "ac" nor "dc"; 2 "DC" -> "dc" scores;
    # 3 "In 1969" != "1969": 2/4 = 50
    assert hits("followrag") == [{"em": True}, {"em": False}, {"em": True}, {"em": False}]


def test_faitheval_fixture():
    # keys C (items 0-6) and A (item 7), options A Paris / B London / C Rome / D Berlin; answers
    # C, A, Paris, "A: Paris", "A. Paris", (A), Rome, "" -> official 1,0,1,1,1,0,1,1 (6/8 = 75),
    # fixed 1,0,0,0,0,0,1,0 (2/8 = 25)
    assert [h["acc"] for h in hits("faitheval")] == [True, False, True, True, True, False, True, True]
    assert [h["acc_fixed"] for h in hits("faitheval")] == [True, False, False, False, False, False, True, False]


def _items_and_preds(suite: str) -> tuple[list[suites.Item], list[str]]:
    file, predictions, _ = CASES[suite]
    items = suites.read_suite(suite, FIXTURES / file)
    return items, [f["pred"] for f in evaluate.read_predictions(FIXTURES / predictions, items)]


def test_faitheval_reads_parquet_and_save_to_disk_folders_as_the_jsonl(tmp_path):
    import datasets

    expected = suites.read_suite("faitheval", FIXTURES / "faitheval-counterfactual.jsonl")
    table = datasets.Dataset.from_json(str(FIXTURES / "faitheval-counterfactual.jsonl"))
    table.to_parquet(str(tmp_path / "test.parquet"))
    datasets.DatasetDict({"test": table}).save_to_disk(str(tmp_path / "saved"))
    assert suites.read_suite("faitheval", tmp_path / "test.parquet") == expected
    assert suites.read_suite("faitheval", tmp_path / "saved") == expected  # the split "test", as officially
    # the hub's own layout, a folder of data files named by split
    (tmp_path / "hub" / "data").mkdir(parents=True)
    table.to_parquet(str(tmp_path / "hub" / "data" / "test-00000-of-00001.parquet"))
    assert suites.read_suite("faitheval", tmp_path / "hub") == expected


def test_confiqa_reader_and_prompts():
    items = suites.read_suite("confiqa", FIXTURES / "ConFiQA-QA-test.json")
    assert items[6].golds == ("United Kingdom", "UK", "Britain") and items[6].others == ("France",)
    assert items[0].problem == suites.PROMPT_A.format("The capital of France is Lyon.", "What is the capital of France?")
    factual = suites.read_suite("fiqa", FIXTURES / "ConFiQA-QA-test.json")
    assert factual[0].golds == ("Paris", "City of Light") and factual[0].others == ("Lyon",)
    assert factual[0].problem == suites.PROMPT_A.format("The capital of France is Paris.", "What is the capital of France?")


def test_reader_and_prediction_errors_name_the_item(tmp_path):
    records = json.loads((FIXTURES / "ConFiQA-QA-test.json").read_text())
    del records[1]["cf_alias"]
    (tmp_path / "bad.json").write_text(json.dumps(records))
    with pytest.raises(data.DataError, match=r"bad.json: item 1: field 'cf_alias' missing"):
        suites.read_suite("confiqa", tmp_path / "bad.json")
    items = suites.read_suite("confiqa", FIXTURES / "ConFiQA-QA-test.json")
    with pytest.raises(data.DataError, match="7 predictions for 8 items"):
        lines = (FIXTURES / "confiqa.predictions.jsonl").read_text().splitlines()[:7]
        (tmp_path / "short.jsonl").write_text("\n".join(lines) + "\n")
        evaluate.read_predictions(tmp_path / "short.jsonl", items)
    assert len(evaluate.read_predictions(tmp_path / "short.jsonl", items[:7])) == 7  # what --limit 7 scores
    swapped = json.loads((FIXTURES / "fiqa.official-result.json").read_text())
    swapped[0], swapped[1] = swapped[1], swapped[0]
    (tmp_path / "swapped.json").write_text(json.dumps(swapped))
    with pytest.raises(data.DataError, match="prediction 0: its question"):
        evaluate.read_predictions(tmp_path / "swapped.json", items)


# ---------------------------------------------------------------------------------------------------------------
# Suite inputs: predictions files as the runs and the official scripts write them
# ---------------------------------------------------------------------------------------------------------------


def _confiqa_predictions() -> list[dict]:
    return [json.loads(line) for line in (FIXTURES / "confiqa.predictions.jsonl").read_text().split("\n") if line]


@pytest.mark.parametrize("char", ["\u2028", "\u2029", "\u0085"])
def test_jsonl_predictions_split_on_newline_only_so_line_separators_in_strings_stay(char, tmp_path):
    # JSON allows these characters raw inside a string; str.splitlines would break the record there. CRLF ends
    # the lines of this file: the "\r" goes with the "\n".
    records = _confiqa_predictions()
    for record in records[:7]:  # not item 7, whose answer is its whole output (a newline in its <answer>)
        record["output"] = record["output"].replace("<think>", f"<think>x{char}y ", 1)
    path = tmp_path / "p.jsonl"
    path.write_bytes("".join(json.dumps(r, ensure_ascii=False) + "\r\n" for r in records).encode("utf-8"))
    assert char.encode("utf-8") in path.read_bytes()  # written raw, not escaped
    items = suites.read_suite("confiqa", FIXTURES / "ConFiQA-QA-test.json")
    found = evaluate.read_predictions(path, items)
    expected = evaluate.read_predictions(FIXTURES / "confiqa.predictions.jsonl", items)
    assert [f["pred"] for f in found] == [f["pred"] for f in expected]
    assert found[0]["think"] == f"x{char}y The passage says Lyon."  # "." matches it: no DOTALL needed


@pytest.mark.parametrize("char", ["\x0b", "\x0c", "\x1c", "\x1d", "\x1e"])
def test_a_raw_control_character_in_a_jsonl_string_is_reported_as_such_on_its_line(char, tmp_path):
    # JSON must escape these (they are control characters), so the record is invalid; the error says why, on
    # the record's own line, instead of an "unterminated string" where str.splitlines cut the line.
    lines = [json.dumps(r) for r in _confiqa_predictions()]
    lines[2] = lines[2].replace("<think>", f"<think>x{char}y", 1)
    (tmp_path / "p.jsonl").write_text("\n".join(lines) + "\n")
    column = lines[2].index(char) + 1
    items = suites.read_suite("confiqa", FIXTURES / "ConFiQA-QA-test.json")
    with pytest.raises(data.DataError, match=rf"p.jsonl:3:{column}: not valid JSON \(Invalid control character at\)"):
        evaluate.read_predictions(tmp_path / "p.jsonl", items)


def test_jsonl_predictions_allow_blank_lines_at_the_end_only(tmp_path):
    items = suites.read_suite("confiqa", FIXTURES / "ConFiQA-QA-test.json")
    lines = [json.dumps(r) for r in _confiqa_predictions()]
    (tmp_path / "trailing.jsonl").write_text("\n".join(lines) + "\n\n  \n\n")
    assert len(evaluate.read_predictions(tmp_path / "trailing.jsonl", items)) == 8
    (tmp_path / "middle.jsonl").write_text("\n".join(lines[:2] + [""] + lines[2:]) + "\n")
    with pytest.raises(data.DataError, match=r"middle.jsonl:3: blank line \(blank lines are allowed only at the end"):
        evaluate.read_predictions(tmp_path / "middle.jsonl", items)


def test_a_json_list_with_a_syntax_error_is_reported_at_its_own_line_and_column(tmp_path):
    # The official result file is pretty-printed (a list over many lines); break the value of one "pred".
    lines = (FIXTURES / "fiqa.official-result.json").read_text().split("\n")
    number = next(n for n, line in enumerate(lines, start=1) if line.strip() == '"pred": "Milan",')
    lines[number - 1] = lines[number - 1].replace('"Milan"', "Milan")
    column = lines[number - 1].index("Milan") + 1
    assert number > 100  # far from line 1, where a reading as JSONL would put the error
    (tmp_path / "broken.json").write_text("\n\n" + "\n".join(lines))  # blank lines before the "[" too
    items = suites.read_suite("fiqa", FIXTURES / "ConFiQA-QA-test.json")
    with pytest.raises(data.DataError, match=rf"broken.json:{number + 2}:{column}: not valid JSON \(Expecting value\)"):
        evaluate.read_predictions(tmp_path / "broken.json", items)
    # a file that starts with "{" is JSONL: its errors name the line, and the column ("}" is the 12th character)
    (tmp_path / "broken.jsonl").write_text('{"output": "a"}\n{"output": }\n')
    with pytest.raises(data.DataError, match=r"broken.jsonl:2:12: not valid JSON \(Expecting value\)"):
        evaluate.read_predictions(tmp_path / "broken.jsonl", items[:2])


def test_predictions_files_with_a_utf8_byte_order_mark_are_read(tmp_path):
    items = suites.read_suite("fiqa", FIXTURES / "ConFiQA-QA-test.json")
    expected = evaluate.read_predictions(FIXTURES / "fiqa.official-result.json", items)
    (tmp_path / "bom.json").write_bytes(b"\xef\xbb\xbf" + (FIXTURES / "fiqa.official-result.json").read_bytes())
    assert evaluate.read_predictions(tmp_path / "bom.json", items) == expected
    (tmp_path / "latin1.jsonl").write_bytes(b'{"output": "caf\xe9"}\n')
    with pytest.raises(data.DataError, match="latin1.jsonl: not valid UTF-8"):
        evaluate.read_predictions(tmp_path / "latin1.jsonl", items[:1])


def test_predictions_without_a_question_warn_once_per_file_that_they_are_paired_by_position(tmp_path):
    items = suites.read_suite("confiqa", FIXTURES / "ConFiQA-QA-test.json")
    records = _confiqa_predictions()
    for record in records[2:5]:
        del record["question"]
    (tmp_path / "p.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    with pytest.warns(UserWarning) as caught:
        evaluate.read_predictions(tmp_path / "p.jsonl", items)
    assert len(caught) == 1  # once per file, not once per record
    message = str(caught[0].message)
    assert "p.jsonl: 3 of 8 predictions have no 'question'" in message
    assert "the i-th prediction is scored against the i-th item of --eval-file" in message
    assert "Add a 'question' field" in message
    assert issubclass(caught[0].category, evaluate.UnpairedPredictionsWarning)
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")  # every record names its question: no warning
        evaluate.read_predictions(FIXTURES / "confiqa.predictions.jsonl", items)


def _confiqa_file(tmp_path: Path, n: int) -> tuple[Path, Path]:
    """A ConFiQA file of n items (gold Lyon, other Paris) and predictions for it: among the first 100 items the
    even ones answer Lyon and the odd ones Paris (em 50, ps 50, po 50); every later item answers Lyon."""
    records = [{"question": f"Q{i}?", "cf_context": "Lyon.", "cf_answer": "Lyon", "cf_alias": [],
                "orig_context": "Paris.", "orig_answer": "Paris", "orig_alias": []} for i in range(n)]
    answers = ["Paris" if i < 100 and i % 2 else "Lyon" for i in range(n)]
    (tmp_path / "big.json").write_text(json.dumps(records))
    (tmp_path / "big.predictions.jsonl").write_text("".join(
        json.dumps({"question": r["question"], "output": f"<answer>{a}</answer>"}) + "\n"
        for r, a in zip(records, answers)))
    return tmp_path / "big.json", tmp_path / "big.predictions.jsonl"


def test_the_official_scripts_last_printed_figure_is_reported_beside_ours(tmp_path, capsys):
    eval_file, predictions = _confiqa_file(tmp_path, 150)
    (tmp_path / "config.toml").write_text(f'output_dir = "{tmp_path}/run"\n')
    cfg = load_config(tmp_path / "config.toml")
    scores = evaluate.main(cfg, model=None, eval_file=str(eval_file), suite="confiqa", predictions=str(predictions))
    # ours, every item: em = ps = 100/150, po = 50/150, mr = po / (ps + po) = 50/150
    assert {k: v for k, v in scores.items() if k != "answer"} == pytest.approx({"n": 150, "em": 100 * 100 / 150, "ps": 100 * 100 / 150, "po": 100 * 50 / 150,
                                    "mr": 100 * 50 / 150})
    # the official script last printed after item 100: em = ps = po = 50, mr = 50 / (50 + 50) = 50
    last = {"items": 100, "scores": {"em": 50.0, "ps": 50.0, "po": 50.0, "mr": 50.0}}
    report = json.loads((tmp_path / "run" / "eval" / "big.predictions-confiqa.json").read_text())
    assert report["official_last_printed"] == last
    assert suites.official_last_printed("confiqa", *_items_and_answers(eval_file, predictions)) == last
    table = " ".join(capsys.readouterr().out.split())
    assert "150 1.000 66.67 66.67 33.33 33.33" in table and "100 50.00 50.00 50.00 50.00" in table
    assert "first 100 of 150 items" in table


def _items_and_answers(eval_file: Path, predictions: Path) -> tuple[list[suites.Item], list[str]]:
    items = suites.read_suite("confiqa", eval_file)
    return items, [f["pred"] for f in evaluate.read_predictions(predictions, items)]


def test_the_official_last_print_is_left_out_where_there_is_none_to_compare(tmp_path):
    eval_file, predictions = _confiqa_file(tmp_path, 200)
    items, answers = _items_and_answers(eval_file, predictions)
    # a multiple of 100: the official script's last figure is over every item, so it is ours
    last = suites.official_last_printed("confiqa", items, answers)
    assert last == {"items": 200, "scores": {k: v for k, v in suites.score("confiqa", items, answers).items()
                                             if k != "n"}}
    assert suites.official_last_printed("confiqa", items[:100], answers[:100]) is None  # 100 items or fewer
    assert suites.official_last_printed("confiqa", items[:101], answers[:101])["items"] == 100
    # only the ConFiQA, FiQA and FaithEval scripts print every 100 items
    cnq = [suites.Item(i, i, "q", "p", ("Lyon",)) for i in range(150)]
    assert suites.official_last_printed("cnq", cnq, ["Lyon"] * 150) is None
    assert suites.official_last_printed("followrag", cnq, ["Lyon"] * 150) is None


# ---------------------------------------------------------------------------------------------------------------
# The runner: `--eval --suite NAME --eval-file F --predictions P`
# ---------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("suite", sorted(CASES))
def test_eval_suite_with_predictions_prints_and_writes_the_scores(suite, tmp_path, capsys):
    file, predictions, expected = CASES[suite]
    (tmp_path / "config.toml").write_text(f'output_dir = "{tmp_path}/run"\n')
    cfg = load_config(tmp_path / "config.toml")
    scores = evaluate.main(cfg, model=None, eval_file=str(FIXTURES / file), suite=suite,
                           predictions=str(FIXTURES / predictions))
    assert scores == expected
    table = capsys.readouterr().out
    assert " ".join(suites.METRICS[suite]) in " ".join(table.split())  # the official names, in order
    answer = "-" if expected["answer"] is None else f"{expected['answer']:.3f}"
    assert f"{expected['n']} {answer} " + " ".join(f"{expected[m]:.2f}" for m in suites.METRICS[suite]) in " ".join(table.split())
    name = f"{Path(predictions).stem}-{suite}"
    report = json.loads((tmp_path / "run" / "eval" / f"{name}.json").read_text())
    assert report["scores"] == expected and report["suite"] == suite
    lines = (tmp_path / "run" / "eval" / f"{name}.predictions.jsonl").read_text().splitlines()
    assert len(lines) == expected["n"] and all("pred" in json.loads(line) for line in lines)


def test_canoe_eval_suite_command_line(tmp_path):
    (tmp_path / "config.toml").write_text(f'output_dir = "{tmp_path}/run"\n')
    result = subprocess.run([sys.executable, str(ROOT / "canoe.py"), "--config", str(tmp_path / "config.toml"),
                             "--eval", "--suite", "confiqa", "--eval-file", str(FIXTURES / "ConFiQA-QA-test.json"),
                             "--predictions", str(FIXTURES / "confiqa.predictions.jsonl")],
                            cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "em ps po mr" in " ".join(result.stdout.split())
    assert "8 0.875 37.50 50.00 25.00 33.33" in " ".join(result.stdout.split())
    report = json.loads((tmp_path / "run" / "eval" / "confiqa.predictions-confiqa.json").read_text())
    assert report["scores"]["em"] == 37.5


def test_sampling_settings_are_the_models_own_with_hugging_faces_defaults(tmp_path):
    assert evaluate.sampling_settings(str(tmp_path), sample=False) == {"temperature": 0.0}
    # no generation_config.json, or one without do_sample: `generate` would decode greedily
    assert evaluate.sampling_settings(str(tmp_path), sample=True) == {"temperature": 0.0}
    (tmp_path / "generation_config.json").write_text(json.dumps({"do_sample": True, "temperature": 0.6, "top_p": 0.9}))
    # top_k is HF's default 50 (vLLM's own default would be no top-k); min_p and repetition_penalty off
    assert evaluate.sampling_settings(str(tmp_path), sample=True) == {
        "temperature": 0.6, "top_p": 0.9, "top_k": 50, "min_p": 0.0, "repetition_penalty": 1.0}


def test_synthetic_counterfactual_rows_as_confiqa_records(tmp_path):
    _, rows = synth.synthesize(n=40, eval_share=0.5, seed=3)
    records = synth.to_confiqa(rows)
    counterfactual = [r for r in rows if r["task"] == "counterfactual"]
    assert len(records) == len(counterfactual) > 0
    for row, record in zip(counterfactual, records):
        assert record["cf_answer"] == data.answer_span(row["solution"])
        assert record["orig_answer"] == synth.world_fact(row["relation"], row["entities"][0]) != record["cf_answer"]
        assert row["problem"].startswith(f"<context>{record['cf_context']}</context>\n\n")
        assert row["problem"].endswith(record["question"]) and record["question"].endswith("?")
        assert "passage" not in record["question"] and "Question" not in record["question"]
        assert record["orig_context"] != record["cf_context"] and record["orig_answer"] in record["orig_context"]
    (tmp_path / "eval-confiqa.json").write_text(json.dumps(records))
    items = suites.read_suite("confiqa", tmp_path / "eval-confiqa.json")
    assert [item.golds for item in items] == [(r["cf_answer"],) for r in records]


@pytest.mark.skipif(not SMOKE_MODEL.exists(), reason="needs `make setup` (models/smoke-llama)")
def test_eval_suite_answers_every_item_with_a_real_model(tmp_path):
    (tmp_path / "config.toml").write_text(f'model = "models/smoke-llama"\noutput_dir = "{tmp_path}/run"\n'
                                          'suite_max_tokens = 40\nmax_prompt_tokens = 64\ndtype = "float32"\n')
    # max_prompt_tokens = 64 is shorter than these prompts: a suite never drops one, it sizes the engine instead
    result = subprocess.run([sys.executable, str(ROOT / "canoe.py"), "--config", str(tmp_path / "config.toml"),
                             "--eval", "--suite", "confiqa", "--eval-file", str(FIXTURES / "ConFiQA-QA-test.json"),
                             "--limit", "3"], cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-4000:]
    report = json.loads((tmp_path / "run" / "eval" / "smoke-llama-confiqa-ConFiQA-QA-test.json").read_text())
    assert report["scores"]["n"] == 3 and report["sampling"] == {"temperature": 0.0} and report["max_new_tokens"] == 40
    assert report["system_prompt_indented"] is True
    lines = [json.loads(line) for line in
             (tmp_path / "run" / "eval" / "smoke-llama-confiqa-ConFiQA-QA-test.predictions.jsonl").read_text().splitlines()]
    assert [line["index"] for line in lines] == [0, 1, 2] and all(line["output"] for line in lines)
    # the scores of the outputs, computed again here from ConFiQA's rules
    records = json.loads((FIXTURES / "ConFiQA-QA-test.json").read_text())[:3]
    assert report["scores"] == confiqa_by_hand([line["output"] for line in lines], records)


def confiqa_by_hand(outputs: list[str], records: list[dict]) -> dict:
    """ConFiQA's scores as its official script states them, written out apart from evaluation/suites.py: the answer
    is the first one-line <answer>…</answer> of the stripped output (else all of it); SQuAD's normalisation; EM: the
    answer equals a counterfactual gold and holds no negation word; ps: a counterfactual gold is inside it and no
    original answer is; po: an original answer is inside it; MR = po / (ps + po); and the share of outputs with an
    answer span."""
    import re
    import string

    def norm(text: str) -> str:
        text = "".join(ch for ch in text.lower() if ch not in string.punctuation)
        return " ".join(re.sub(r"\b(a|an|the)\b", " ", text).split())

    negations = {"no", "not", "never", "none", "cannot", "nobody", "nothing", "nowhere", "neither", "nor", "without",
                 "hardly"}
    em = ps = po = spans = 0
    for output, record in zip(outputs, records):
        match = re.search(r"<answer>(.*?)</answer>", output.strip())
        answer = match.group(1).strip() if match else output.strip()
        spans += match is not None
        cf, orig = [record["cf_answer"], *record["cf_alias"]], [record["orig_answer"], *record["orig_alias"]]
        em += not negations & set(answer.split()) and norm(answer) in {norm(gold) for gold in cf}
        other = any(norm(gold) in norm(answer) for gold in orig)
        ps += not negations & set(norm(answer).split()) and any(norm(gold) in norm(answer) for gold in cf) and not other
        po += other
    n = len(outputs)
    mr = 100.0 * po / (ps + po) if ps + po else 0.0
    return {"n": n, "answer": spans / n, "em": 100.0 * em / n, "ps": 100.0 * ps / n, "po": 100.0 * po / n, "mr": mr}


@pytest.mark.skipif(not SMOKE_MODEL.exists(), reason="needs `make setup` (models/smoke-llama)")
def test_a_suite_generates_up_to_suite_max_tokens_not_the_training_completion_length(tmp_path, monkeypatch):
    """The official evaluation lets the model write up to 1024 new tokens; the training's max_completion_tokens
    (128 in config.toml) must not cut a suite's outputs before their <answer> span."""
    calls = []

    def fake_generate(cfg, model, prompt_ids, settings, max_model_len, max_tokens):
        calls.append((max_model_len, max_tokens, max(len(ids) for ids in prompt_ids)))
        return ["<think>t</think><answer>Rome</answer>"] * len(prompt_ids)

    monkeypatch.setattr(evaluate, "generate", fake_generate)
    (tmp_path / "config.toml").write_text(f'model = "models/smoke-llama"\noutput_dir = "{tmp_path}/run"\n'
                                          'max_completion_tokens = 16\n')
    cfg = load_config(tmp_path / "config.toml")
    assert cfg.suite_max_tokens == 1024  # the default: the official scripts' limit
    evaluate.main(cfg, model=None, eval_file=str(FIXTURES / "ConFiQA-QA-test.json"), limit=2, suite="confiqa")
    [(max_model_len, max_tokens, longest_prompt)] = calls
    assert max_tokens == 1024 and max_model_len == longest_prompt + 1024
    report = json.loads((tmp_path / "run" / "eval" / "smoke-llama-confiqa-ConFiQA-QA-test.json").read_text())
    assert report["max_new_tokens"] == 1024 and report["scores"]["answer"] == 1.0


def test_answer_share_counts_outputs_with_an_answer_span():
    outputs = ["<think>t</think><answer>Rome</answer>", "<think>Rome</think>", "<answer>Ro\nme</answer>",
               " <answer></answer> ", "<answer>Rome"]
    assert [suites.has_answer_span(o) for o in outputs] == [True, False, False, True, False]
    assert suites.answer_share(outputs) == 2 / 5
    with pytest.raises(ValueError):
        suites.answer_share([])


def test_doctests():
    import doctest

    result = doctest.testmod(suites)
    assert result.attempted > 0 and result.failed == 0
