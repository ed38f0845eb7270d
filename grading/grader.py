r"""When are two answers the same? Answer equivalence for CANOE's accuracy reward, graded under a hard deadline.

1. Two answer spans are equivalent if they are the same string or math-verify proves them equal,
   `verify(gold, pred)`, gold first (the original's `accuracy_reward`). Only spans that read as math reach
   math-verify, parsed whole (`reads_as_text` has one rule per way math-verify 0.9.0 makes different texts equal);
   plain numbers, fractions, and sets and intervals of them are compared exactly here (`settle_locally`).
2. `MathGrader`, the front end for this grader and `r1_grader.py`, grades the rest in worker processes
   (`deadline.DeadlinePool`) that never import torch. math-verify's own signal-based timeouts are off (`None`):
   they fail outside the main thread."""

from __future__ import annotations

import atexit
import functools
import itertools
import logging
import re
import threading
import warnings
from fractions import Fraction

from latex2sympy2_extended.latex2sympy2 import NormalizationConfig
from math_verify import LatexExtractionConfig, parse, verify

from grading.deadline import DeadlinePool


# ============================================================================ 1. CANOE accuracy: text or math?

MAX_MATH_CHARS = 512  # longer spans are compared as strings: no short answer is this long, and parsing cost grows fast

# LaTeX commands math-verify understands and that mean the same thing to a reader. Anything else (`\mbox`,
# `\operatorname`, a typo) makes the span text: math-verify would silently drop the command and keep its argument.
_MATH_COMMANDS = frozenset(
    """frac dfrac tfrac cfrac sqrt cdot times div pm mp le ge leq geq lt gt neq ne infty pi circ left right
    big Big bigl bigr Bigl Bigr text textbf mathrm mathbf displaystyle begin end cup cap setminus emptyset
    varnothing sin cos tan cot sec csc arcsin arccos arctan sinh cosh tanh log ln exp alpha beta gamma delta
    epsilon varepsilon zeta eta theta vartheta iota kappa lambda mu nu xi rho sigma tau upsilon phi varphi chi
    psi omega Gamma Delta Theta Lambda Xi Pi Sigma Phi Psi Omega ldots cdots dots""".split()
)
_MATRIX_ENV = re.compile(r"\\(?:begin|end)\{[pbvBV]?matrix\}")
_COMMAND = re.compile(r"\\([A-Za-z]+)")
_MATH_SIGN = re.compile(r"[0-9\\+\-*/^=<>()\[\]{}|!_%]")
_LETTER_RUN = re.compile(r"[^\W\d_]{2,}")  # two or more letters in a row: a word, never a product of symbols
_LETTER = re.compile(r"[^\W\d_]")
_ASSIGNMENT_LHS = re.compile(r"^\s*[^\W\d_]\s*=(?!=)")  # `x = 5`: the variable named is not part of the value
_TEXT_PATTERNS = re.compile(  # searched in the span with every command name replaced by "#"
    r"[^\W\d_]\d"  # letter then digit: `1e5`, `A1`, codes
    r"|\d(?:\s|\\[ ,;:!])+\.?\d"  # numbers split by spaces: `3 4`, `1 000` (math-verify adds them)
    r"|:"  # times, ratios, scores: `10:30`, `2:1`
    r"|['\"`]"  # primes and quotes, which math-verify deletes
    r"|\d\s*[-/.]\s*\d+\s*[-/.]\s*\d"  # dates and versions: `2001-02-03`, `3/4/2020`, `1.2.3`
    r"|(?<![\w^.{}_\\#])\d+\s*-\s*\d+(?![\w.^\\({#])"  # integer ranges: `1914-1918` (but x^2-1, 3-2\sqrt{2})
    r"|(?<![\d.,])0\d"  # leading zeros: `007`, `02`
    r"|(?<!\\)\$"  # prose mixing text and inline math
)
# Shapes no short answer has, on which math-verify spends seconds to hours (latex2sympy evaluates the tower):
_POWER_TOWER = re.compile(r"\d\s*\^\s*\{?\s*[-+]?\d+\s*\^")  # `9^{9^{9}}`, `10^{10^{10}}`
MAX_NESTING = 8  # bracket depth


def matching_brace(text: str, open_at: int) -> int | None:
    """Index of the `}` closing the `{` at `open_at`, or None if unbalanced."""
    depths = itertools.accumulate((char == "{") - (char == "}") for char in text[open_at:])
    return next((open_at + i for i, depth in enumerate(depths) if depth == 0), None)


def bracket_depths(text: str) -> list[int]:
    """The bracket depth after each character of `text`: `([{` open, `)]}` close."""
    return list(itertools.accumulate((char in "([{") - (char in ")]}") for char in text))


def split_top_level(text: str) -> list[str]:
    """Split at commas outside brackets; `(1,2),(3,4)` -> ['(1,2)', '(3,4)']."""
    cuts = [i for i, (char, depth) in enumerate(zip(text, bracket_depths(text))) if char == "," and depth == 0]
    return [text[start + 1 : end] for start, end in zip([-1, *cuts], [*cuts, len(text)])]


def as_sequence(text: str) -> tuple[str, list[str]]:
    """(bracket pair, elements) for tuples and intervals like `(4,5]`; ('', elements) otherwise."""
    depths = bracket_depths(text)
    # enclosed: the bracket that opens the text closes at its end (`(4,5]`, not `(1,2),(3,4)`)
    if len(text) > 2 and text[0] in "([" and text[-1] in ")]" and depths[-1] == 0 and 0 not in depths[:-1]:
        inner = split_top_level(text[1:-1])
        if len(inner) > 1:
            return text[0] + text[-1], inner
    return "", split_top_level(text)


def _without_commands(span: str) -> str:
    # Command and environment names are not words (`\frac`). "#" keeps neighbours apart without looking like a
    # space, a letter or a digit: `\sqrt2` is not "t2", and `2\sqrt 2` is not "2 2".
    return _COMMAND.sub("#", _MATRIX_ENV.sub("#", span))


def only_known_commands(span: str) -> bool:
    """Whether every LaTeX command in `span` is one of `_MATH_COMMANDS` (matrix environments allowed)."""
    return all(name in _MATH_COMMANDS for name in _COMMAND.findall(_MATRIX_ENV.sub(" ", span)))


def has_word(span: str) -> bool:
    """Whether `span`, LaTeX command names aside, has two letters in a row: a word, never a product of symbols."""
    return bool(_LETTER_RUN.search(_without_commands(span)))


def prepare_span(span: str) -> str:
    """The form of an answer span that math-verify would see: stripped, without one pair of math delimiters or
    one `\\boxed{...}` enclosing it whole."""
    span = span.strip()
    for left, right in (("$$", "$$"), ("$", "$"), ("\\(", "\\)"), ("\\[", "\\]")):
        if len(span) >= len(left) + len(right) and span.startswith(left) and span.endswith(right):
            return span[len(left) : len(span) - len(right)].strip()
    if span.startswith("\\boxed{") and matching_brace(span, len("\\boxed")) == len(span) - 1:
        return span[len("\\boxed{") : -1].strip()
    return span


def reads_as_text(span: str) -> bool:
    """True if `span` (already through `prepare_span`) must be compared as a string, never symbolically.

    Differs from CANOE (docs/differences.md, D2): the original gives every span to math-verify.

    >>> [reads_as_text(s) for s in ["Paris", "ab", "42", "2\\\\sqrt{2}", "1914-1918", "\\\\mbox{5}", "x^2-1"]]
    [True, True, False, False, True, True, False]
    """
    if len(span) > MAX_MATH_CHARS or not _MATH_SIGN.search(span) or not only_known_commands(span):
        return True  # plainly words (or empty: no digit, no LaTeX, no operator), or LaTeX math-verify would misread
    bare = _without_commands(span)
    if _LETTER_RUN.search(bare) or _TEXT_PATTERNS.search(bare):
        return True
    return bool(_POWER_TOWER.search(span)) or max(bracket_depths(span)) > MAX_NESTING


def _letters(span: str) -> frozenset[str]:
    return frozenset(_LETTER.findall(_without_commands(_ASSIGNMENT_LHS.sub("", span))))


def needs_math_verify(gold: str, pred: str) -> bool:
    """Whether two prepared, different spans should go to math-verify at all: both read as math and use the same
    letters, case-sensitively (math-verify lower-cases symbols: `A+1` would equal `a+1`)."""
    return not reads_as_text(gold) and not reads_as_text(pred) and _letters(gold) == _letters(pred)


_PLAIN_NUMBER = re.compile(r"[+-]?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?|[+-]?\.\d+")  # 42, -0.5, 1,000.25
_PLAIN_FRACTION = re.compile(r"([+-]?)(?:\\[dt]?frac\{(\d+)\}\{(\d+)\}|(\d+)\s*/\s*(\d+))")  # \frac{1}{2}, -1/2


def _rational(text: str) -> Fraction | None:
    """The exact value of a plain number or fraction, else None."""
    text = text.strip()
    if _PLAIN_NUMBER.fullmatch(text):
        return Fraction(text.replace(",", ""))
    match = _PLAIN_FRACTION.fullmatch(text)
    if match is None:
        return None
    numerator, denominator = int(match[1] + (match[2] or match[4])), int(match[3] or match[5])
    return None if denominator == 0 else Fraction(numerator, denominator)


def _rational_structure(span: str) -> tuple[str, object] | None:
    """("number", value), ("set", values) or ("pair", (brackets, a, b)) for spans made only of plain numbers,
    read as math-verify reads them: `\\{..\\}` and bare lists are sets; `(a, b]` is an interval if a < b and a
    tuple otherwise, equal to another pair iff brackets and elements are. Anything else: None."""
    value = _rational(span)
    if value is not None:
        return "number", value
    is_set = span.startswith("\\{") and span.endswith("\\}")
    brackets, items = ("", split_top_level(span[2:-2])) if is_set else as_sequence(span)
    values = [_rational(item) for item in items]
    if len(values) < 2 or None in values:
        return None
    if not brackets:
        return "set", frozenset(values)
    return ("pair", (brackets, *values)) if len(values) == 2 else None


def settle_locally(gold: str, pred: str) -> bool | None:
    """The verdict for two prepared spans when it needs no math-verify, else None.

    Identical spans are equal; text (see `reads_as_text`) equals only itself. Plain numbers and fractions
    (`1,000`, `-0.50`, `\\frac{3}{4}`, `3/4`), and sets and intervals of them, are compared here, exactly.

    >>> settle_locally("\\\\frac{1}{2}", "0.5"), settle_locally("(1, 2]", "(1,2)"), settle_locally("x+1", "1+x")
    (True, False, None)
    """
    if gold == pred:
        return True
    if not needs_math_verify(gold, pred):
        return False
    gold_structure, pred_structure = _rational_structure(gold), _rational_structure(pred)
    if gold_structure is None or pred_structure is None or gold_structure[0] != pred_structure[0]:
        return None
    return gold_structure == pred_structure


# boxed_match_priority=-1: a \boxed inside a longer span must not be graded alone. units=False: math-verify would
# delete `m`, `s`, ... and `5 m` would equal `5 s`.
_WHOLE_SPAN_LATEX = LatexExtractionConfig(boxed_match_priority=-1, normalization_config=NormalizationConfig(
    basic_latex=True, units=False, malformed_operators=True, nits=True, boxed="none", equations=False))


@functools.lru_cache(maxsize=4096)  # per worker: a group's gold is parsed once, not once per completion
def _math_verify_whole(span: str) -> list:
    """Parse the whole span as one LaTeX expression with math-verify; [] if it does not parse as a whole."""
    # `$...$` makes the whole span the only candidate, and first_match stops math-verify from falling back to a
    # smaller piece of it when the whole does not parse (`2\sqrt{2}` would equal 2).
    return parse(f"${span}$", extraction_config=[_WHOLE_SPAN_LATEX], fallback_mode="no_fallback",
                 extraction_mode="first_match", parsing_timeout=None)  # type: ignore[arg-type]


def canoe_math_equal(gold: str, pred: str) -> bool:
    """Worker job: math-verify equivalence of two prepared spans that passed `needs_math_verify`."""
    # Gold first, `verify(gold, pred)`: the order math-verify's asymmetric rules expect (rewards.accuracy_reward).
    gold_parsed, pred_parsed = _math_verify_whole(gold), _math_verify_whole(pred)
    return bool(gold_parsed and pred_parsed and verify(gold_parsed, pred_parsed, timeout_seconds=None))


# ============================================================================ 2. MathGrader: parallel, deadline

WORKER_JOBS = {"canoe": canoe_math_equal}  # what grading workers may run from this module
# The modules a grading worker imports (running their WARM_UP calls, taking their WORKER_JOBS): CANOE's rewards need
# this one only; R1-Zero's grader (which imports this module, so it is named, not imported) only on request.
WORKER_MODULES = ("grading.grader",)
R1_WORKER_MODULES = (*WORKER_MODULES, "grading.r1_grader")
# Run in each worker before it reports ready, so that first-use costs (math-verify compiling its regexes, sympy
# importing its polynomial code) do not count against a pair's deadline.
WARM_UP_PAIRS = [("\\frac{1}{2}", "0.5"), ("x^2-1", "(x-1)(x+1)"), ("\\sqrt{8}", "2\\sqrt{2}"), ("120", "5!"),
                 ("(1,2)", "[1,2)")]
WARM_UP = [("canoe", pair) for pair in WARM_UP_PAIRS]


# math-verify warns once per process that its own timeout is off; that is deliberate here.
logging.getLogger("math_verify").setLevel(logging.ERROR)


class MathGrader:
    """Grade answer-span pairs in parallel worker processes, each pair under a hard deadline.

    Usage: `with MathGrader(workers=2, deadline_s=1.0) as grader: grader.equivalent_batch(golds, preds)`.
    Workers start in the background on construction and persist until `close()`. Cumulative counters:
      timeouts -- pairs that hit the deadline or crashed their worker (identical pairs of a batch count once)
      errors   -- pairs whose grading raised in the worker; the first one is also a RuntimeWarning
      slowest_s -- the longest time any single pair took, timeouts included
    Either way the pair falls back to exact string match.
    """

    def __init__(self, workers: int = 2, deadline_s: float = 1.0, r1: bool = False):
        self.r1 = r1  # the workers also import and warm r1_grader, for `r1_equivalent`
        self._pool = DeadlinePool(R1_WORKER_MODULES if r1 else WORKER_MODULES, workers=workers, deadline_s=deadline_s)
        self.timeouts, self.errors, self.slowest_s = 0, 0, 0.0

    def equivalent_batch(self, golds: list[str], preds: list[str]) -> list[bool]:
        """One bool per (gold, pred) pair of answer spans: same string, or math-verify proves them equal."""
        if len(golds) != len(preds):
            raise ValueError(f"{len(golds)} golds but {len(preds)} preds")
        pairs = [(prepare_span(gold), prepare_span(pred)) if isinstance(gold, str) and isinstance(pred, str) else None
                 for gold, pred in zip(golds, preds)]
        verdicts = [False if pair is None else settle_locally(*pair) for pair in pairs]
        to_grade = list(dict.fromkeys(pair for pair, verdict in zip(pairs, verdicts) if verdict is None))  # each once
        # identical spans never get here, so the string-match fallback of a timed-out pair is always False
        graded = dict(zip(to_grade, self._run("canoe", to_grade, [False] * len(to_grade))))
        return [graded[pair] if verdict is None else verdict for pair, verdict in zip(pairs, verdicts)]

    def wait_ready(self) -> None:
        """Block until all workers have started; optional, e.g. before timing."""
        self._pool.wait_ready()

    def r1_equivalent(self, gold: str, pred: str, fast: bool) -> bool:
        """The worker part of `r1_grader.r1_grade`; False on timeout. Needs a grader made with `r1=True`."""
        if not self.r1:
            raise ValueError("this MathGrader's workers do not load r1_grader: make it with MathGrader(r1=True)")
        return self._run("r1", [(gold, pred, fast)], [False])[0]

    def _run(self, job: str, calls: list[tuple], fallbacks: list[bool]) -> list:
        """Run a worker job on each argument tuple; a timeout, crash or error gives that call's fallback."""
        if not calls:
            return []
        results = []
        for fallback, outcome in zip(fallbacks, self._pool.run([(job, args) for args in calls])):
            self.slowest_s = max(self.slowest_s, outcome.seconds)
            results.append(outcome.value if outcome.status == "ok" else fallback)
            if outcome.status == "error":
                self.errors += 1
                if self.errors == 1:  # once per grader: the trainer logs the count every step (reward/grader_errors)
                    warnings.warn(f"a grading worker raised ({outcome.value}); that pair fell back to string match, "
                                  f"and such errors are counted in MathGrader.errors from now on", RuntimeWarning,
                                  stacklevel=3)
            elif outcome.status != "ok":
                self.timeouts += 1
        return results

    def close(self) -> None:
        self._pool.close()

    def __enter__(self) -> MathGrader:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


_default_grader: MathGrader | None = None
_default_lock = threading.Lock()


def default_grader() -> MathGrader:
    """The process-wide MathGrader (2 workers, 1 s deadline, R1-Zero's job too), made on first use, closed at exit.
    Rewards use it when no `grader=` is passed."""
    global _default_grader
    with _default_lock:
        if _default_grader is None:
            _default_grader = MathGrader(r1=True)
            atexit.register(_default_grader.close)
        return _default_grader
