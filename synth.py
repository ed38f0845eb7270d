"""Synthetic faithfulness data in the CANOE paper's four task types, built from the fact tables in `facts.py`.

CANOE (arXiv 2505.16483) trains on ~10k short-form QA items synthesised from knowledge-base triples; this file
makes a small set of the same kinds, so the default run needs no download:

- **straightforward**: the answer is stated in the context, among distractor sentences;
- **multi_hop**: two stated facts must be chained (a person's birthplace, then that city's country);
- **inconsistent**: two or three passages disagree, and the question says which passage to trust;
- **counterfactual**: the context states a changed real-world fact, and the answer must follow the context.

Every row is `{"id", "task", "relation", "entities", "problem", "solution"}` in the format `data.load_jsonl`
reads (docs/DESIGN.md, "Data"); answers are short and checkable by string match. Train and eval are built from
disjoint entities (every entity table is split first), so no eval subject appears in a training prompt. The
output is a function of the arguments alone: the same seed writes byte-identical files.

    python synth.py --out data/synth [--n 2000] [--eval-share 0.15] [--seed 42] [--confiqa]

`--confiqa` also writes the eval split's counterfactual rows as a ConFiQA file (`to_confiqa`), for
`canoe.py --eval --suite confiqa --eval-file data/synth/eval-confiqa.json`.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
from collections.abc import Iterable, Sequence
from pathlib import Path

import facts
from data import TASKS, task_counts

# relation: (statement, question). {s} subject, {o} value, {a} "a"/"an" for {o}. Questions start lowercase so
# "According to passage 2, " can go in front of them.
RELATIONS: dict[str, tuple[str, str]] = {
    "capital": ("The capital of {s} is {o}.", "what is the capital of {s}?"),
    "currency": ("The currency of {s} is the {o}.", "what is the currency of {s}?"),
    "language": ("Most people in {s} speak {o}.", "what language do most people in {s} speak?"),
    "city_country": ("{s} is a city in {o}.", "which country is {s} in?"),
    "symbol": ("The chemical symbol of {s} is {o}.", "what is the chemical symbol of {s}?"),
    "author": ("{s} was written by {o}.", "who wrote {s}?"),
    "orbits": ("{s} is a moon of {o}.", "which planet does {s} orbit?"),
    "headquarters": ("{s} is headquartered in {o}.", "in which city is {s} headquartered?"),
    "birthplace": ("{s} was born in {o}.", "where was {s} born?"),
    "profession": ("{s} works as {a} {o}.", "what is {s}'s profession?"),
    "employer": ("{s} works for {o}.", "which company does {s} work for?"),
    "residence": ("{s} lives in {o}.", "which country does {s} live in?"),
    "favourite_book": ("{s}'s favourite book is {o}.", "what is {s}'s favourite book?"),
}
# Relations with a real-world truth; only these can be made counterfactual.
REAL_WORLD_RELATIONS = ("capital", "currency", "language", "city_country", "symbol", "author", "orbits")
# Multi-hop chains: subject --first--> bridge --second--> answer.
CHAINS: dict[str, tuple[str, str, str]] = {
    "birthplace>city_country": ("birthplace", "city_country", "in which country was {s} born?"),
    "employer>headquarters": ("employer", "headquarters", "in which city is the company {s} works for headquartered?"),
    "favourite_book>author": ("favourite_book", "author", "who wrote {s}'s favourite book?"),
    "residence>capital": ("residence", "capital", "what is the capital of the country where {s} lives?"),
    "residence>currency": ("residence", "currency", "what is the currency of the country where {s} lives?"),
    "residence>language": (
        "residence", "language", "what language do most people speak in the country where {s} lives?"
    ),
}
DEFAULT_N = 2000
DEFAULT_EVAL_SHARE = 0.15
DEFAULT_SEED = 42
ENTITY_EVAL_SHARE = 0.2  # share of each entity table that goes to eval
PEOPLE_PER_SURNAME = 3


def fact_sentence(subject: str, relation: str, value: str) -> str:
    """The context sentence stating `relation(subject) = value`."""
    article = "an" if value[:1].lower() in "aeiou" else "a"
    return RELATIONS[relation][0].format(s=subject, o=value, a=article)


def world_fact(relation: str, subject: str) -> str | None:
    """The real-world value of a relation from facts.py (None for invented or unknown facts)."""
    if relation in ("capital", "currency", "language") and subject in facts.COUNTRIES:
        return facts.COUNTRIES[subject][("capital", "currency", "language").index(relation)]
    if relation == "city_country":
        for country, (capital, _, _) in facts.COUNTRIES.items():
            if subject == capital or subject in facts.CITIES.get(country, ()):
                return country
        return None
    table = {"symbol": facts.ELEMENTS, "author": facts.BOOKS, "orbits": facts.MOONS}.get(relation, {})
    return table.get(subject)


class World:
    """All facts about one split's entities: real ones from facts.py and invented people and companies."""

    def __init__(self, countries: list[str], elements: list[str], books: list[str], moons: list[str],
                 surnames: list[str], companies: list[str], rng: random.Random) -> None:
        self.facts: dict[tuple[str, str], str] = {}  # (subject, relation) -> value
        cities: list[str] = []
        for country in countries:
            capital, currency, language = facts.COUNTRIES[country]
            self._add(country, "capital", capital)
            self._add(country, "currency", currency)
            if language is not None:
                self._add(country, "language", language)
            for city in (capital, *facts.CITIES.get(country, ())):
                self._add(city, "city_country", country)
                cities.append(city)
        for element in elements:
            self._add(element, "symbol", facts.ELEMENTS[element])
        for book in books:
            self._add(book, "author", facts.BOOKS[book])
        for moon in moons:
            self._add(moon, "orbits", facts.MOONS[moon])
        for company in companies:
            self._add(company, "headquarters", rng.choice(cities))
        self.people = [
            f"{first} {last}" for last in surnames for first in rng.sample(facts.FIRST_NAMES, PEOPLE_PER_SURNAME)
        ]
        for person in self.people:
            self._add(person, "birthplace", rng.choice(cities))
            self._add(person, "profession", rng.choice(facts.PROFESSIONS))
            self._add(person, "employer", rng.choice(companies))
            self._add(person, "residence", rng.choice(countries))
            self._add(person, "favourite_book", rng.choice(books))
        self.fact_list = [(s, r, v) for (s, r), v in self.facts.items()]
        self.by_relation: dict[str, list[tuple[str, str, str]]] = {r: [] for r in RELATIONS}
        for fact in self.fact_list:
            self.by_relation[fact[1]].append(fact)
        # Values a fact may be changed to (counterfactual) or disagree with (inconsistent): the split's own values
        # of that relation, plus every city for capitals and every planet for moons.
        self.alternatives = {r: sorted({v for _, _, v in triples}) for r, triples in self.by_relation.items()}
        self.alternatives["capital"] = sorted(set(cities))
        self.alternatives["orbits"] = sorted(set(self.alternatives["orbits"]) | set(facts.PLANETS))
        # Everything this split's questions can be about (subjects and bridges); disjoint from the other split's.
        self.entities = sorted({s for s, _ in self.facts} | set(cities) | set(countries))

    def _add(self, subject: str, relation: str, value: str) -> None:
        self.facts[(subject, relation)] = value

    def distractors(self, rng: random.Random, avoid: set[str], relations: Sequence[str | None]) -> list[str]:
        """One sentence per entry of `relations` (None: any relation), each about a different subject, none
        naming an entity in `avoid` as subject or value (so no distractor restates or contradicts the item)."""
        chosen: list[str] = []
        used = set(avoid)  # a copy: the caller's set is not changed
        for wanted in relations:
            relation = wanted if wanted is not None else rng.choice(list(RELATIONS))
            candidates = [f for f in self.by_relation[relation] if f[0] not in used and f[2] not in used]
            if not candidates:  # every fact of that relation touches an avoided entity (possible in tiny splits)
                candidates = [f for f in self.fact_list if f[0] not in used and f[2] not in used]
            subject, relation, value = rng.choice(candidates)
            chosen.append(fact_sentence(subject, relation, value))
            used.add(subject)
        return chosen


def _question(template: str, subject: str) -> str:
    text = template.format(s=subject)
    return text[0].upper() + text[1:]


def _problem(context: str, question: str) -> str:
    return f"<context>{context}</context>\n\n{question}"


def _item(task: str, relation: str, entities: list[str], context: str, question: str, answer: str) -> dict:
    return {"task": task, "relation": relation, "entities": entities,
            "problem": _problem(context, question), "solution": f"<answer>{answer}</answer>"}


def _straightforward(world: World, rng: random.Random) -> dict:
    relation = rng.choice(list(RELATIONS))
    subject, _, answer = rng.choice(world.by_relation[relation])
    distractors = world.distractors(rng, {subject, answer}, [relation, relation, None])
    sentences = [fact_sentence(subject, relation, answer), *distractors]
    rng.shuffle(sentences)
    return _item("straightforward", relation, [subject], " ".join(sentences),
                 _question(RELATIONS[relation][1], subject), answer)


def _multi_hop(world: World, rng: random.Random) -> dict:
    chain = rng.choice(list(CHAINS))
    first, second, template = CHAINS[chain]
    # Only people whose bridge has the second fact (e.g. not every country has a main language listed).
    people = [p for p in world.people if (world.facts[(p, first)], second) in world.facts]
    person = rng.choice(people)
    bridge = world.facts[(person, first)]
    answer = world.facts[(bridge, second)]
    # Distractors of both hop relations, so the chain has to be followed rather than pattern-matched.
    distractors = world.distractors(rng, {person, bridge, answer}, [first, second, None])
    sentences = [fact_sentence(person, first, bridge), fact_sentence(bridge, second, answer), *distractors]
    rng.shuffle(sentences)
    return _item("multi_hop", chain, [person, bridge], " ".join(sentences), _question(template, person), answer)


def _inconsistent(world: World, rng: random.Random) -> dict:
    relation = rng.choice(list(RELATIONS))
    subject, _, value = rng.choice(world.by_relation[relation])
    num_passages = rng.choice((2, 3))
    others = rng.sample([v for v in world.alternatives[relation] if v != value and v != subject], num_passages - 1)
    values = [value, *others]
    rng.shuffle(values)
    trusted = rng.randrange(num_passages)
    # Two distractor sentences in two of the passages: with three passages, one each would make the prompt too
    # long for the default 256-token budget.
    distractors = iter(world.distractors(rng, {subject, *values}, [None, None]))
    holders = set(rng.sample(range(num_passages), 2))
    passages = []
    for number, passage_value in enumerate(values, start=1):
        sentences = [fact_sentence(subject, relation, passage_value)]
        if number - 1 in holders:
            sentences.append(next(distractors))
        rng.shuffle(sentences)
        passages.append(f"Passage {number}: " + " ".join(sentences))
    question = f"According to passage {trusted + 1}, " + RELATIONS[relation][1].format(s=subject)
    return _item("inconsistent", relation, [subject], "\n".join(passages), question, values[trusted])


def _counterfactual(world: World, rng: random.Random) -> dict:
    relation = rng.choice(REAL_WORLD_RELATIONS)
    subject, _, real = rng.choice(world.by_relation[relation])
    changed = rng.choice([v for v in world.alternatives[relation] if v != real and v != subject])
    distractors = world.distractors(rng, {subject, real, changed}, [relation, relation, None])
    sentences = [fact_sentence(subject, relation, changed), *distractors]
    rng.shuffle(sentences)
    return _item("counterfactual", relation, [subject], " ".join(sentences),
                 _question(RELATIONS[relation][1], subject), changed)


_MAKERS = {"straightforward": _straightforward, "multi_hop": _multi_hop,
           "inconsistent": _inconsistent, "counterfactual": _counterfactual}


def split_worlds(seed: int) -> tuple[World, World]:
    """Split every entity table between train and eval (ENTITY_EVAL_SHARE to eval) and build both worlds."""
    rng = random.Random(f"entity-split:{seed}")

    def split(names: Iterable[str]) -> tuple[list[str], list[str]]:
        shuffled = sorted(names)
        rng.shuffle(shuffled)
        k = max(2, round(len(shuffled) * ENTITY_EVAL_SHARE))
        return sorted(shuffled[k:]), sorted(shuffled[:k])

    tables = [split(t) for t in (facts.COUNTRIES, facts.ELEMENTS, facts.BOOKS, facts.MOONS, facts.LAST_NAMES,
                                 facts.COMPANIES)]
    train = World(*(train_part for train_part, _ in tables), rng=random.Random(f"world-train:{seed}"))
    eval_ = World(*(eval_part for _, eval_part in tables), rng=random.Random(f"world-eval:{seed}"))
    return train, eval_


def _generate(world: World, n: int, split: str, seed: int) -> list[dict]:
    """n items, as even a share of the four tasks as n allows, shuffled, with ids "{split}-00000"..."""
    rng = random.Random(f"items-{split}:{seed}")
    tasks = [TASKS[i % len(TASKS)] for i in range(n)]
    rows = [_MAKERS[task](world, rng) for task in tasks]
    rng.shuffle(rows)
    return [{"id": f"{split}-{i:05d}", **row} for i, row in enumerate(rows)]


def synthesize(n: int = DEFAULT_N, eval_share: float = DEFAULT_EVAL_SHARE,
               seed: int = DEFAULT_SEED) -> tuple[list[dict], list[dict]]:
    """(train rows, eval rows): n train items and max(4, round(n * eval_share)) eval items on disjoint entities."""
    if n < len(TASKS):
        raise ValueError(f"n must be at least {len(TASKS)} (one item per task type), got {n}")
    if not 0 < eval_share <= 1:
        raise ValueError(f"eval_share must be in (0, 1], got {eval_share}")
    train_world, eval_world = split_worlds(seed)
    n_eval = max(len(TASKS), round(n * eval_share))
    return _generate(train_world, n, "train", seed), _generate(eval_world, n_eval, "eval", seed)


def write_jsonl(path: str | Path, rows: Iterable[dict]) -> None:
    """Write one JSON object per line (UTF-8, newline-terminated)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", encoding="utf-8") as f:
        for row in rows:
            f.write(json.dumps(row, ensure_ascii=False) + "\n")


def to_confiqa(rows: Iterable[dict]) -> list[dict]:
    """The counterfactual rows as ConFiQA records (what `--eval --suite confiqa` and `--suite fiqa` read).

    A counterfactual row states a changed real-world fact, which is ConFiQA's kind of item: `cf_context` is
    its context and `cf_answer` its answer; `orig_answer` is the real-world value (world_fact) and
    `orig_context` the same context with the real fact's sentence in place of the changed one. The other task
    types have no competing "original" answer (the p_o and MR scores need one), so they are left out.
    """
    records = []
    for row in rows:
        if row.get("task") != "counterfactual":
            continue
        subject, relation = row["entities"][0], row["relation"]
        context, question = row["problem"].removeprefix("<context>").split("</context>\n\n", 1)
        changed = row["solution"].removeprefix("<answer>").removesuffix("</answer>")
        real = world_fact(relation, subject)
        stated = fact_sentence(subject, relation, changed)
        if real is None or stated not in context:
            raise ValueError(f"row {row.get('id')}: no real-world value or no stated fact to swap")
        records.append({"id": row.get("id"), "question": question, "cf_context": context, "cf_answer": changed,
                        "cf_alias": [], "orig_context": context.replace(stated, fact_sentence(subject, relation, real)),
                        "orig_answer": real, "orig_alias": [], "relation": relation})
    return records


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", required=True, type=Path, help="writes OUT/train.jsonl and OUT/eval.jsonl")
    parser.add_argument("--n", type=int, default=DEFAULT_N, help=f"training rows (default {DEFAULT_N})")
    parser.add_argument("--eval-share", type=float, default=DEFAULT_EVAL_SHARE,
                        help=f"eval rows = max(4, round(n * share)) (default {DEFAULT_EVAL_SHARE})")
    parser.add_argument("--seed", type=int, default=DEFAULT_SEED)
    parser.add_argument("--confiqa", action="store_true",
                        help="also write the eval split's counterfactual rows in ConFiQA's format to OUT/eval-confiqa.json")
    args = parser.parse_args(argv)

    train, eval_ = synthesize(args.n, args.eval_share, args.seed)
    for split, rows in (("train", train), ("eval", eval_)):
        path = args.out / f"{split}.jsonl"
        write_jsonl(path, rows)
        print(f"{split}: {len(rows)} rows -> {path} ({task_counts(rows)})")
    if args.confiqa:
        records = to_confiqa(eval_)
        path = args.out / "eval-confiqa.json"
        path.write_text(json.dumps(records, ensure_ascii=False, indent=1) + "\n", encoding="utf-8")
        print(f"eval, ConFiQA format: {len(records)} counterfactual records -> {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
