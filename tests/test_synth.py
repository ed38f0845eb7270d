"""Tests for synth.py: sizes and task mix, one schema, disjoint train/eval entities, answers that follow from the
context, counterfactuals that contradict the fact tables, determinism, and prompts that fit the default budget."""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import re

import pytest

import data
import facts
import synth
from tags import answer_span


@pytest.fixture(scope="module")
def generated(tmp_path_factory):
    """Runs `synth.py` once (n=400) and loads both files back with data.load_jsonl."""
    out = tmp_path_factory.mktemp("synth")
    stdout = io.StringIO()
    with contextlib.redirect_stdout(stdout):
        assert synth.main(["--out", str(out), "--n", "400", "--seed", "7"]) == 0
    return {"out": out, "stdout": stdout.getvalue(), "train": data.load_jsonl(out / "train.jsonl"),
            "eval": data.load_jsonl(out / "eval.jsonl")}


def context_of(row: dict) -> str:
    return data.CONTEXT_RE.search(row["problem"]).group(1)


def test_synth_sizes_tasks_and_printed_counts(generated):
    assert len(generated["train"]) == 400 and len(generated["eval"]) == 60  # eval = round(400 * 0.15)
    for split, n in (("train", 100), ("eval", 15)):
        counts = {t: sum(r["task"] == t for r in generated[split]) for t in data.TASKS}
        assert counts == dict.fromkeys(data.TASKS, n)
        expected = ", ".join(f"{t} {n}" for t in data.TASKS)
        assert f"{split}: {n * 4} rows -> {generated['out'] / f'{split}.jsonl'} ({expected})" in generated["stdout"]


def test_synth_rows_share_one_schema_and_unique_ids(generated):
    rows = generated["train"] + generated["eval"]
    assert {tuple(r) for r in rows} == {("id", "task", "relation", "entities", "problem", "solution")}
    assert len({r["id"] for r in rows}) == len(rows)
    for row in rows:
        assert re.fullmatch(r"<context>.+</context>\n\n[A-Z][^\n]*\?", row["problem"], re.DOTALL)
        assert re.fullmatch(r"<answer>[^<>\n]+</answer>", row["solution"])


def test_synth_eval_entities_are_disjoint_from_train(generated):
    train_entities = {e for r in generated["train"] for e in r["entities"]}
    eval_entities = {e for r in generated["eval"] for e in r["entities"]}
    assert train_entities and eval_entities and not train_entities & eval_entities
    # Stronger: no eval subject or bridge is even mentioned in a training prompt.
    train_text = "\n".join(r["problem"] for r in generated["train"])
    leaked = [e for e in eval_entities if re.search(rf"(?<![\w-]){re.escape(e)}(?![\w-])", train_text)]
    assert leaked == []
    train_world, eval_world = synth.split_worlds(7)
    assert not set(train_world.entities) & set(eval_world.entities)


def test_synth_answers_are_stated_in_or_derivable_from_context(generated):
    for row in generated["train"] + generated["eval"]:
        context, answer = context_of(row), answer_span(row["solution"])
        if row["task"] == "multi_hop":
            first, second = row["relation"].split(">")
            person, bridge = row["entities"]
            assert synth.fact_sentence(person, first, bridge) in context
            assert synth.fact_sentence(bridge, second, answer) in context
        elif row["task"] == "inconsistent":
            passages = context.split("\n")
            assert len(passages) in (2, 3)
            trusted = int(re.match(r"According to passage (\d), ", row["problem"].split("\n\n")[1]).group(1))
            [subject] = row["entities"]
            statement = synth.fact_sentence(subject, row["relation"], answer)
            holders = [i for i, p in enumerate(passages, start=1) if statement in p]
            assert holders == [trusted]
            assert all(p.startswith(f"Passage {i}: ") and subject in p for i, p in enumerate(passages, start=1))
        else:
            [subject] = row["entities"]
            assert synth.fact_sentence(subject, row["relation"], answer) in context


def test_synth_counterfactual_answers_contradict_the_real_world(generated):
    rows = [r for r in generated["train"] + generated["eval"] if r["task"] == "counterfactual"]
    assert {r["relation"] for r in rows} <= set(synth.REAL_WORLD_RELATIONS)
    for row in rows:
        [subject] = row["entities"]
        real = synth.world_fact(row["relation"], subject)
        answer = answer_span(row["solution"])
        assert real is not None and answer != real
        assert synth.fact_sentence(subject, row["relation"], real) not in context_of(row)


def test_synth_straightforward_real_facts_match_the_fact_table(generated):
    for row in generated["train"]:
        if row["task"] == "straightforward" and row["relation"] in synth.REAL_WORLD_RELATIONS:
            assert answer_span(row["solution"]) == synth.world_fact(row["relation"], row["entities"][0])


def test_fact_tables_are_unambiguous():
    cities = [capital for capital, _, _ in facts.COUNTRIES.values()]
    cities += [city for names in facts.CITIES.values() for city in names]
    assert len(cities) == len(set(cities))  # "X is a city in K" has one true K
    assert set(facts.CITIES) <= set(facts.COUNTRIES)
    assert set(facts.MOONS.values()) <= set(facts.PLANETS)
    tables = [set(facts.COUNTRIES), set(cities), set(facts.ELEMENTS), set(facts.BOOKS), set(facts.MOONS),
              set(facts.COMPANIES), set(facts.FIRST_NAMES), set(facts.LAST_NAMES)]
    names = [name for table in tables for name in table]
    assert len(names) == len(set(names))  # no name is two kinds of entity
    assert len(set(facts.ELEMENTS.values())) == len(facts.ELEMENTS)
    assert sum(len(t) for t in tables[:6]) > 300


def test_synth_is_deterministic_by_seed():
    same_a, same_b = synth.synthesize(40, seed=3), synth.synthesize(40, seed=3)
    assert same_a == same_b
    assert synth.synthesize(40, seed=4) != same_a


def test_synth_prompts_fit_the_default_budget(generated, chat_tokenizer):
    # The default run is a 135M model on a CPU with 256-token prompts: nothing should need dropping.
    _, report = data.prepare_prompts(chat_tokenizer, generated["train"] + generated["eval"], 256, on_overflow="error")
    assert report.max_tokens <= 256


def test_synth_rejects_bad_sizes():
    with pytest.raises(ValueError, match="at least 4"):
        synth.synthesize(3)
    with pytest.raises(ValueError, match="eval_share"):
        synth.synthesize(10, eval_share=0)


def test_synth_output_passes_the_data_check(generated, capsys):
    assert data.main(["check", str(generated["out"] / "eval.jsonl")]) == 0
    assert "60 rows (straightforward 15, multi_hop 15, inconsistent 15, counterfactual 15)" in capsys.readouterr().out


def test_default_data_is_unchanged():
    # data/synth (what `make data` writes and the default run of bench/RESULTS.md trained on) is a function of the
    # defaults alone. A change to the generator or to facts.py that changes it must update these digests knowingly.
    digests = {}
    for split, rows in zip(("train", "eval"), synth.synthesize()):
        text = "".join(json.dumps(row, ensure_ascii=False) + "\n" for row in rows)  # as write_jsonl writes them
        digests[split] = hashlib.sha256(text.encode("utf-8")).hexdigest()
    assert digests == {"train": "75c32a988d236688fda34829f4c0c7d8d19b32cf1aea64f952bb9878f1fe21a7",
                       "eval": "730954d08531aa76e9d7e33e6b7874c1778093186b556592169cb7766d05b3cc"}
