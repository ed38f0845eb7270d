"""The tables of the synthetic data (`python -m synthetic.synth`), loaded once from `facts.json`: the facts and
name pools below, and `TEMPLATES`, the sentence templates synth.py writes its passages with.

* Real-world facts (capitals, currencies, main languages, cities, chemical symbols, authors, moons): only
  well-settled ones, since counterfactual items change exactly these. A contested main language is `null`;
  countries with a disputed capital or currency or written with "the", and city names that are also cities
  elsewhere, are left out, so each such fact has one true value.
* Invented names (people FIRST + LAST, companies, films "The ADJECTIVE NOUN", towns, rivers, stadiums) that no
  model can know, so the answer can only come from the context. Professions, industries, club suffixes and arena
  words are values that both splits use; `synth.split_worlds` divides every other pool between train and eval.

The order of every table is part of the data: the draws follow it, so reordering one changes the generated files.
"""

from __future__ import annotations

import json
from pathlib import Path

_DATA = json.loads(Path(__file__).with_name("facts.json").read_text(encoding="utf-8"))
_FACTS = _DATA["facts"]
TEMPLATES: dict = _DATA["templates"]

# country: (capital, currency as a lowercase noun ("the euro"), main language or None).
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
