"""Synthetic faithfulness data in the CANOE paper's four task types: prose passages built from `facts.py`.

CANOE (arXiv 2505.16483) trains on ~10k short-form QA items synthesised from knowledge-base triples; this file
makes a set of the same kinds on the machine, so the default run needs no download. A passage is written the way
real reading-comprehension passages are (ConFiQA's, FollowRAG's): a paragraph of prose about one entity, several
of its facts in varied sentences, sentences that state nothing, and other entities of the same kind with facts of
their own, so the asked fact has to be found among look-alikes. Facts are names, years and counts.

- **straightforward**: the answer is stated in a paragraph about the entity (or about another entity it names);
- **multi_hop**: a chain of two or three facts, one paragraph per entity of the chain ("Who composed the music
  for the film directed by X?"), sometimes with one real-world fact of the chain changed (ConFiQA-MR's kind);
- **inconsistent**: two or three passages disagree on the fact, and the question says which passage to trust;
- **counterfactual**: a paragraph about a real entity (a country, city, book, element or moon) whose real fact is
  replaced by another value *wherever the value occurs* in the paragraph, as ConFiQA substitutes its contexts.

Every row is `{"id", "task", "relation", "entities", "problem", "solution"}` in the format `data.load_jsonl`
reads (docs/DESIGN.md, "Data"); `entities` are the subjects of the chain, `relation` the asked relation (a chain
is "first>second"). Questions come in several phrasings per relation and under several instructions (plain, or
asking for a short answer from the passage). Train and eval are built from disjoint entities (every name pool is
split first), so no eval subject appears in a training prompt. The output is a function of the arguments alone:
the same seed writes byte-identical files.

    python -m synthetic.synth --out data/synth [--n 2000] [--eval-share 0.15] [--seed 42] [--confiqa]

`--confiqa` also writes the eval split's counterfactual rows as a ConFiQA file (`to_confiqa`), for
`canoe.py --eval --suite confiqa --eval-file data/synth/eval-confiqa.json`.
"""

from __future__ import annotations

import argparse
import json
import random
import re
import sys
from collections.abc import Callable, Iterable, Sequence
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
    # People (invented).
    "born_year": Relation("person", ("{s} was born in {o}.", "{s}, born in {o}, grew up in a family of teachers.",
                                     "{s} was born in {o} and grew up near the coast."),
                          ("In what year was {s} born?", "When was {s} born?", "What is {s}'s year of birth?")),
    "birthplace": Relation("person", ("{s} was born in the city of {o}.", "{o} is the city where {s} was born.",
                                      "{s} was born and raised in {o}."),
                           ("Where was {s} born?", "In which city was {s} born?", "What is the birthplace of {s}?")),
    "profession": Relation("person", ("{s} works as {a} {o}.", "By profession, {s} is {a} {o}.",
                                      "{s} trained as {a} {o} and still works in that field."),
                           ("What is {s}'s profession?", "What does {s} do for a living?",
                            "What is the occupation of {s}?")),
    "employer": Relation("person", ("{s} works for {o}.", "{s} is employed by {o}.",
                                    "{s} joined {o} years ago and has stayed there since."),
                         ("Which company does {s} work for?", "Who employs {s}?", "Who is {s}'s employer?")),
    "university": Relation("person", ("{s} studied at {o}.", "{s} graduated from {o}.",
                                      "{s} earned a degree at {o}."),
                           ("Where did {s} study?", "Which university did {s} attend?",
                            "From which university did {s} graduate?")),
    "residence": Relation("person", ("{s} lives in {o}.", "{s} now makes a home in {o}.",
                                     "These days {s} lives in {o}."),
                          ("Which country does {s} live in?", "Where does {s} live?",
                           "In which country does {s} reside?")),
    "award": Relation("person", ("{s} received {o}.", "{s} was awarded {o} for a lifetime of work.",
                                 "{s} won {o}."),
                      ("Which award did {s} receive?", "What prize was {s} awarded?", "Which prize did {s} win?")),
    # Companies (invented).
    "founded": Relation("company", ("{s} was founded in {o}.", "{s} has been in business since {o}.",
                                    "{s} opened its doors in {o}."),
                        ("When was {s} founded?", "In what year was {s} founded?", "What year was {s} established?")),
    "founder": Relation("company", ("{s} was founded by {o}.", "{o} founded {s}.", "{s} was started by {o}."),
                        ("Who founded {s}?", "Who is the founder of {s}?", "Who started {s}?")),
    "headquarters": Relation("company", ("{s} is headquartered in {o}.", "{s} has its head office in {o}.",
                                         "{s} is based in {o}."),
                             ("Where is {s} headquartered?", "In which city is {s} based?",
                              "Where is the head office of {s}?")),
    "employees": Relation("company", ("{s} employs {o} people.", "{s} has {o} employees.",
                                      "{s} has a workforce of {o}."),
                          ("How many people does {s} employ?", "How many employees does {s} have?")),
    "industry": Relation("company", ("{s} works in the {o} industry.", "{s} is active in the {o} sector."),
                         ("In which industry does {s} work?", "Which sector is {s} active in?")),
    "ceo": Relation("company", ("The chief executive of {s} is {o}.", "{o} is the chief executive of {s}.",
                                "{s} is run by its chief executive, {o}."),
                    ("Who is the chief executive of {s}?", "Who runs {s}?")),
    # Films (invented).
    "release_year": Relation("film", ("{s} was released in {o}.", "{s} came out in {o}.", "{s} premiered in {o}."),
                             ("When was {s} released?", "In what year did {s} come out?",
                              "What year did {s} premiere?")),
    "director": Relation("film", ("{s} was directed by {o}.", "{o} directed {s}.", "{s} is a film by director {o}."),
                         ("Who directed {s}?", "Who is the director of {s}?")),
    "composer": Relation("film", ("The score of {s} was composed by {o}.", "{o} wrote the music for {s}.",
                                  "{s} features music by {o}."),
                         ("Who composed the music for {s}?", "Who wrote the score of {s}?")),
    "setting": Relation("film", ("{s} is set in {o}.", "The story of {s} takes place in {o}."),
                        ("Where is {s} set?", "In which city does {s} take place?")),
    "runtime": Relation("film", ("{s} runs for {o} minutes.", "{s} has a running time of {o} minutes."),
                        ("How many minutes does {s} run?", "What is the running time of {s} in minutes?")),
    # Football clubs (invented).
    "club_city": Relation("club", ("{s} is a football club from {o}.", "{s} plays its home games in {o}."),
                          ("Which city is {s} from?", "In which city is {s} based?")),
    "club_founded": Relation("club", ("{s} was formed in {o}.", "The club {s} dates back to {o}."),
                             ("When was {s} formed?", "In what year was {s} formed?")),
    "stadium": Relation("club", ("{s} plays at {o}.", "The home ground of {s} is {o}."),
                        ("At which stadium does {s} play?", "What is the home ground of {s}?")),
    "coach": Relation("club", ("{s} is coached by {o}.", "{o} coaches {s}.", "The coach of {s} is {o}."),
                      ("Who coaches {s}?", "Who is the coach of {s}?")),
    "titles": Relation("club", ("{s} has won {o} league titles.", "{s} has {o} league titles to its name."),
                       ("How many league titles has {s} won?",)),
    # Towns (invented, in real countries).
    "town_country": Relation("town", ("{s} is a town in {o}.", "{s} lies in {o}."),
                             ("Which country is {s} in?", "In which country is the town of {s}?")),
    "population": Relation("town", ("{s} has a population of {o}.", "About {o} people live in {s}."),
                           ("What is the population of {s}?", "How many people live in {s}?")),
    "river": Relation("town", ("{s} lies on the river {o}.", "The river {o} runs through {s}."),
                      ("Which river runs through {s}?", "On which river does {s} lie?")),
    "mayor": Relation("town", ("The mayor of {s} is {o}.", "{o} is the mayor of {s}."),
                      ("Who is the mayor of {s}?",)),
    # Real-world facts: the only ones a counterfactual item changes.
    "capital": Relation("country", ("The capital of {s} is {o}.", "{o} is the capital of {s}.",
                                    "{s} is governed from its capital, {o}."),
                        ("What is the capital of {s}?", "Which city is the capital of {s}?"),
                        ("Many travellers to {s} arrive first in {o}.", "The national parliament meets in {o}.")),
    "currency": Relation("country", ("The currency of {s} is the {o}.", "{s} uses the {o} as its currency.",
                                     "People in {s} pay with the {o}."),
                         ("What is the currency of {s}?", "What currency is used in {s}?",
                          "Which currency does {s} use?"),
                         ("Prices in {s} are quoted in the {o}.", "Visitors exchange their money for the {o}.")),
    "language": Relation("country", ("Most people in {s} speak {o}.", "{o} is the language most people in {s} speak."),
                         ("What language do most people in {s} speak?", "What is the main language of {s}?"),
                         ("Street signs in {s} are mostly written in {o}.", "Schools in {s} teach mainly in {o}.")),
    "city_country": Relation("city", ("{s} is a city in {o}.", "{s} lies in {o}."),
                             ("Which country is {s} in?", "In which country is the city of {s}?"),
                             ("{s} is one of the better-known cities of {o}.",)),
    "author": Relation("book", ("{s} was written by {o}.", "{o} wrote {s}.", "{s} is a work by {o}."),
                       ("Who wrote {s}?", "Who is the author of {s}?"),
                       ("Readers of {o} often begin with {s}.",)),
    "symbol": Relation("element", ("The chemical symbol of {s} is {o}.", "{s} is written {o} in chemical formulas."),
                       ("What is the chemical symbol of {s}?", "Which symbol stands for {s}?"),
                       ("In formulas, {s} appears as {o}.",)),
    "orbits": Relation("moon", ("{s} is a moon of {o}.", "{s} orbits {o}."),
                       ("Which planet does {s} orbit?", "Around which planet does {s} travel?"),
                       ("{s} is one of the bodies that circle {o}.",)),
}
REAL_WORLD_RELATIONS = ("capital", "currency", "language", "city_country", "author", "symbol", "orbits")

# How a paragraph refers to its entity after the first sentence (a person: by surname).
REFERENCES = {"company": "the company", "film": "the film", "club": "the club", "town": "the town",
              "country": "the country", "city": "the city", "book": "the book", "element": "the element",
              "moon": "the moon"}
# Sentences that state no fact ({s}: the entity or its reference).
FILLERS: dict[str, tuple[str, ...]] = {
    "person": ("{s} rarely gives interviews.", "Colleagues describe {s} as patient and exacting.",
               "Over the years {s} has mentored many younger colleagues.", "{s} is known for a dry sense of humour.",
               "In spare hours {s} enjoys long walks and old records."),
    "company": ("{s} has grown steadily over the past decades.", "Analysts regard {s} as a careful, stable business.",
                "{s} publishes a yearly report on its environmental goals.",
                "Its products are sold in several neighbouring markets.", "{s} went through a difficult period in the 1990s."),
    "film": ("Critics praised its pacing and its quiet final scene.", "{s} was shot over a single summer.",
             "{s} received mixed reviews on release but has since found a loyal audience.",
             "Its cast includes several actors in their first screen roles."),
    "club": ("Its supporters are known for loud, colourful matchdays.", "{s} runs a well-regarded youth academy.",
             "{s} spent several seasons in the lower divisions.", "Local rivalries shape much of its calendar."),
    "town": ("The old market square still hosts a weekly fair.", "Visitors come for its stone bridges and narrow lanes.",
             "Much of {s} was rebuilt in the last century.", "{s} is surrounded by farmland and low hills."),
    "country": ("{s} attracts millions of visitors every year.", "Its landscape ranges from coastline to highland.",
                "{s} has a long and varied history.", "Its cuisine is popular well beyond its borders."),
    "city": ("{s} is known for its markets and its old quarter.", "Many students live in {s}.",
             "Its streets are busy late into the evening.", "{s} has grown quickly since the 1960s."),
    "book": ("{s} has been translated into many languages.", "{s} is still widely read in schools.",
             "Critics have written about {s} for generations."),
    "element": ("{s} is one of the elements met early in chemistry courses.", "Industry uses {s} in many processes.",
                "Laboratories keep {s} under carefully controlled conditions."),
    "moon": ("Astronomers have studied {s} with several space probes.", "Its surface is marked by craters and ridges.",
             "Seen through a small telescope, {s} is only a faint point of light."),
}
# Openings for a sentence about another entity of the same kind (what real passages mention around the subject).
LINKERS = ("By comparison, ", "Meanwhile, ", "Nearby, ", "For its part, ", "", "")
# The instruction around a question: several styles, so the answer format is learned for more than one.
INSTRUCTIONS = (
    "{q}", "{q}", "Question: {q}",
    "Answer the question using the passage above. {q}",
    "Based on the passage, answer briefly: {q}",
    "Read the context carefully, reason about it, then answer in a few words.\nQuestion: {q}",
    "Use only the information given above to answer the following question in a few words. \n Question:{q}",
    "Think about what the passage says, then give a short answer to this question: {q}",
)
# Multi-hop chains: (relations hop by hop, question template about the first subject {s}).
CHAINS: dict[str, tuple[tuple[str, ...], str]] = {
    "director>birthplace": (("director", "birthplace"), "In which city was the director of {s} born?"),
    "director>born_year": (("director", "born_year"), "In what year was the director of {s} born?"),
    "composer>university": (("composer", "university"), "Where did the composer of {s} study?"),
    "founder>residence": (("founder", "residence"), "In which country does the founder of {s} live?"),
    "headquarters>city_country": (("headquarters", "city_country"), "In which country is {s} headquartered?"),
    "employer>founded": (("employer", "founded"), "In what year was the company {s} works for founded?"),
    "employer>ceo": (("employer", "ceo"), "Who is the chief executive of the company {s} works for?"),
    "residence>capital": (("residence", "capital"), "What is the capital of the country where {s} lives?"),
    "residence>currency": (("residence", "currency"), "What currency is used in the country where {s} lives?"),
    "club_city>city_country": (("club_city", "city_country"), "In which country is {s} based?"),
    "coach>award": (("coach", "award"), "Which award did the coach of {s} receive?"),
    "town_country>capital": (("town_country", "capital"), "What is the capital of the country {s} lies in?"),
    "mayor>profession": (("mayor", "profession"), "What is the profession of the mayor of {s}?"),
    "director>residence>capital": (("director", "residence", "capital"),
                                   "What is the capital of the country where the director of {s} lives?"),
    "founder>birthplace>city_country": (("founder", "birthplace", "city_country"),
                                        "In which country was the founder of {s} born?"),
}
DEFAULT_N = 2000
DEFAULT_EVAL_SHARE = 0.15
DEFAULT_SEED = 42
ENTITY_EVAL_SHARE = 0.2  # share of each name pool that goes to eval
PEOPLE_PER_SURNAME = 3
COUNTERFACTUAL_CHAIN_SHARE = 0.4  # multi-hop items whose real-world hop is changed
PASSAGE_WORDS = (60, 250)  # the length of a context, in words (ConFiQA's are ~60-200, a FollowRAG passage ~100)


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


def sentence(template: str, subject: str, value: str) -> str:
    """A template filled in, its first letter capitalised ("iron" opens a sentence as "Iron")."""
    article = "an" if value[:1].lower() in "aeiou" else "a"
    text = template.format(s=subject, o=value, a=article)
    return text[0].upper() + text[1:]


def fact_sentence(subject: str, relation: str, value: str, rng: random.Random | None = None) -> str:
    """A sentence stating `relation(subject) = value`: the first statement template, or a random one."""
    statements = RELATIONS[relation].statements
    return sentence(rng.choice(statements) if rng else statements[0], subject, value)


def _years(rng: random.Random, low: int, high: int) -> str:
    return str(rng.randint(low, high))


def _count(rng: random.Random, low: int, high: int) -> str:
    return f"{rng.randint(low, high):,}"


@dataclass
class World:
    """All entities of one split and their facts: real ones from facts.py, invented people, companies, films,
    clubs and towns with names from the split's share of each name pool."""

    facts: dict[tuple[str, str], str] = field(default_factory=dict)  # (subject, relation) -> value
    kinds: dict[str, list[str]] = field(default_factory=dict)  # kind -> entity names

    def add(self, kind: str, name: str, values: dict[str, str]) -> None:
        self.kinds.setdefault(kind, []).append(name)
        for relation, value in values.items():
            self.facts[(name, relation)] = value

    def kind_of(self, name: str) -> str:
        return next(kind for kind, names in self.kinds.items() if name in names)

    def relations_of(self, name: str) -> list[str]:
        return [r for r in RELATIONS if (name, r) in self.facts]

    @property
    def entities(self) -> list[str]:
        return sorted(name for names in self.kinds.values() for name in names)

    def values(self, relation: str) -> list[str]:
        """Every value of `relation` in this world (what a changed or disagreeing fact is drawn from)."""
        found = sorted({v for (_, r), v in self.facts.items() if r == relation})
        if relation == "orbits":
            found = sorted(set(found) | set(facts.PLANETS))
        if relation == "capital":
            found = sorted(set(found) | set(self.kinds["city"]))
        return found


def build_world(pools: dict[str, list[str]], rng: random.Random) -> World:
    """One split's world from its share of the name pools (see split_worlds)."""
    world = World()
    cities = []
    for country in pools["countries"]:
        capital, currency, language = facts.COUNTRIES[country]
        world.add("country", country, {"capital": capital, "currency": currency} | ({"language": language} if language else {}))
        for city in (capital, *facts.CITIES.get(country, ())):
            world.add("city", city, {"city_country": country})
            cities.append(city)
    for element in pools["elements"]:
        world.add("element", element, {"symbol": facts.ELEMENTS[element]})
    for book in pools["books"]:
        world.add("book", book, {"author": facts.BOOKS[book]})
    for moon in pools["moons"]:
        world.add("moon", moon, {"orbits": facts.MOONS[moon]})
    people = [f"{first} {last}" for last in pools["surnames"] for first in rng.sample(facts.FIRST_NAMES, PEOPLE_PER_SURNAME)]
    universities = [f"the University of {city}" for city in cities]
    awards = [f"the {last} Prize" for last in pools["surnames"]]
    companies = pools["companies"]
    for person in people:
        world.add("person", person, {
            "born_year": _years(rng, 1940, 2001), "birthplace": rng.choice(cities),
            "profession": rng.choice(facts.PROFESSIONS), "employer": rng.choice(companies),
            "university": rng.choice(universities), "residence": rng.choice(pools["countries"]),
            "award": rng.choice(awards)})
    for company in companies:
        world.add("company", company, {
            "founded": _years(rng, 1850, 2015), "founder": rng.choice(people), "headquarters": rng.choice(cities),
            "employees": _count(rng, 40, 90000), "industry": rng.choice(facts.INDUSTRIES), "ceo": rng.choice(people)})
    for adjective in pools["adjectives"]:
        for noun in rng.sample(pools["nouns"], 2):
            world.add("film", f"The {adjective} {noun}", {
                "release_year": _years(rng, 1955, 2023), "director": rng.choice(people),
                "composer": rng.choice(people), "setting": rng.choice(cities), "runtime": str(rng.randint(81, 172))})
        world.add("club", f"{adjective} {rng.choice(facts.CLUB_SUFFIXES)}", {
            "club_city": rng.choice(cities), "club_founded": _years(rng, 1870, 1990),
            "stadium": f"{rng.choice(pools['surnames'])} {rng.choice(facts.ARENA_WORDS)}",
            "coach": rng.choice(people), "titles": str(rng.randint(1, 23))})
    for town in pools["towns"]:
        world.add("town", town, {"town_country": rng.choice(pools["countries"]), "population": _count(rng, 1500, 480000),
                                 "river": rng.choice(pools["rivers"]), "mayor": rng.choice(people)})
    return world


def split_worlds(seed: int) -> tuple[World, World]:
    """Split every name pool between train and eval (ENTITY_EVAL_SHARE to eval) and build both worlds."""
    rng = random.Random(f"entity-split:{seed}")
    tables = {"countries": facts.COUNTRIES, "elements": facts.ELEMENTS, "books": facts.BOOKS, "moons": facts.MOONS,
              "surnames": facts.LAST_NAMES, "companies": facts.COMPANIES, "adjectives": facts.TITLE_ADJECTIVES,
              "nouns": facts.TITLE_NOUNS, "towns": facts.TOWNS, "rivers": facts.RIVERS}
    train, eval_ = {}, {}
    for name, table in tables.items():
        shuffled = sorted(table)
        rng.shuffle(shuffled)
        k = max(2, round(len(shuffled) * ENTITY_EVAL_SHARE))
        train[name], eval_[name] = sorted(shuffled[k:]), sorted(shuffled[:k])
    return (build_world(train, random.Random(f"world-train:{seed}")),
            build_world(eval_, random.Random(f"world-eval:{seed}")))


# --------------------------------------------------------------------------------------------------------------
# Paragraphs


def _reference(world: World, name: str) -> str:
    kind = world.kind_of(name)
    return name.split()[-1] if kind == "person" else REFERENCES[kind]


def _namesakes(world: World, people: Iterable[str]) -> set[str]:
    """The people of `world` who share a surname with another of `people`. A paragraph refers to its person by
    surname, so the passage it stands in must name none of that person's namesakes: with Oren and Marek Fernhill
    in one passage, "Fernhill was born in Lima" could be about either."""
    people = set(people)
    return {o for o in world.kinds["person"] for p in people if o != p and o.split()[-1] == p.split()[-1]}


def _named(text: str, name: str) -> bool:
    """`name` occurs in `text` as a whole word (as `_replace_everywhere` matches it)."""
    return name in text and re.search(rf"(?<![\w-]){re.escape(name)}(?![\w-])", text) is not None


def _names_kind(template: str, kind: str) -> bool:
    """Whether `template` names its subject's kind ("The club {s} dates back to {o}.", "{s} is a town in {o}.",
    "{s} is one of the elements ..."): with a reference for {s} it would say the kind twice ("The club the club
    dates back to 1913.", "The town is a town in Chile."), so such a sentence names its entity."""
    noun = REFERENCES.get(kind, "").removeprefix("the ")  # a person's reference, a surname, names no kind
    return bool(noun) and re.search(rf"\b{noun}s?\b", template, re.IGNORECASE) is not None


def paragraph(world: World, name: str, rng: random.Random, *, must: Sequence[str], size: int,
              avoid: set[str] = frozenset(), override: dict[str, str] | None = None) -> str:
    """A paragraph about `name`: its facts `must` (in that order of priority) and others up to `size` fact
    sentences, one or two sentences stating nothing, and zero to two facts about other entities of its kind.

    `override` replaces some of its facts' values (an inconsistent passage's disagreeing value); `avoid` lists
    names that no sentence about another entity may contain, as subject or value (so no distractor restates or
    contradicts the item's facts). The first sentence names the entity; later ones use its name or a reference
    ("the company", a person's surname), as prose does, but "the company" only where no other company was named
    since this one: it cannot be read as a look-alike's.
    """
    values = {r: world.facts[(name, r)] for r in world.relations_of(name)} | (override or {})
    others = [r for r in values if r not in must and values[r] not in avoid]
    rng.shuffle(others)
    chosen = [*must, *others][:max(size, len(must))]
    kind = world.kind_of(name)
    first, *rest = rng.sample(chosen, len(chosen))
    # ("fact", a relation of the entity) | ("filler", a template about it) | ("other", a look-alike's sentence)
    body: list[tuple[str, str]] = [("fact", relation) for relation in rest]
    body += [("filler", template) for template in rng.sample(FILLERS[kind], min(len(FILLERS[kind]), rng.randint(1, 3)))]
    # Not a namesake: a person is referred to by surname, and people share surnames.
    candidates = [o for o in world.kinds[kind] if o.split()[-1] != name.split()[-1] and o not in avoid]
    for other in rng.sample(candidates, min(len(candidates), rng.randint(1, 3))):
        relations = [r for r in world.relations_of(other) if world.facts[(other, r)] not in avoid]
        for relation in rng.sample(relations, min(len(relations), rng.randint(1, 2))):
            template = rng.choice(RELATIONS[relation].statements)
            statement = sentence(template, other, world.facts[(other, relation)])
            # A linker only before a sentence that opens with a name ("Meanwhile, Oslo ...", not "Meanwhile, Most").
            linker = rng.choice(LINKERS) if template.startswith("{s}") and other[0].isupper() else ""
            body.append(("other", linker + statement))
    rng.shuffle(body)
    sentences = [fact_sentence(name, first, values[first], rng)]
    antecedent = True  # the last entity of this kind that a sentence named is this one
    for what, text in body:
        if what == "other":
            sentences.append(text)
            antecedent = False
            continue
        # A reference ("the country") only while this entity is the last of its kind named: after a look-alike's
        # sentence it would read as the look-alike ("The currency of Latvia is the euro. The currency of the
        # country is the riel."). A surname is unambiguous: no look-alike shares it, and the item makers keep the
        # person's namesakes out of the passage's other paragraphs (`_namesakes`).
        may_refer = antecedent or kind == "person"
        refer = may_refer and rng.random() < 0.5
        template, value = (rng.choice(RELATIONS[text].statements), values[text]) if what == "fact" else (text, "")
        subject = _reference(world, name) if refer and not _names_kind(template, kind) else name
        sentences.append(sentence(template, subject, value))
        antecedent = antecedent or what == "fact" or "{s}" in text  # "Its cuisine ..." names no one
    return " ".join(sentences)


def _question(relation_or_chain: str, subject: str, rng: random.Random, template: str | None = None) -> str:
    text = (template or rng.choice(RELATIONS[relation_or_chain].questions)).format(s=subject)
    return text[0].upper() + text[1:]


def _problem(context: str, question: str, rng: random.Random) -> str:
    return f"<context>{context}</context>\n\n" + rng.choice(INSTRUCTIONS).format(q=question)


def _item(task: str, relation: str, entities: list[str], problem: str, answer: str) -> dict:
    return {"task": task, "relation": relation, "entities": entities, "problem": problem,
            "solution": f"<answer>{answer}</answer>"}


def _replace_everywhere(text: str, old: str, new: str) -> str:
    """`old` replaced by `new` wherever it occurs as a whole word (ConFiQA's consistent substitution)."""
    return re.sub(rf"(?<![\w-]){re.escape(old)}(?![\w-])", new, text)


def _straightforward(world: World, rng: random.Random) -> dict:
    kind = rng.choice(["person", "company", "film", "club", "town", "country", "city", "book", "moon", "element"])
    subject = rng.choice(world.kinds[kind])
    relation = rng.choice(world.relations_of(subject))
    answer = world.facts[(subject, relation)]
    context = paragraph(world, subject, rng, must=[relation], size=rng.randint(3, 7), avoid={subject, answer})
    if rng.random() < 0.6:
        context += _second_paragraph(world, kind, rng, avoid={subject, answer}, context=context)
    return _item("straightforward", relation, [subject], _problem(context, _question(relation, subject, rng), rng),
                 answer)


def _second_paragraph(world: World, kind: str, rng: random.Random, avoid: set[str], context: str) -> str:
    """A paragraph about an entity of another kind that names nothing in `avoid` (as a retrieved passage beside
    the relevant one, `context`), after a space or a line break; "" if the one drawn would name something in
    `avoid`. It names no namesake of a person `context` names, and is about none: a person's paragraph refers to
    it by surname, so a namesake on the other side would make the surname name two people."""
    avoid = avoid | _namesakes(world, [person for person in world.kinds["person"] if _named(context, person)])
    others = [o for o in world.kinds[rng.choice([k for k in world.kinds if k != kind])]
              if o not in avoid and any(world.facts[(o, r)] not in avoid for r in world.relations_of(o))]
    if not others:
        return ""
    other = rng.choice(others)
    text = paragraph(world, other, rng, must=[], size=rng.randint(2, 4), avoid=avoid)
    named = any(_named(text, word) for word in avoid)
    return "" if named else rng.choice((" ", "\n")) + text


def _change(world: World, subject: str, relation: str, rng: random.Random, context_words: str) -> str:
    """A value for a counterfactual `relation(subject)`: another value of the relation, not the real one and
    not already named in the passage."""
    real = world.facts[(subject, relation)]
    return rng.choice([v for v in world.values(relation) if v not in (real, subject) and v not in context_words])


def _counterfactual(world: World, rng: random.Random) -> dict:
    relation = rng.choice(REAL_WORLD_RELATIONS)
    kind = RELATIONS[relation].kind
    subject = rng.choice([s for s in world.kinds[kind] if (s, relation) in world.facts])
    real = world.facts[(subject, relation)]
    text = paragraph(world, subject, rng, must=[relation], size=rng.randint(2, 4), avoid={subject, real})
    if rng.random() < 0.8:
        text += _second_paragraph(world, kind, rng, avoid={subject, real}, context=text)
    for echo in rng.sample(RELATIONS[relation].echoes, rng.randint(0, len(RELATIONS[relation].echoes))):
        text += " " + sentence(echo, subject, real)
    changed = _change(world, subject, relation, rng, text)
    context = _replace_everywhere(text, real, changed)
    return _item("counterfactual", relation, [subject], _problem(context, _question(relation, subject, rng), rng),
                 changed)


def _multi_hop(world: World, rng: random.Random) -> dict:
    chain = rng.choice(list(CHAINS))
    relations, template = CHAINS[chain]
    first_kind = RELATIONS[relations[0]].kind
    # The people with a paragraph of their own: each is referred to by surname there, so no namesake of theirs may
    # stand in the passage (`_namesakes`), neither in the chain (Oren Fernhill works for a company that Marek
    # Fernhill runs) nor in another paragraph's facts or look-alikes.
    persons = set(world.kinds["person"])
    def people(nodes: list[str]) -> list[str]:
        return [node for node in nodes[:-1] if node in persons]
    # Subjects whose whole chain exists (not every country has a main language listed, ...).
    def path(start: str) -> list[str] | None:
        nodes = [start]
        for relation in relations:
            if (nodes[-1], relation) not in world.facts:
                return None
            nodes.append(world.facts[(nodes[-1], relation)])
        return nodes if len(set(nodes)) == len(nodes) and not _namesakes(world, people(nodes)) & set(nodes) else None
    starts = [s for s in world.kinds[first_kind] if path(s)]
    nodes = path(rng.choice(starts))
    answer = nodes[-1]
    avoid = set(nodes) | _namesakes(world, people(nodes))
    paragraphs = []
    for subject, relation in zip(nodes, relations):
        paragraphs.append(paragraph(world, subject, rng, must=[relation], size=rng.randint(3, 5), avoid=avoid))
    context = rng.choice((" ", "\n")).join(paragraphs)
    if relations[-1] in REAL_WORLD_RELATIONS and rng.random() < COUNTERFACTUAL_CHAIN_SHARE:
        changed = _change(world, nodes[-2], relations[-1], rng, context)
        context, answer = _replace_everywhere(context, answer, changed), changed
    return _item("multi_hop", chain, nodes[:-1], _problem(context, _question(chain, nodes[0], rng, template), rng),
                 answer)


def _inconsistent(world: World, rng: random.Random) -> dict:
    kind = rng.choice(["person", "company", "film", "club", "town", "country", "book"])
    subject = rng.choice(world.kinds[kind])
    relation = rng.choice(world.relations_of(subject))
    value = world.facts[(subject, relation)]
    num_passages = rng.choice((2, 3))
    others = rng.sample([v for v in world.values(relation) if v not in (value, subject)], num_passages - 1)
    values = [value, *others]
    rng.shuffle(values)
    trusted = rng.randrange(num_passages)
    passages = [f"Passage {number}: " + paragraph(world, subject, rng, must=[relation], size=rng.randint(2, 4),
                                                  avoid={subject, *values}, override={relation: passage_value})
                for number, passage_value in enumerate(values, start=1)]
    question = _question(relation, subject, rng)
    question = f"According to passage {trusted + 1}, {question[0].lower()}{question[1:]}"
    return _item("inconsistent", relation, [subject], _problem("\n".join(passages), question, rng), values[trusted])


_MAKERS = {"straightforward": _straightforward, "multi_hop": _multi_hop,
           "inconsistent": _inconsistent, "counterfactual": _counterfactual}


def context_words(row: dict) -> int:
    """Words in a row's context (what PASSAGE_WORDS bounds)."""
    return len(row["problem"].removeprefix("<context>").split("</context>")[0].split())


def _make(maker: Callable[[World, random.Random], dict], world: World, rng: random.Random) -> dict:
    """One item of `maker` whose context has PASSAGE_WORDS words (drawn again until it has)."""
    while True:
        row = maker(world, rng)
        if PASSAGE_WORDS[0] <= context_words(row) <= PASSAGE_WORDS[1]:
            return row


def _generate(world: World, n: int, split: str, seed: int) -> list[dict]:
    """n items, as even a share of the four tasks as n allows, shuffled, with ids "{split}-00000"..."""
    rng = random.Random(f"items-{split}:{seed}")
    tasks = [TASKS[i % len(TASKS)] for i in range(n)]
    rows = [_make(_MAKERS[task], world, rng) for task in tasks]
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


def bare_question(user_text: str) -> str:
    """The question of a prompt's instruction (the text after `</context>\n\n`), without the INSTRUCTIONS
    wording around it.

    >>> bare_question("Based on the passage, answer briefly: Who wrote Emma?")
    'Who wrote Emma?'
    """
    for instruction in sorted(set(INSTRUCTIONS), key=len, reverse=True):
        head, tail = instruction.split("{q}")
        if user_text.startswith(head) and user_text.endswith(tail) and len(user_text) > len(head) + len(tail):
            return user_text[len(head):len(user_text) - len(tail)]
    raise ValueError(f"not a question of synth's instructions: {user_text!r}")


def to_confiqa(rows: Iterable[dict]) -> list[dict]:
    """The counterfactual rows as ConFiQA records (what `--eval --suite confiqa` and `--suite fiqa` read).

    A counterfactual row states a changed real-world fact, which is ConFiQA's kind of item: `cf_context` is
    its context, `question` its bare question (the suite puts its own instruction around it) and `cf_answer` its
    answer; `orig_answer` is the real-world value (world_fact) and
    `orig_context` the context with the change undone wherever it was made (the changed value is never in the
    passage before the change, `_change`). The other task types have no competing "original" answer (the p_o
    and MR scores need one), so they are left out.
    """
    records = []
    for row in rows:
        if row.get("task") != "counterfactual":
            continue
        subject, relation = row["entities"][0], row["relation"]
        context, question = row["problem"].removeprefix("<context>").split("</context>\n\n", 1)
        changed = row["solution"].removeprefix("<answer>").removesuffix("</answer>")
        real = world_fact(relation, subject)
        if real is None or changed not in context:
            raise ValueError(f"row {row.get('id')}: no real-world value or no stated fact to swap")
        records.append({"id": row.get("id"), "question": bare_question(question), "cf_context": context, "cf_answer": changed,
                        "cf_alias": [], "orig_context": _replace_everywhere(context, changed, real),
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
