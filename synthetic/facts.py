"""The tables of the synthetic faithfulness data (`python -m synthetic.synth`), loaded once from `facts.json`.

`facts.json` holds two sections. `facts`: the fact tables and name pools below. `templates`: the sentence
templates `synth.py` writes its passages with (`TEMPLATES`: relations, references, fillers, linkers,
instructions, chains). Two kinds of facts:

* Real-world facts (capitals, currencies, main languages, cities, chemical symbols, authors, moons): only
  well-settled ones, since counterfactual items change exactly these. A country whose main language is contested
  has `null` for it; countries with a disputed or changing capital or currency, or written with "the" (so that a
  short answer is just the name), are left out; a city whose name is also a city elsewhere is left out, so
  "X is a city in K" has one true K. Currencies are lowercase common nouns, elements lowercase names.
* Invented names (people, companies, films, towns, rivers, stadiums) that no model can know, so the answer can
  only come from the context. A person is FIRST + LAST, a film "The ADJECTIVE NOUN"; professions, industries,
  club suffixes and arena words are values that both splits use.

`synth.split_worlds` divides the entities (countries with their cities, elements, books, moons, surnames,
companies, title nouns and adjectives, towns, rivers) between train and eval, so no eval question is about an
entity seen in training and train and eval people never share a surname.
"""

from __future__ import annotations

import json
from pathlib import Path

_DATA = json.loads(Path(__file__).with_name("facts.json").read_text(encoding="utf-8"))
_FACTS = _DATA["facts"]
TEMPLATES: dict = _DATA["templates"]

# country: (capital, currency, main language or None).
COUNTRIES: dict[str, tuple[str, str, str | None]] = {name: tuple(row) for name, row in _FACTS["countries"].items()}
# country: its non-capital cities.
CITIES: dict[str, tuple[str, ...]] = {name: tuple(cities) for name, cities in _FACTS["cities"].items()}
ELEMENTS: dict[str, str] = _FACTS["elements"]  # element: symbol
BOOKS: dict[str, str] = _FACTS["books"]  # book: author
MOONS: dict[str, str] = _FACTS["moons"]  # moon: the planet it orbits
PLANETS: tuple[str, ...] = tuple(_FACTS["planets"])
FIRST_NAMES: tuple[str, ...] = tuple(_FACTS["first_names"])
LAST_NAMES: tuple[str, ...] = tuple(_FACTS["last_names"])
COMPANIES: tuple[str, ...] = tuple(_FACTS["companies"])
PROFESSIONS: tuple[str, ...] = tuple(_FACTS["professions"])
TITLE_ADJECTIVES: tuple[str, ...] = tuple(_FACTS["title_adjectives"])
TITLE_NOUNS: tuple[str, ...] = tuple(_FACTS["title_nouns"])
TOWNS: tuple[str, ...] = tuple(_FACTS["towns"])
RIVERS: tuple[str, ...] = tuple(_FACTS["rivers"])
INDUSTRIES: tuple[str, ...] = tuple(_FACTS["industries"])
CLUB_SUFFIXES: tuple[str, ...] = tuple(_FACTS["club_suffixes"])
ARENA_WORDS: tuple[str, ...] = tuple(_FACTS["arena_words"])
