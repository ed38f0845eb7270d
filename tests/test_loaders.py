"""Tests for evaluation/loaders.py: ConFiQA-style lists read as rows, `load_eval_rows`'s choice of loader and the
`check` command."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from data import DataError
from evaluation import loaders

GOOD = {"problem": "<context>Paris is in France.</context>\n\nWhere is Paris?", "solution": "<answer>France</answer>"}


def write(tmp_path: Path, name: str, content: str) -> Path:
    path = tmp_path / name
    path.write_text(content, encoding="utf-8")
    return path


CONFIQA_ITEM = {
    "question": "What is the capital of France?",
    "orig_context": "The capital of France is Paris.",
    "orig_answer": "Paris",
    "cf_context": "The capital of France is Lyon.",
    "cf_answer": "Lyon",
    "cf_alias": ["Lyons"],
}


def test_confiqa_counterfactual_is_the_default_and_other_fields_are_kept(tmp_path):
    path = write(tmp_path, "c.json", json.dumps([CONFIQA_ITEM]))
    [row] = loaders.load_confiqa(path)
    assert row == {
        "problem": "<context>The capital of France is Lyon.</context>\n\nWhat is the capital of France?",
        "solution": "<answer>Lyon</answer>",
        "orig_context": "The capital of France is Paris.",
        "orig_answer": "Paris",
        "cf_alias": ["Lyons"],
    }
    assert loaders.load_eval_rows(path) == [row]


def test_confiqa_original_and_plain_variants(tmp_path):
    path = write(tmp_path, "c.json", json.dumps([CONFIQA_ITEM]))
    [row] = loaders.load_confiqa(path, variant="original")
    assert row["solution"] == "<answer>Paris</answer>" and "Paris.</context>" in row["problem"]
    assert row["cf_answer"] == "Lyon"
    plain = write(tmp_path, "p.json", json.dumps([{"context": "Sky is green.", "question": "Sky?", "answer": "green"}]))
    assert loaders.load_confiqa(plain) == [{"problem": "<context>Sky is green.</context>\n\nSky?",
                                         "solution": "<answer>green</answer>"}]


@pytest.mark.parametrize(
    "content, message",
    [
        ('{"question": "q"}', "expected a JSON list of objects, got dict"),
        ("[]", "no records (the list is empty)"),
        ('[{"question": "q", "foo": 1}]', "item 0 has none of the known context/answer field pairs"),
        (json.dumps([CONFIQA_ITEM, {**CONFIQA_ITEM, "question": 5}]),
         "item 1: field(s) 'question' missing or not a string"),
        (json.dumps([CONFIQA_ITEM, "x"]), "item 1: expected a JSON object, got str"),
        (json.dumps([CONFIQA_ITEM, {k: v for k, v in CONFIQA_ITEM.items() if k != "cf_answer"}]),
         "item 1: field(s) 'cf_answer' missing or not a string"),
        (json.dumps([{**CONFIQA_ITEM, "cf_context": "a </context> b"}]),
         "item 0: 'cf_context' contains a <context> tag"),
        (json.dumps([{**CONFIQA_ITEM, "cf_context": "  "}]),
         "item 0: 'problem' has an empty <context></context> block"),
        (json.dumps([{**CONFIQA_ITEM, "solution": "x"}]), "item 0: already has field(s) ['solution']"),
        ('[\n{"question": \n', "c.json:3: not valid JSON"),
    ],
)
def test_confiqa_errors(tmp_path, content, message):
    path = write(tmp_path, "c.json", content)
    with pytest.raises(DataError, match=re.escape(message)):
        loaders.load_confiqa(path)


def test_confiqa_unknown_variant_and_missing_file(tmp_path):
    with pytest.raises(ValueError, match="unknown ConFiQA variant"):
        loaders.load_confiqa(tmp_path / "c.json", variant="weird")
    with pytest.raises(DataError, match="data file not found"):
        loaders.load_confiqa(tmp_path / "c.json")


def test_eval_rows_read_training_records_as_training_data(tmp_path):
    # a JSON list of training records is read as it is (not as a ConFiQA file), and so is every other format
    rows = [GOOD, {**GOOD, "task": "multi_hop"}]
    assert loaders.load_eval_rows(write(tmp_path, "rows.json", json.dumps(rows))) == rows
    assert loaders.load_eval_rows(write(tmp_path, "rows.jsonl", "".join(json.dumps(r) + "\n" for r in rows))) == rows
    with pytest.raises(DataError, match=re.escape("expected a JSON list of objects, got dict")):
        loaders.load_eval_rows(write(tmp_path, "d.json", '{"problem": "p"}'))


def test_check_command(capsys, tmp_path):
    rows = [{**GOOD, "task": "multi_hop"}, {**GOOD, "task": "straightforward"}, GOOD]
    path = write(tmp_path, "rows.jsonl", "".join(json.dumps(row) + "\n" for row in rows))
    assert loaders.main(["check", str(path)]) == 0
    assert f"{path}: 3 rows (straightforward 1, multi_hop 1, (no task) 1)" in capsys.readouterr().out
    confiqa = write(tmp_path, "c.json", json.dumps([CONFIQA_ITEM]))
    assert loaders.main(["check", str(confiqa), "--confiqa-variant", "original"]) == 0
    assert f"{confiqa}: 1 rows ((no task) 1)" in capsys.readouterr().out
    assert loaders.main(["check", str(write(tmp_path, "bad.jsonl", "x\n"))]) == 1
    assert ":1: not valid JSON" in capsys.readouterr().err
