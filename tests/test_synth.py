"""Tests for synth.py: sizes and task mix, one schema, disjoint train/eval entities, answers that follow from the
context (and only from the trusted passage, or only in changed form), passages of prose of the promised length,
many relations and phrasings, determinism, and prompts that fit the default budget."""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import random
import re
from pathlib import Path

import pytest

import data
from evaluation import loaders
from synthetic import facts
from synthetic import synth
from config import load_config
from grading.tags import answer_span, tag_content

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def generated(tmp_path_factory):
    """Runs `synth.py` once (n=400) and loads both files back with data.load_jsonl."""
    out = tmp_path_factory.mktemp("synth")
    stdout = io.StringIO()
    with contextlib.redirect_stdout(stdout):
        assert synth.main(["--out", str(out), "--n", "400", "--seed", "7"]) == 0
    return {"out": out, "stdout": stdout.getvalue(), "train": data.load_jsonl(out / "train.jsonl"),
            "eval": data.load_jsonl(out / "eval.jsonl"), "worlds": synth.split_worlds(7)}


@pytest.fixture(scope="module")
def default_data():
    """The default data (what `make data` writes to data/synth): rows by
    split and the worlds they come from."""
    train, eval_ = synth.synthesize()
    return {"train": train, "eval": eval_, "worlds": synth.split_worlds(synth.DEFAULT_SEED)}


def context_of(row: dict) -> str:
    return tag_content(row["problem"], "context")


def named(text: str, name: str) -> bool:
    """`name` occurs in `text` as a whole word (what synth's substitution replaces)."""
    return re.search(rf"(?<![\w-]){re.escape(name)}(?![\w-])", text) is not None


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
        assert re.fullmatch(r"<context>[^<>]+</context>\n\n[^<>]*[A-Z][^\n<>]*\?", row["problem"])
        assert re.fullmatch(r"<answer>[^<>\n]+</answer>", row["solution"])


def test_synth_passages_are_paragraphs_of_the_promised_length(generated):
    rows = generated["train"] + generated["eval"]
    words = [synth.context_words(r) for r in rows]
    assert min(words) >= synth.PASSAGE_WORDS[0] and max(words) <= synth.PASSAGE_WORDS[1]
    assert sum(words) / len(words) > 90  # not all at the floor
    # Prose: several sentences, and on average more than one entity of the subject's kind named in a passage.
    train_world, _ = generated["worlds"]
    same_kind = []
    for row in generated["train"]:
        context = context_of(row)
        assert context.count(". ") >= 3
        if row["task"] in ("straightforward", "counterfactual"):
            kind = train_world.kind_of(row["entities"][0])
            same_kind.append(sum(named(context, other) for other in train_world.kinds[kind]))
    assert sum(same_kind) / len(same_kind) > 1.8


def test_synth_covers_many_relations_phrasings_and_numbers(generated):
    rows = generated["train"]
    relations = {r["relation"] for r in rows if r["task"] != "multi_hop"}
    assert len(relations) >= 25
    chains = {r["relation"] for r in rows if r["task"] == "multi_hop"}
    assert len(chains) >= 10 and any(chain.count(">") == 2 for chain in chains)
    # Questions differ in phrasing and in the instruction around them.
    questions = {r["problem"].split("</context>\n\n")[1] for r in rows}
    assert len(questions) > 0.95 * len(rows)  # a few items ask the same thing the same way
    openings = {q.split(" ")[0] for q in questions}
    assert {"Question:", "Answer", "Based", "Read", "Use", "Think"} <= openings
    numbers = [r for r in rows if answer_span(r["solution"]).replace(",", "").isdigit()]
    assert 0.1 < len(numbers) / len(rows) < 0.5


def test_synth_eval_entities_are_disjoint_from_train(generated):
    train_entities = {e for r in generated["train"] for e in r["entities"]}
    eval_entities = {e for r in generated["eval"] for e in r["entities"]}
    assert train_entities and eval_entities and not train_entities & eval_entities
    # Stronger: no eval subject or bridge is even mentioned in a training prompt.
    train_text = "\n".join(r["problem"] for r in generated["train"])
    leaked = [e for e in eval_entities if named(train_text, e)]
    assert leaked == []
    train_names, eval_names = ({n for names in w.kinds.values() for n in names} for w in generated["worlds"])
    assert not train_names & eval_names


def test_synth_straightforward_answers_are_the_worlds_facts_and_stated(generated):
    for split, world in zip(("train", "eval"), generated["worlds"]):
        for row in generated[split]:
            if row["task"] == "straightforward":
                [subject], answer = row["entities"], answer_span(row["solution"])
                assert world.facts[(subject, row["relation"])] == answer
                # (an element opens a sentence capitalised: "Krypton")
                assert named(context_of(row), answer) and named(context_of(row).lower(), subject.lower())


def test_synth_counterfactuals_are_substituted_everywhere(generated):
    rows = [r for r in generated["train"] + generated["eval"] if r["task"] == "counterfactual"]
    assert {r["relation"] for r in rows} == set(synth.REAL_WORLD_RELATIONS)
    echoed = 0
    for row in rows:
        [subject] = row["entities"]
        real, answer, context = synth.world_fact(row["relation"], subject), answer_span(row["solution"]), context_of(row)
        assert real is not None and answer != real
        assert not named(context, real)  # the real value is gone wherever it was
        assert named(context, answer)
        echoed += len(re.findall(rf"(?<![\w-]){re.escape(answer)}(?![\w-])", context)) > 1
    assert echoed > len(rows) / 4  # the changed value often stands in more than one place


def test_synth_multi_hop_chains_follow_the_world_or_a_changed_last_hop(generated):
    changed = 0
    for split, world in zip(("train", "eval"), generated["worlds"]):
        for row in generated[split]:
            if row["task"] != "multi_hop":
                continue
            relations = row["relation"].split(">")
            nodes = list(row["entities"])
            assert len(nodes) == len(relations) and all(named(context_of(row), n) for n in nodes)
            for subject, relation, following in zip(nodes, relations, nodes[1:]):
                assert world.facts[(subject, relation)] == following
            real, answer = world.facts[(nodes[-1], relations[-1])], answer_span(row["solution"])
            assert named(context_of(row), answer)
            if answer != real:  # a changed real-world hop, as in ConFiQA-MR
                assert relations[-1] in synth.REAL_WORLD_RELATIONS and not named(context_of(row), real)
                changed += 1
    assert changed > 0


def test_synth_inconsistent_answer_is_only_in_the_trusted_passage(generated):
    for row in generated["train"] + generated["eval"]:
        if row["task"] != "inconsistent":
            continue
        passages = context_of(row).split("\n")
        assert len(passages) in (2, 3)
        trusted = int(re.search(r"According to passage (\d), ", row["problem"]).group(1))
        answer = answer_span(row["solution"])
        assert [i for i, p in enumerate(passages, start=1) if named(p, answer)] == [trusted]
        assert all(p.startswith(f"Passage {i}: ") and row["entities"][0] in p for i, p in enumerate(passages, start=1))


def test_replace_everywhere_is_whole_word():
    text = "Paris is the capital. Visitors arrive in Paris. Parisians and the Paris-Roubaix race stay."
    assert synth._replace_everywhere(text, "Paris", "Lyon") == (
        "Lyon is the capital. Visitors arrive in Lyon. Parisians and the Paris-Roubaix race stay.")


def test_paragraph_states_its_facts_and_keeps_out_what_it_must_avoid():
    world, _ = synth.split_worlds(1)
    rng = random.Random(0)
    company = world.kinds["company"][0]
    founded = world.facts[(company, "founded")]
    for _ in range(20):
        text = synth.paragraph(world, company, rng, must=["founded"], size=3, avoid={company, founded})
        assert company in text.split(". ")[0] and named(text, founded)  # the first sentence names it
        # no other company's sentence names this year (it would be a look-alike with the same value)
        others = [s for s in text.split(". ") if company not in s and "company" not in s.lower()]
        assert not any(named(s, founded) for s in others)


def test_paragraph_refers_back_only_to_its_own_entity():
    # "The currency of Latvia is the euro. The currency of the country is the riel." reads as Latvia's riel: a
    # reference ("the country") may follow only sentences that last named this entity among those of its kind.
    world, _ = synth.split_worlds(1)
    rng = random.Random(0)
    checked = 0
    for kind, reference in synth.REFERENCES.items():
        for name in world.kinds.get(kind, [])[:6]:
            for _ in range(15):
                last = None
                for text in re.split(r"(?<=\.) ", synth.paragraph(world, name, rng, must=[], size=5)):
                    # element names open a sentence capitalised ("Iron is ..."); "The club Crimson Rovers dates
                    # back ..." names a club and refers to none
                    names_one = any(named(text.lower(), other.lower()) for other in world.kinds[kind])
                    if re.search(rf"\b{reference}\b", text, re.IGNORECASE) and not names_one:
                        assert last == name, (name, text)
                        checked += 1
                    if named(text.lower(), name.lower()):
                        last = name
                    elif names_one:
                        last = "another"
    assert checked > 100



def sentences_of(context: str) -> list[str]:
    return re.split(r"(?<=[.?!])\s+|\n", context)


def splits_of(generated, default_data):
    """(split name, rows, world) of the seed-7 data and of the default data."""
    for source, name in ((generated, "seed 7"), (default_data, "default")):
        for split, world in zip(("train", "eval"), source["worlds"]):
            yield f"{name} {split}", source[split], world


# A kind noun said twice in one sentence: what a template that names the kind does when its subject is a
# reference ("The club the club dates back to 1913.", "The film is a film by director ...", "The town is a town
# in ...", "The element is one of the elements ..."). Lowercase: a capitalised one is part of a name ("Mexico City").
KIND_NOUNS = [reference.removeprefix("the ") for reference in synth.REFERENCES.values()]


def test_synth_references_never_double_the_kind_noun(generated, default_data):
    doubled, references = [], 0
    for split, rows, _ in splits_of(generated, default_data):
        for row in rows:
            for text in sentences_of(context_of(row)):
                for noun in KIND_NOUNS:
                    if len(re.findall(rf"\b{noun}s?\b", text)) > 1:
                        doubled.append((split, row["id"], text))
                    references += re.match(rf"[Tt]he {noun} (?!of |[A-Z])", text) is not None
    assert doubled == [], f"{len(doubled)} sentences, the first: {doubled[:3]}"
    assert references > 500  # the data does refer back ("The club plays at ...")


# A surname used bare: not after a first name ("Okafor", not "Ada Okafor"), nor in an award or stadium name
# ("the Okafor Prize", "Okafor Park"), which name no person.
SURNAME_RE = re.compile(r"(?<![\w-])(" + "|".join(facts.LAST_NAMES) + r")(?![\w-])(?! (?:"
                        + "|".join(("Prize", *facts.ARENA_WORDS)) + r")\b)")


def bare_surnames(context: str) -> list[str]:
    found = []
    for match in SURNAME_RE.finditer(context):
        before = context[:match.start()]
        previous = (before.rsplit(maxsplit=1) or [""])[-1] if before.endswith(" ") else ""
        if previous not in facts.FIRST_NAMES:
            found.append(match.group(1))
    return found


def test_synth_a_bare_surname_names_one_person_of_the_passage(generated, default_data):
    # A paragraph refers to its person by surname after the first sentence. Where the passage also names a
    # namesake ("Oren Fernhill founded Northwind Ceramics. ... The chief executive is Marek Fernhill. ...
    # Fernhill was born in Lima."), the surname names two people, and a multi-hop or straightforward item that
    # joins a person's paragraph to one naming a namesake has two answers.
    ambiguous, used = set(), 0
    for split, rows, world in splits_of(generated, default_data):
        for row in rows:
            context = context_of(row)
            for surname in bare_surnames(context):
                owners = tuple(person for person in world.kinds["person"]
                               if person.split()[-1] == surname and named(context, person))
                if len(owners) != 1:
                    ambiguous.add((split, row["id"], row["task"], owners))
                used += 1
    assert ambiguous == set(), f"{len(ambiguous)} items, the first: {sorted(ambiguous)[:3]}"
    assert used > 1000  # people are referred to by surname


def test_fact_tables_are_unambiguous():
    cities = [capital for capital, _, _ in facts.COUNTRIES.values()]
    cities += [city for names in facts.CITIES.values() for city in names]
    assert len(cities) == len(set(cities))  # "X is a city in K" has one true K
    assert set(facts.CITIES) <= set(facts.COUNTRIES)
    assert set(facts.MOONS.values()) <= set(facts.PLANETS)
    tables = [set(facts.COUNTRIES), set(cities), set(facts.ELEMENTS), set(facts.BOOKS), set(facts.MOONS),
              set(facts.COMPANIES), set(facts.FIRST_NAMES), set(facts.LAST_NAMES), set(facts.TOWNS),
              set(facts.RIVERS), set(facts.TITLE_NOUNS), set(facts.TITLE_ADJECTIVES)]
    names = [name for table in tables for name in table]
    assert len(names) == len(set(names))  # no name is two kinds of entity
    assert len(set(facts.ELEMENTS.values())) == len(facts.ELEMENTS)
    assert sum(len(t) for t in tables[:6]) > 300


def test_synth_is_deterministic_by_seed():
    same_a, same_b = synth.synthesize(40, seed=3), synth.synthesize(40, seed=3)
    assert same_a == same_b
    assert synth.synthesize(40, seed=4) != same_a


def test_synth_prompts_fit_the_default_budget(default_data):
    """config.toml's max_prompt_tokens keeps every row of the default data, train and eval, under the default's own
    prompt and tokenizer: a longer prompt must raise the budget, not lose items."""
    from transformers import AutoTokenizer

    cfg = load_config(ROOT / "config.toml")
    if not (ROOT / cfg.model / "tokenizer_config.json").exists():
        pytest.skip(f"{cfg.model} is not there: run `make models`")
    tokenizer = AutoTokenizer.from_pretrained(str(ROOT / cfg.model))
    rows = default_data["train"] + default_data["eval"]
    _, report = data.prepare_prompts(tokenizer, rows, cfg.max_prompt_tokens, "error", **cfg.prompt_style())
    assert report.kept == len(rows) and report.max_tokens <= cfg.max_prompt_tokens


def test_the_default_prompt_gives_nothing_to_copy(default_data):
    """A prompt that fills its format description (`<think>reasoning process</think>`) gets that text copied into
    answers, and an example answer that the data also names (Lima, Peru's capital) gets given where a passage
    changed it: the description names the tags without filling them, and the worked example (an earlier exchange
    about its own passage) names nothing the data names."""
    cfg = load_config(ROOT / "config.toml")
    description, example = cfg.system_prompt, f"{cfg.example_problem}\n{cfg.example_response}"
    # tags are named ("within <think> and </think>"), never filled; the example is an exchange of its own
    assert {inside for _, inside in re.findall(r"<(think|long_answer|answer)>([^<]*)</\1>", description)} == {" and "}
    assert "Osric" not in description and cfg.example_problem.startswith("<context>")
    answer = answer_span(cfg.example_response)
    names = set(re.findall(r"\b[A-Z][a-z]+\b", example)) - {"The", "According", "Bridge", "Who", "It", "A"}
    assert answer and names
    vocabulary = {*facts.FIRST_NAMES, *facts.LAST_NAMES, *facts.TOWNS, *facts.COUNTRIES,
                  *(capital for capital, *_ in facts.COUNTRIES.values())}
    assert not names & vocabulary
    for row in default_data["train"] + default_data["eval"]:
        assert answer not in row["problem"] and not any(named(row["problem"], name) for name in names), row["id"]


def test_synth_rejects_bad_sizes():
    with pytest.raises(ValueError, match="at least 4"):
        synth.synthesize(3)
    with pytest.raises(ValueError, match="eval_share"):
        synth.synthesize(10, eval_share=0)


def test_synth_output_passes_the_data_check(generated, capsys):
    assert loaders.main(["check", str(generated["out"] / "eval.jsonl")]) == 0
    assert "60 rows (straightforward 15, multi_hop 15, inconsistent 15, counterfactual 15)" in capsys.readouterr().out


def test_default_data_is_unchanged(default_data):
    # data/synth (what `make data` writes and the default run of bench/RESULTS.md trained on) is a function of the
    # defaults alone. A change to the generator or to facts.py that changes it must update these digests knowingly.
    digests = {}
    for split in ("train", "eval"):
        rows = default_data[split]
        text = "".join(json.dumps(row, ensure_ascii=False) + "\n" for row in rows)  # as write_jsonl writes them
        digests[split] = hashlib.sha256(text.encode("utf-8")).hexdigest()
    assert digests == {"train": "b8aa0f01913bb37c681a9bfe5de6c95737023ced3a7cfadc201fb31df574d867",
                       "eval": "1125f25d3cae7f9a8f4c02dab5f5ef60c0b463a707935d7f3aba400f899b0173"}
