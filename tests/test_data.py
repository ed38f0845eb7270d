"""Tests for data.py: loaders and their error messages, prompt rendering and the overflow rule, the per-rank
sampler and its resume state, exact_match (the synthetic data: tests/test_synth.py; ConFiQA-style lists and the
`check` command: tests/test_loaders.py)."""

from __future__ import annotations

import copy
import doctest
import json
import re
from pathlib import Path

import pytest

import data
from data import DataError

GOOD = {"problem": "<context>Paris is in France.</context>\n\nWhere is Paris?", "solution": "<answer>France</answer>"}
GOOD_LINE = json.dumps(GOOD)


def write(tmp_path: Path, name: str, content: str | bytes) -> Path:
    path = tmp_path / name
    if isinstance(content, bytes):
        path.write_bytes(content)
    else:
        path.write_text(content, encoding="utf-8")
    return path


# ---------------------------------------------------------------------------------------------------------------
# load_jsonl
# ---------------------------------------------------------------------------------------------------------------


def test_load_jsonl_keeps_extra_fields_and_allows_trailing_blank_lines(tmp_path):
    extra = {**GOOD, "id": "q7", "task": "counterfactual", "aliases": ["FR"]}
    path = write(tmp_path, "d.jsonl", f"{GOOD_LINE}\n{json.dumps(extra)}\n\n  \n")
    rows = data.load_jsonl(path)
    assert rows == [GOOD, extra]


def test_load_jsonl_multiline_context_bom_and_line_separator(tmp_path):
    # A context spanning lines (escaped \n in JSON), a UTF-8 BOM, and a raw U+2028 inside a JSON string, which
    # JSON allows and which must not be taken for a line break.
    row = {"problem": "<context>line one\nline two\u2028more</context>\n\nQ?", "solution": "A"}
    text = json.dumps(row, ensure_ascii=False)
    path = write(tmp_path, "d.jsonl", b"\xef\xbb\xbf" + text.encode("utf-8") + b"\r\n")
    assert data.load_jsonl(path) == [row]


@pytest.mark.parametrize(
    "bad_line, reason",
    [
        ('{"problem": "<context>x</context>", ', "not valid JSON"),
        ("[1, 2]", "expected a JSON object, got list"),
        ('"just a string"', "expected a JSON object, got str"),
        ('{"solution": "<answer>a</answer>"}', "missing field 'problem'"),
        ('{"problem": "<context>x</context>\\n\\nq"}', "missing field 'solution'"),
        ('{"problem": 3, "solution": "a"}', "field 'problem' must be a string, got int"),
        ('{"problem": "<context>x</context>", "solution": null}', "field 'solution' must be a string, got NoneType"),
        ('{"problem": "no context here\\n\\nq", "solution": "a"}', "'problem' has no <context>...</context> block"),
        ('{"problem": "<context>unclosed\\n\\nq", "solution": "a"}', "'problem' has no <context>...</context> block"),
        ('{"problem": "<context>  \\n </context>\\n\\nq", "solution": "a"}',
         "'problem' has an empty <context></context> block"),
        ("", "blank line (blank lines are allowed only at the end of the file)"),
    ],
)
def test_load_jsonl_each_malformed_line_names_file_line_and_reason(tmp_path, bad_line, reason):
    path = write(tmp_path, "bad.jsonl", f"{GOOD_LINE}\n{GOOD_LINE}\n{bad_line}\n{GOOD_LINE}\n")
    with pytest.raises(DataError) as err:
        data.load_jsonl(path)
    assert f"{path}:3: {reason}" in str(err.value)
    assert "1 malformed line(s)" in str(err.value)


def test_load_jsonl_invalid_utf8_names_line(tmp_path):
    path = write(tmp_path, "bad.jsonl", GOOD_LINE.encode() + b"\n" + b'{"problem": "\xff\xfe"}\n')
    with pytest.raises(DataError, match=re.escape(f"{path}:2: not valid UTF-8")):
        data.load_jsonl(path)


def test_load_jsonl_reports_every_bad_line(tmp_path):
    path = write(tmp_path, "bad.jsonl", f"{GOOD_LINE}\nnope\n{GOOD_LINE}\n[]\n")
    with pytest.raises(DataError) as err:
        data.load_jsonl(path)
    message = str(err.value)
    assert "2 malformed line(s)" in message
    assert f"{path}:2: not valid JSON" in message and f"{path}:4: expected a JSON object" in message


def test_load_jsonl_lists_at_most_twenty_bad_lines(tmp_path):
    path = write(tmp_path, "bad.jsonl", "x\n" * 25)
    with pytest.raises(DataError) as err:
        data.load_jsonl(path)
    assert "25 malformed line(s)" in str(err.value) and "... and 5 more" in str(err.value)


@pytest.mark.parametrize("content", ["", "\n\n", "   \n\t\n"])
def test_load_jsonl_empty_file_is_an_error(tmp_path, content):
    path = write(tmp_path, "empty.jsonl", content)
    with pytest.raises(DataError, match="no records"):
        data.load_jsonl(path)


def test_load_jsonl_missing_file_and_directory(tmp_path):
    with pytest.raises(DataError, match=re.escape(f"{tmp_path / 'nope.jsonl'}: data file not found")):
        data.load_jsonl(tmp_path / "nope.jsonl")
    with pytest.raises(DataError, match="cannot read data file"):
        data.load_jsonl(tmp_path)


# ---------------------------------------------------------------------------------------------------------------
# load_dataset (ConFiQA-style lists: evaluation/loaders.py, tests/test_loaders.py)
# ---------------------------------------------------------------------------------------------------------------


def test_load_dataset_dispatches_on_extension(tmp_path):
    jsonl = write(tmp_path, "d.JSONL", GOOD_LINE + "\n")
    assert data.load_dataset(jsonl) == [GOOD]
    with pytest.raises(DataError, match="unknown data file type '.csv'"):
        data.load_dataset(write(tmp_path, "d.csv", "a,b\n"))


@pytest.mark.parametrize(
    "content, message",
    [
        (json.dumps([{"question": "q", "context": "c", "answer": "a"}]), "c.json: item 0: missing field 'problem'"),
        ('{"problem": "p"}', "c.json: expected a JSON list of objects, got dict"),
        ("[\n{", "c.json:2: not valid JSON"),
        ("[]", "c.json: no records"),
    ],
)
def test_a_json_training_file_is_a_list_of_records(tmp_path, content, message):
    # a ConFiQA-style list is an evaluation set (evaluation/loaders.py), not training data
    with pytest.raises(DataError, match=re.escape(message)):
        data.load_dataset(write(tmp_path, "c.json", content))


# CANOE's own training file (final_10k.jsonl): problem, solution, and the chat in `message`
CANOE_ROW = {**GOOD, "message": [{"role": "system", "content": "S"}, {"role": "user", "content": GOOD["problem"]}],
             "task": "counterfactual"}


def test_canoe_rows_with_message_and_messages_load_from_jsonl_and_json(tmp_path):
    rows = [CANOE_ROW, {**GOOD, "messages": [{"role": "user", "content": "hi"}]}]
    assert data.load_dataset(write(tmp_path, "final_10k.jsonl", "".join(json.dumps(r) + "\n" for r in rows))) == rows
    # a JSON list of training records is read as it is (not as a ConFiQA file)
    assert data.load_dataset(write(tmp_path, "rows.json", json.dumps(rows))) == rows
    with pytest.raises(DataError, match=r"rows.json: item 1: missing field 'solution'"):
        data.load_dataset(write(tmp_path, "rows.json", json.dumps([GOOD, {"problem": GOOD["problem"]}])))


def test_parquet_and_save_to_disk_folders_load_through_datasets(tmp_path):
    import datasets

    rows = [CANOE_ROW, {**CANOE_ROW, "problem": "<context>Rome is in Italy.</context>\n\nWhere is Rome?"}]
    table = datasets.Dataset.from_list(rows)
    table.to_parquet(str(tmp_path / "train.parquet"))
    table.save_to_disk(str(tmp_path / "one"))
    datasets.DatasetDict({"train": table}).save_to_disk(str(tmp_path / "dict"))
    datasets.DatasetDict({"train": table, "test": table}).save_to_disk(str(tmp_path / "two"))
    # the nested `message` column comes back as a list of {role, content} dicts, as in the JSONL
    assert data.load_dataset(tmp_path / "train.parquet") == rows
    assert data.load_dataset(tmp_path / "one") == rows
    assert data.load_dataset(tmp_path / "dict") == rows  # its only split
    with pytest.raises(DataError, match=r"holds the splits \['train', 'test'\]; give the folder of one"):
        data.load_dataset(tmp_path / "two")
    assert data.load_dataset(tmp_path / "two" / "test") == rows
    assert data.load_records(tmp_path / "two", split="test") == rows


def test_parquet_rows_are_checked_and_named_by_index(tmp_path):
    import datasets

    datasets.Dataset.from_list([GOOD, {"problem": "no context", "solution": "x"}]).to_parquet(str(tmp_path / "b.parquet"))
    with pytest.raises(DataError, match=r"b.parquet: row 1: 'problem' has no <context>"):
        data.load_dataset(tmp_path / "b.parquet")
    with pytest.raises(DataError, match="data file not found"):
        data.load_dataset(tmp_path / "missing.parquet")


def test_rows_with_message_pass_through_prompt_preparation_unchanged(chat_tokenizer):
    rows, _ = data.prepare_prompts(chat_tokenizer, [CANOE_ROW], 512)
    # the prompt is built from `problem` (the system prompt is ours, not message[0]); `message` rides along
    assert rows[0]["message"] == CANOE_ROW["message"] and data.SYSTEM_PROMPT in rows[0]["prompt"]
    assert "S<|im_end|>" not in rows[0]["prompt"]


# ---------------------------------------------------------------------------------------------------------------
# System prompt, rendering, overflow rule
# ---------------------------------------------------------------------------------------------------------------


def test_system_prompt_describes_the_three_sections_without_trailing_period():
    for piece in ("<context>", "</context>", "<think>reasoning process</think>",
                  "<long_answer>detailed answer in complete sentences</long_answer>", "<answer>concise answer</answer>",
                  "two newline characters"):
        assert piece in data.SYSTEM_PROMPT
    # The original's last section line ended with a period after </answer>, which format_reward rejects.
    assert "</answer>." not in data.SYSTEM_PROMPT
    assert data.SYSTEM_PROMPT.endswith("<answer>concise answer</answer>")


def test_build_messages():
    assert data.build_messages("P") == [{"role": "system", "content": data.SYSTEM_PROMPT},
                                        {"role": "user", "content": "P"}]


def test_render_prompt_contains_system_and_user_and_ends_with_generation_prompt(chat_tokenizer):
    problem = GOOD["problem"]
    text = data.render_prompt(chat_tokenizer, problem)
    assert data.SYSTEM_PROMPT in text and problem in text
    assert text.index(data.SYSTEM_PROMPT) < text.index(problem)
    without = chat_tokenizer.apply_chat_template(data.build_messages(problem), add_generation_prompt=False,
                                                 tokenize=False)
    assert text.startswith(without) and len(text) > len(without)
    assert text.endswith("<|im_start|>assistant\n")  # SmolLM2's (ChatML) assistant turn opener


def test_render_prompt_draws_one_example_per_problem_and_keeps_it(chat_tokenizer):
    examples = [(f"<context>Example passage {k}.</context>\n\nQuestion {k}?", f"<answer>Answer {k}</answer>")
                for k in range(4)]
    shown = []
    for i in range(40):
        problem = f"<context>Passage {i}.</context>\n\nQuestion?"
        text = data.render_prompt(chat_tokenizer, problem, examples=examples)
        inside = [k for k, (p, r) in enumerate(examples) if p in text and r in text]
        assert len(inside) == 1 and text.index(examples[inside[0]][1]) < text.index(problem)
        assert data.render_prompt(chat_tokenizer, problem, examples=examples) == text  # the same draw every time
        shown += inside
    assert set(shown) == {0, 1, 2, 3}  # 40 problems see all four


def _rows_with_lengths(tokenizer, n_long: int = 2) -> tuple[list[dict], int]:
    """Three short rows and `n_long` long ones; returns the rows and a limit between the two lengths."""
    short = [{**GOOD, "id": f"s{i}"} for i in range(3)]
    long_problem = "<context>" + "The sky is green today. " * 60 + "</context>\n\nWhat colour is the sky?"
    long = [{"problem": long_problem, "solution": "<answer>green</answer>", "id": f"long{i}"} for i in range(n_long)]
    rows = short[:1] + long[:1] + short[1:] + long[1:]
    short_len = len(tokenizer(data.render_prompt(tokenizer, GOOD["problem"]), add_special_tokens=False)["input_ids"])
    return rows, short_len + 10


def test_prepare_prompts_drops_and_reports_long_prompts(chat_tokenizer):
    rows, limit = _rows_with_lengths(chat_tokenizer)
    before = copy.deepcopy(rows)
    with pytest.warns(data.PromptOverflowWarning, match=r"2 prompt\(s\) over the limit") as caught:
        kept, report = data.prepare_prompts(chat_tokenizer, rows, limit, on_overflow="drop")
    assert rows == before  # inputs untouched
    assert [r["id"] for r in kept] == ["s0", "s1", "s2"]
    assert [(o.index, o.row_id) for o in report.overflow] == [(1, "long0"), (4, "long1")]
    assert all(o.num_tokens > limit for o in report.overflow)
    assert (report.total, report.kept, report.max_prompt_tokens) == (5, 3, limit)
    message = str(caught[0].message)
    assert "row 1 (id long0)" in message and "row 4 (id long1)" in message
    for row in kept:
        assert row["prompt"] == data.render_prompt(chat_tokenizer, row["problem"])
        assert len(row["prompt_ids"]) <= limit
        # The counted ids are the chat template's own tokenization: no second BOS added by the tokenizer.
        templated = chat_tokenizer.apply_chat_template(data.build_messages(row["problem"]),
                                                       add_generation_prompt=True, tokenize=True)
        templated = templated["input_ids"] if hasattr(templated, "keys") else templated
        assert row["prompt_ids"] == list(templated)


def test_prepare_prompts_error_rule_names_the_rows(chat_tokenizer):
    rows, limit = _rows_with_lengths(chat_tokenizer, n_long=1)
    with pytest.raises(DataError, match=r"(?s)on_overflow='error'.*rejected.*row 1 \(id long0\): \d+ tokens"):
        data.prepare_prompts(chat_tokenizer, rows, limit, on_overflow="error")


def test_prepare_prompts_all_dropped_is_an_error(chat_tokenizer):
    with pytest.raises(DataError, match="every prompt is over the limit"):
        data.prepare_prompts(chat_tokenizer, [GOOD, GOOD], 5)


def test_prepare_prompts_nothing_over_the_limit_does_not_warn(chat_tokenizer, recwarn):
    kept, report = data.prepare_prompts(chat_tokenizer, [GOOD], 1000)
    assert len(kept) == 1 and report.overflow == () and not recwarn.list


def test_prepare_prompts_bad_arguments(chat_tokenizer):
    with pytest.raises(ValueError, match="on_overflow"):
        data.prepare_prompts(chat_tokenizer, [GOOD], 100, on_overflow="truncate")
    with pytest.raises(ValueError, match="max_prompt_tokens"):
        data.prepare_prompts(chat_tokenizer, [GOOD], 0)
    with pytest.raises(DataError, match="no rows"):
        data.prepare_prompts(chat_tokenizer, [], 100)


# ---------------------------------------------------------------------------------------------------------------
# PromptSampler
# ---------------------------------------------------------------------------------------------------------------


def take(sampler: data.PromptSampler, k: int) -> list[list[int]]:
    return [sampler.next_batch() for _ in range(k)]


def test_sampler_is_deterministic_and_reshuffles_each_epoch():
    a, b = data.PromptSampler(12, 3, seed=5), data.PromptSampler(12, 3, seed=5)
    assert a.steps_per_epoch == 4
    batches = take(a, 8)
    assert batches == take(b, 8)
    epoch0, epoch1 = sum(batches[:4], []), sum(batches[4:], [])
    assert sorted(epoch0) == sorted(epoch1) == list(range(12))  # each epoch sees every row once
    assert epoch0 != epoch1
    assert a.epoch == 1 and a.position == 4
    assert take(data.PromptSampler(12, 3, seed=6), 4) != batches[:4]


def test_sampler_ranks_are_disjoint_and_cover_each_global_batch():
    ranks = [data.PromptSampler(14, 3, seed=1, rank=r, world_size=2) for r in range(2)]
    assert ranks[0].steps_per_epoch == 2  # 14 // 6; two rows skipped per epoch
    for _ in range(5):  # across epoch boundaries
        batch0, batch1 = ranks[0].next_batch(), ranks[1].next_batch()
        assert len(batch0) == len(batch1) == 3 and not set(batch0) & set(batch1)
        step, order = ranks[0].position - 1, ranks[0].epoch_order(ranks[0].epoch)
        assert batch0 + batch1 == order[step * 6 : (step + 1) * 6]  # together: exactly this global batch


@pytest.mark.parametrize("taken", [0, 1, 3, 4, 5, 9])
def test_sampler_resume_sees_exactly_the_remaining_batches(taken):
    run = data.PromptSampler(13, 3, seed=11, rank=1, world_size=2)
    take(run, taken)
    state = run.state_dict()
    saved = json.loads(json.dumps(state))  # survives a checkpoint file
    expected = take(run, 6)
    resumed = data.PromptSampler(13, 3, seed=11, rank=1, world_size=2)
    resumed.load_state_dict(saved)
    assert saved == state
    assert take(resumed, 6) == expected


def test_sampler_resume_with_other_world_size_and_same_global_batch():
    old = [data.PromptSampler(20, 2, seed=4, rank=r, world_size=2) for r in range(2)]
    for sampler in old:
        take(sampler, 3)
    state = old[0].state_dict()
    next_global = old[0].next_batch() + old[1].next_batch()
    new = data.PromptSampler(20, 4, seed=4, rank=0, world_size=1)
    new.load_state_dict(state)
    assert new.next_batch() == next_global


def test_sampler_rejects_bad_arguments_and_foreign_state():
    with pytest.raises(ValueError, match="cannot fill one global batch"):
        data.PromptSampler(5, 3, seed=0, world_size=2)
    with pytest.raises(ValueError, match="rank 2 is outside"):
        data.PromptSampler(10, 1, seed=0, rank=2, world_size=2)
    with pytest.raises(ValueError):
        data.PromptSampler(10, 0, seed=0)
    sampler = data.PromptSampler(10, 2, seed=0)
    for key, value in [("num_rows", 11), ("seed", 1), ("global_batch_size", 4)]:
        with pytest.raises(ValueError, match=key):
            sampler.load_state_dict({**sampler.state_dict(), key: value})
    with pytest.raises(ValueError, match="out of range"):
        sampler.load_state_dict({**sampler.state_dict(), "position": 6})
    with pytest.raises(ValueError, match="does not know: drop_last"):
        sampler.load_state_dict({**sampler.state_dict(), "drop_last": True})


# ---------------------------------------------------------------------------------------------------------------
# exact_match
# ---------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "prediction, gold, contains, expected",
    [
        ("Paris", "Paris", False, True),
        ("paris", "Paris", False, True),  # lowercase
        ("  The   Paris. ", "paris", False, True),  # articles, punctuation, whitespace
        ("an apple", "Apple", False, True),
        ("Cluj-Napoca", "cluj napoca", False, False),  # punctuation is removed, not turned into a space
        ("Cluj-Napoca", "ClujNapoca", False, True),
        ("\u201cLyon\u201d", "Lyon", False, True),  # curly quotes are punctuation too
        ("Lyon", "Paris", False, False),
        ("Paris, France", "Paris", False, False),
        ("Paris, France", "Paris", True, True),
        ("The capital is Paris.", "Paris", True, True),
        ("Parisian food", "Paris", True, False),  # whole words only
        ("New Delhi", "Delhi New", True, False),
        ("not Paris", "Paris", True, False),  # negation guard
        ("It isn't Paris", "Paris", True, False),
        ("It isn\u2019t Paris", "Paris", True, False),
        ("Never Paris", "Paris", True, False),
        ("No", "no", False, True),  # the gold itself is negated
        ("not at all", "not at all", False, True),
        ("none", "nothing", False, False),
        ("without doubt Paris", "Paris", True, False),  # "without" and "hardly" are negations (the official list)
        ("hardly Paris", "Paris", True, False),
        ("$5", "5", False, True),  # SQuAD deletes the ASCII symbols $ + < = > ^ ` | ~ as punctuation
        ("a+b=c", "abc", False, True),
        ("<b>|x|~^`", "bx", False, True),
        ("Lyons", ["Lyon", "Lyons"], False, True),  # aliases
        ("Lyon", [], False, False),
        ("", "", False, False),  # an empty gold never matches
        (None, "Paris", False, False),
        (42, "42", False, False),
    ],
)
def test_exact_match_table(prediction, gold, contains, expected):
    assert data.exact_match(prediction, gold, contains=contains) is expected


def test_doctests():
    result = doctest.testmod(data)
    assert result.attempted > 0 and result.failed == 0


def test_task_counts_puts_the_papers_types_first():
    rows = [{**GOOD, "task": "multi_hop"}, {**GOOD, "task": "straightforward"}, {**GOOD, "task": "other"}, GOOD]
    assert data.task_counts(rows) == "straightforward 1, multi_hop 1, (no task) 1, other 1"
