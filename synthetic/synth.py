"""Synthetic faithfulness data in the CANOE paper's four task types: prose passages built from `facts.py`.

A passage reads like a reading-comprehension passage (ConFiQA's, FollowRAG's): a paragraph about one entity,
several of its facts in varied sentences, sentences that state nothing, and look-alikes of its kind with facts of
their own. Answers are names, years and counts; the templates are in `facts.json`.

- **straightforward**: the answer is stated in a paragraph about the entity;
- **multi_hop**: a chain of two or three facts, one paragraph per entity ("Who composed the music for the film
  directed by X?"), sometimes with the chain's real-world fact changed (ConFiQA-MR's kind);
- **inconsistent**: two or three passages disagree on the fact, and the question says which passage to trust;
- **counterfactual**: a paragraph about a real entity whose real fact is replaced by another value *wherever the
  value occurs*, as ConFiQA substitutes its contexts.

Every row is `{"id", "task", "relation", "entities", "problem", "solution"}` as `data.load_jsonl` reads it;
`entities` are the chain's subjects, `relation` the asked relation (a chain is "first>second"). Train and eval use
disjoint entities; the same arguments write byte-identical files. `--confiqa` also writes the eval split's
counterfactual rows as a ConFiQA file (`to_confiqa`) for `canoe.py --eval --suite confiqa --eval-file ...`.

    python -m synthetic.synth --out data/synth [--n 2000] [--eval-share 0.15] [--seed 42] [--confiqa]
"""

from __future__ import annotations

import argparse
import json
import random
import re
import sys
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from synthetic import facts
from data import TASKS, task_counts


@dataclass(frozen=True)
class Relation:
    """One kind of fact. `statements`: sentences stating it ({s} subject, {o} value, {a} "a"/"an" for {o});
    `questions`: ways to ask for {o} about {s}; `echoes` (real-world relations only): sentences that name the
    value again, so that a counterfactual change has to be made in several places."""

    kind: str
    statements: tuple[str, ...]
    questions: tuple[str, ...]
    echoes: tuple[str, ...] = ()


RELATIONS: dict[str, Relation] = {
    name: Relation(spec["kind"], tuple(spec["statements"]), tuple(spec["questions"]), tuple(spec.get("echoes", ())))
    for name, spec in facts.TEMPLATES["relations"].items()}
# The only relations a counterfactual item changes.
REAL_WORLD_RELATIONS = ("capital", "currency", "language", "city_country", "author", "symbol", "orbits")
# How a paragraph refers to its entity after the first sentence (a person: by surname).
REFERENCES: dict[str, str] = facts.TEMPLATES["references"]
# Sentences that state no fact ({s}: the entity or its reference), by kind.
FILLERS: dict[str, tuple[str, ...]] = {kind: tuple(texts) for kind, texts in facts.TEMPLATES["fillers"].items()}
# Openings for a sentence about a look-alike of the paragraph's entity.
LINKERS: tuple[str, ...] = tuple(facts.TEMPLATES["linkers"])
# The instruction around a question ({q}): several styles, so the answer format is learned for more than one.
INSTRUCTIONS: tuple[str, ...] = tuple(facts.TEMPLATES["instructions"])
# Multi-hop chain "first>second[>third]": (its relations hop by hop, its question about the first subject {s}).
CHAINS: dict[str, tuple[tuple[str, ...], str]] = {
    chain: (tuple(chain.split(">")), question) for chain, question in facts.TEMPLATES["chains"].items()}

DEFAULT_N = 2000
DEFAULT_EVAL_SHARE = 0.15
DEFAULT_SEED = 42
ENTITY_EVAL_SHARE = 0.2  # share of each name pool that goes to eval
PEOPLE_PER_SURNAME = 3
COUNTERFACTUAL_CHAIN_SHARE = 0.4  # multi-hop items whose real-world hop is changed
PASSAGE_WORDS = (60, 250)  # the length of a context, in words (ConFiQA's are ~60-200, a FollowRAG passage ~100)


def sentence(template: str, subject: str, value: str) -> str:
    """A template filled in, its first letter capitalised ("iron" opens a sentence as "Iron")."""
    article = "an" if value[:1].lower() in "aeiou" else "a"
    text = template.format(s=subject, o=value, a=article)
    return text[0].upper() + text[1:]


@dataclass
class World:
    """All entities of one split and their facts: real ones from facts.py, invented people, companies, films,
    clubs and towns with names from the split's share of each name pool."""

    facts: dict[tuple[str, str], str] = field(default_factory=dict)  # (subject, relation) -> value
    kinds: dict[str, list[str]] = field(default_factory=dict)  # kind -> entity names

    def add(self, kind: str, name: str, values: dict[str, str]) -> None:
        self.kinds.setdefault(kind, []).append(name)
        self.facts.update({(name, relation): value for relation, value in values.items()})

    def kind_of(self, name: str) -> str:
        return next(kind for kind, names in self.kinds.items() if name in names)

    def relations_of(self, name: str) -> list[str]:
        return [r for r in RELATIONS if (name, r) in self.facts]

    def values(self, relation: str) -> list[str]:
        """Every value of `relation` in this world (what a changed or disagreeing fact is drawn from)."""
        extra = facts.PLANETS if relation == "orbits" else self.kinds["city"] if relation == "capital" else ()
        return sorted({v for (_, r), v in self.facts.items() if r == relation} | set(extra))


# The pools of real-world entities, each split between train and eval like the invented names.
REAL_POOLS = {"countries": facts.COUNTRIES, "elements": facts.ELEMENTS, "books": facts.BOOKS, "moons": facts.MOONS}


def _add_real_facts(world: World, pools: dict[str, Iterable[str]]) -> list[str]:
    """Add the real-world entities of `pools` (REAL_POOLS' keys) with their facts to `world`; return its cities."""
    cities = []
    for country in pools["countries"]:
        capital, currency, language = facts.COUNTRIES[country]
        world.add("country", country,
                  {"capital": capital, "currency": currency} | ({"language": language} if language else {}))
        for city in (capital, *facts.CITIES.get(country, ())):
            world.add("city", city, {"city_country": country})
            cities.append(city)
    for pool, kind, relation in (("elements", "element", "symbol"), ("books", "book", "author"),
                                 ("moons", "moon", "orbits")):
        for name in pools[pool]:
            world.add(kind, name, {relation: REAL_POOLS[pool][name]})
    return cities


def build_world(pools: dict[str, list[str]], rng: random.Random) -> World:
    """One split's world from its share of the name pools (see split_worlds)."""
    world = World()
    cities = _add_real_facts(world, pools)
    people = [f"{first} {last}" for last in pools["surnames"]
              for first in rng.sample(facts.FIRST_NAMES, PEOPLE_PER_SURNAME)]
    universities = [f"the University of {city}" for city in cities]
    awards = [f"the {last} Prize" for last in pools["surnames"]]
    companies = pools["companies"]
    for person in people:
        world.add("person", person, {
            "born_year": str(rng.randint(1940, 2001)), "birthplace": rng.choice(cities),
            "profession": rng.choice(facts.PROFESSIONS), "employer": rng.choice(companies),
            "university": rng.choice(universities), "residence": rng.choice(pools["countries"]),
            "award": rng.choice(awards)})
    for company in companies:
        world.add("company", company, {
            "founded": str(rng.randint(1850, 2015)), "founder": rng.choice(people),
            "headquarters": rng.choice(cities), "employees": f"{rng.randint(40, 90000):,}",
            "industry": rng.choice(facts.INDUSTRIES), "ceo": rng.choice(people)})
    for adjective in pools["adjectives"]:
        for noun in rng.sample(pools["nouns"], 2):
            world.add("film", f"The {adjective} {noun}", {
                "release_year": str(rng.randint(1955, 2023)), "director": rng.choice(people),
                "composer": rng.choice(people), "setting": rng.choice(cities), "runtime": str(rng.randint(81, 172))})
        world.add("club", f"{adjective} {rng.choice(facts.CLUB_SUFFIXES)}", {
            "club_city": rng.choice(cities), "club_founded": str(rng.randint(1870, 1990)),
            "stadium": f"{rng.choice(pools['surnames'])} {rng.choice(facts.ARENA_WORDS)}",
            "coach": rng.choice(people), "titles": str(rng.randint(1, 23))})
    for town in pools["towns"]:
        world.add("town", town, {
            "town_country": rng.choice(pools["countries"]), "population": f"{rng.randint(1500, 480000):,}",
            "river": rng.choice(pools["rivers"]), "mayor": rng.choice(people)})
    return world


def split_worlds(seed: int) -> tuple[World, World]:
    """Split every name pool between train and eval (ENTITY_EVAL_SHARE to eval) and build both worlds."""
    rng = random.Random(f"entity-split:{seed}")
    # The order of the pools is the order of the draws.
    tables = REAL_POOLS | {"surnames": facts.LAST_NAMES, "companies": facts.COMPANIES,
                           "adjectives": facts.TITLE_ADJECTIVES, "nouns": facts.TITLE_NOUNS, "towns": facts.TOWNS,
                           "rivers": facts.RIVERS}
    train, eval_ = {}, {}
    for name, table in tables.items():
        shuffled = sorted(table)
        rng.shuffle(shuffled)
        k = max(2, round(len(shuffled) * ENTITY_EVAL_SHARE))
        train[name], eval_[name] = sorted(shuffled[k:]), sorted(shuffled[:k])
    return (build_world(train, random.Random(f"world-train:{seed}")),
            build_world(eval_, random.Random(f"world-eval:{seed}")))


_REAL_WORLD = World()
_add_real_facts(_REAL_WORLD, REAL_POOLS)


def world_fact(relation: str, subject: str) -> str | None:
    """The real-world value of a relation from facts.py (None for invented or unknown facts)."""
    return _REAL_WORLD.facts.get((subject, relation))


def _namesakes(world: World, people: Iterable[str]) -> set[str]:
    """The people of `world` who share a surname with another of `people`. A paragraph refers to its person by
    surname, so its passage must name none of that person's namesakes: with Oren and Marek Fernhill in one
    passage, "Fernhill was born in Lima" could be about either."""
    people = set(people)
    return {o for o in world.kinds["person"] for p in people if o != p and o.split()[-1] == p.split()[-1]}


def _whole_word(name: str) -> str:
    return rf"(?<![\w-]){re.escape(name)}(?![\w-])"


def _named(text: str, name: str) -> bool:
    return name in text and re.search(_whole_word(name), text) is not None


def _replace_everywhere(text: str, old: str, new: str) -> str:
    """`old` replaced by `new` wherever it occurs as a whole word (ConFiQA's consistent substitution)."""
    return re.sub(_whole_word(old), new, text)


def _names_kind(template: str, kind: str) -> bool:
    """Whether `template` names its subject's kind ("The club {s} dates back to {o}.", "{s} is a town in {o}."):
    with a reference for {s} it would say the kind twice ("The club the club ..."), so it names its entity."""
    noun = REFERENCES.get(kind, "").removeprefix("the ")  # a person's reference, a surname, names no kind
    return bool(noun) and re.search(rf"\b{noun}s?\b", template, re.IGNORECASE) is not None


def _look_alikes(world: World, name: str, kind: str, avoid: set[str], rng: random.Random) -> list[tuple[str, str]]:
    """("other", sentence) for one or two facts each of one to three other entities of `kind`, none of them a
    namesake of `name` (a person is referred to by surname) and no sentence naming anything in `avoid`."""
    found = []
    candidates = [o for o in world.kinds[kind] if o.split()[-1] != name.split()[-1] and o not in avoid]
    for other in rng.sample(candidates, min(len(candidates), rng.randint(1, 3))):
        relations = [r for r in world.relations_of(other) if world.facts[(other, r)] not in avoid]
        for relation in rng.sample(relations, min(len(relations), rng.randint(1, 2))):
            template = rng.choice(RELATIONS[relation].statements)
            statement = sentence(template, other, world.facts[(other, relation)])
            # A linker only before a sentence that opens with a name ("Meanwhile, Oslo ...", not "Meanwhile, Most").
            linker = rng.choice(LINKERS) if template.startswith("{s}") and other[0].isupper() else ""
            found.append(("other", linker + statement))
    return found


def paragraph(world: World, name: str, rng: random.Random, *, must: Sequence[str], size: int,
              avoid: set[str] = frozenset(), override: dict[str, str] | None = None) -> str:
    """A paragraph about `name`: its facts `must` (in that order of priority) and others up to `size` fact
    sentences, one to three sentences stating nothing, and facts of look-alikes (`_look_alikes`). `override`
    replaces some of its facts' values (an inconsistent passage's disagreeing value); `avoid` lists names that no
    sentence about another entity may contain, as subject or value."""
    values = {r: world.facts[(name, r)] for r in world.relations_of(name)} | (override or {})
    others = [r for r in values if r not in must and values[r] not in avoid]
    rng.shuffle(others)
    chosen = [*must, *others][:max(size, len(must))]
    kind = world.kind_of(name)
    first, *rest = rng.sample(chosen, len(chosen))
    # ("fact", a relation of the entity) | ("filler", a template about it) | ("other", a look-alike's sentence)
    fillers = rng.sample(FILLERS[kind], min(len(FILLERS[kind]), rng.randint(1, 3)))
    body = [("fact", relation) for relation in rest] + [("filler", template) for template in fillers]
    body += _look_alikes(world, name, kind, avoid, rng)
    rng.shuffle(body)
    sentences = [sentence(rng.choice(RELATIONS[first].statements), name, values[first])]
    reference = name.split()[-1] if kind == "person" else REFERENCES[kind]
    antecedent = True  # the last entity of this kind that a sentence named is this one
    for what, text in body:
        if what == "other":
            sentences.append(text)
            antecedent = False
            continue
        # A reference ("the country") only while this entity is the last of its kind named: after a look-alike's
        # sentence it would read as the look-alike's. A surname is unambiguous: no look-alike shares it, and the
        # item makers keep the person's namesakes out of the passage's other paragraphs (`_namesakes`).
        refer = (antecedent or kind == "person") and rng.random() < 0.5
        template, value = (rng.choice(RELATIONS[text].statements), values[text]) if what == "fact" else (text, "")
        subject = reference if refer and not _names_kind(template, kind) else name
        sentences.append(sentence(template, subject, value))
        antecedent = antecedent or what == "fact" or "{s}" in text  # "Its cuisine ..." names no one
    return " ".join(sentences)


def _question(relation: str, subject: str, rng: random.Random) -> str:
    return sentence(rng.choice(RELATIONS[relation].questions), subject, "")


def _item(task: str, relation: str, entities: list[str], context: str, question: str, answer: str,
          rng: random.Random) -> dict:
    problem = f"<context>{context}</context>\n\n" + rng.choice(INSTRUCTIONS).format(q=question)
    return {"task": task, "relation": relation, "entities": entities, "problem": problem,
            "solution": f"<answer>{answer}</answer>"}


def _straightforward(world: World, rng: random.Random) -> dict:
    kind = rng.choice(["person", "company", "film", "club", "town", "country", "city", "book", "moon", "element"])
    subject = rng.choice(world.kinds[kind])
    relation = rng.choice(world.relations_of(subject))
    answer = world.facts[(subject, relation)]
    context = paragraph(world, subject, rng, must=[relation], size=rng.randint(3, 7), avoid={subject, answer})
    if rng.random() < 0.6:
        context += _second_paragraph(world, kind, rng, avoid={subject, answer}, context=context)
    return _item("straightforward", relation, [subject], context, _question(relation, subject, rng), answer, rng)


def _second_paragraph(world: World, kind: str, rng: random.Random, avoid: set[str], context: str) -> str:
    """A paragraph about an entity of another kind that names nothing in `avoid` nor a namesake of a person
    `context` names, after a space or a line break; "" if the one drawn would."""
    avoid = avoid | _namesakes(world, [person for person in world.kinds["person"] if _named(context, person)])
    others = [o for o in world.kinds[rng.choice([k for k in world.kinds if k != kind])]
              if o not in avoid and any(world.facts[(o, r)] not in avoid for r in world.relations_of(o))]
    if not others:
        return ""
    text = paragraph(world, rng.choice(others), rng, must=[], size=rng.randint(2, 4), avoid=avoid)
    return "" if any(_named(text, word) for word in avoid) else rng.choice((" ", "\n")) + text


def _change(world: World, subject: str, relation: str, rng: random.Random, context: str) -> str:
    """A value for a counterfactual `relation(subject)`: another value of the relation, not the real one and
    not already named in `context`."""
    real = world.facts[(subject, relation)]
    return rng.choice([v for v in world.values(relation) if v not in (real, subject) and v not in context])


def _counterfactual(world: World, rng: random.Random) -> dict:
    relation = rng.choice(REAL_WORLD_RELATIONS)
    kind = RELATIONS[relation].kind
    subject = rng.choice([s for s in world.kinds[kind] if (s, relation) in world.facts])
    real = world.facts[(subject, relation)]
    text = paragraph(world, subject, rng, must=[relation], size=rng.randint(2, 4), avoid={subject, real})
    if rng.random() < 0.8:
        text += _second_paragraph(world, kind, rng, avoid={subject, real}, context=text)
    echoes = RELATIONS[relation].echoes
    for echo in rng.sample(echoes, rng.randint(0, len(echoes))):
        text += " " + sentence(echo, subject, real)
    changed = _change(world, subject, relation, rng, text)
    context = _replace_everywhere(text, real, changed)
    return _item("counterfactual", relation, [subject], context, _question(relation, subject, rng), changed, rng)


def _multi_hop(world: World, rng: random.Random) -> dict:
    chain = rng.choice(list(CHAINS))
    relations, template = CHAINS[chain]
    persons = set(world.kinds["person"])

    def people(nodes: list[str]) -> list[str]:  # each has a paragraph of their own, referring to them by surname
        return [node for node in nodes[:-1] if node in persons]

    def path(start: str) -> list[str] | None:
        """The chain's nodes from `start`, if the whole chain exists, repeats no node and names no namesake of
        its people."""
        nodes = [start]
        for relation in relations:
            if (nodes[-1], relation) not in world.facts:
                return None
            nodes.append(world.facts[(nodes[-1], relation)])
        return nodes if len(set(nodes)) == len(nodes) and not _namesakes(world, people(nodes)) & set(nodes) else None

    nodes = path(rng.choice([s for s in world.kinds[RELATIONS[relations[0]].kind] if path(s)]))
    answer = nodes[-1]
    avoid = set(nodes) | _namesakes(world, people(nodes))
    paragraphs = [paragraph(world, subject, rng, must=[relation], size=rng.randint(3, 5), avoid=avoid)
                  for subject, relation in zip(nodes, relations)]
    context = rng.choice((" ", "\n")).join(paragraphs)
    if relations[-1] in REAL_WORLD_RELATIONS and rng.random() < COUNTERFACTUAL_CHAIN_SHARE:
        changed = _change(world, nodes[-2], relations[-1], rng, context)
        context, answer = _replace_everywhere(context, answer, changed), changed
    return _item("multi_hop", chain, nodes[:-1], context, sentence(template, nodes[0], ""), answer, rng)


def _inconsistent(world: World, rng: random.Random) -> dict:
    kind = rng.choice(["person", "company", "film", "club", "town", "country", "book"])
    subject = rng.choice(world.kinds[kind])
    relation = rng.choice(world.relations_of(subject))
    value = world.facts[(subject, relation)]
    num_passages = rng.choice((2, 3))
    values = [value, *rng.sample([v for v in world.values(relation) if v not in (value, subject)], num_passages - 1)]
    rng.shuffle(values)
    trusted = rng.randrange(num_passages)
    passages = [f"Passage {number}: " + paragraph(world, subject, rng, must=[relation], size=rng.randint(2, 4),
                                                  avoid={subject, *values}, override={relation: passage_value})
                for number, passage_value in enumerate(values, start=1)]
    question = _question(relation, subject, rng)
    question = f"According to passage {trusted + 1}, {question[0].lower()}{question[1:]}"
    return _item("inconsistent", relation, [subject], "\n".join(passages), question, values[trusted], rng)


_MAKERS = {"straightforward": _straightforward, "multi_hop": _multi_hop,
           "inconsistent": _inconsistent, "counterfactual": _counterfactual}


def context_words(row: dict) -> int:
    """Words in a row's context (what PASSAGE_WORDS bounds)."""
    return len(row["problem"].removeprefix("<context>").split("</context>")[0].split())


def _generate(world: World, n: int, split: str, seed: int) -> list[dict]:
    """n items, as even a share of the four tasks as n allows, shuffled, with ids "{split}-00000"..."""
    rng = random.Random(f"items-{split}:{seed}")
    rows = []
    while len(rows) < n:  # an item is drawn again until its context has PASSAGE_WORDS words
        row = _MAKERS[TASKS[len(rows) % len(TASKS)]](world, rng)
        if PASSAGE_WORDS[0] <= context_words(row) <= PASSAGE_WORDS[1]:
            rows.append(row)
    rng.shuffle(rows)
    return [{"id": f"{split}-{i:05d}", **row} for i, row in enumerate(rows)]


def synthesize(n: int = DEFAULT_N, eval_share: float = DEFAULT_EVAL_SHARE,
               seed: int = DEFAULT_SEED) -> tuple[list[dict], list[dict]]:
    """(train rows, eval rows): n train items and max(4, round(n * eval_share)) eval items on disjoint entities.
    Raises ValueError for n below 4 or eval_share outside (0, 1]."""
    if n < len(TASKS):
        raise ValueError(f"n must be at least {len(TASKS)} (one item per task type), got {n}")
    if not 0 < eval_share <= 1:
        raise ValueError(f"eval_share must be in (0, 1], got {eval_share}")
    train_world, eval_world = split_worlds(seed)
    n_eval = max(len(TASKS), round(n * eval_share))
    return _generate(train_world, n, "train", seed), _generate(eval_world, n_eval, "eval", seed)


def bare_question(user_text: str) -> str:
    """The question of a prompt's instruction (the text after `</context>\n\n`), without the INSTRUCTIONS
    wording around it; raises ValueError if no instruction matches.

    >>> bare_question("Based on the passage, answer briefly: Who wrote Emma?")
    'Who wrote Emma?'
    """
    for instruction in sorted(set(INSTRUCTIONS), key=len, reverse=True):
        head, tail = instruction.split("{q}")
        if user_text.startswith(head) and user_text.endswith(tail) and len(user_text) > len(head) + len(tail):
            return user_text[len(head):len(user_text) - len(tail)]
    raise ValueError(f"not a question of synth's instructions: {user_text!r}")


def to_confiqa(rows: Iterable[dict]) -> list[dict]:
    """The counterfactual rows as ConFiQA records (what `--eval --suite confiqa` and `--suite fiqa` read), the
    question bare; `orig_context` is the context with the change undone (the changed value is never in the passage
    before the change, `_change`). Other task types have no competing original answer and are left out."""
    records = []
    for row in [r for r in rows if r.get("task") == "counterfactual"]:
        subject, relation = row["entities"][0], row["relation"]
        context, question = row["problem"].removeprefix("<context>").split("</context>\n\n", 1)
        changed = row["solution"].removeprefix("<answer>").removesuffix("</answer>")
        real = world_fact(relation, subject)
        if real is None or changed not in context:
            raise ValueError(f"row {row.get('id')}: no real-world value or no stated fact to swap")
        records.append({"id": row.get("id"), "question": bare_question(question), "cf_context": context,
                        "cf_answer": changed, "cf_alias": [],
                        "orig_context": _replace_everywhere(context, changed, real), "orig_answer": real,
                        "orig_alias": [], "relation": relation})
    return records


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", required=True, type=Path, help="writes OUT/train.jsonl and OUT/eval.jsonl")
    parser.add_argument("--n", type=int, default=DEFAULT_N, help=f"training rows (default {DEFAULT_N})")
    parser.add_argument("--eval-share", type=float, default=DEFAULT_EVAL_SHARE,
                        help=f"eval rows = max(4, round(n * share)) (default {DEFAULT_EVAL_SHARE})")
    parser.add_argument("--seed", type=int, default=DEFAULT_SEED)
    parser.add_argument("--confiqa", action="store_true", help="also write the eval split's counterfactual rows "
                        "in ConFiQA's format to OUT/eval-confiqa.json")
    args = parser.parse_args(argv)

    train, eval_ = synthesize(args.n, args.eval_share, args.seed)
    args.out.mkdir(parents=True, exist_ok=True)
    for split, rows in (("train", train), ("eval", eval_)):
        path = args.out / f"{split}.jsonl"
        path.write_text("".join(json.dumps(row, ensure_ascii=False) + "\n" for row in rows), encoding="utf-8")
        print(f"{split}: {len(rows)} rows -> {path} ({task_counts(rows)})")
    if args.confiqa:
        records = to_confiqa(eval_)
        path = args.out / "eval-confiqa.json"
        path.write_text(json.dumps(records, ensure_ascii=False, indent=1) + "\n", encoding="utf-8")
        print(f"eval, ConFiQA format: {len(records)} counterfactual records -> {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
