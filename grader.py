r"""When are two answers the same? Answer equivalence for the rewards, graded under a hard deadline.

Three parts, one concern (deciding equivalence); `rewards.py` turns the verdicts into rewards.

1. CANOE accuracy (SPEC section 3, `accuracy_reward`; seed 000): two answer spans are equivalent if they are the
   same string, or if they are mathematically equal, decided by math-verify as `verify(gold, pred)`, gold first.
   Symbolic checking must never make two different texts equal, so math-verify only sees spans that read as
   math; everything else is decided by exact string match. `reads_as_text` holds the rules, each for a failure
   seen with math-verify 0.9.0 (shared/ENVIRONMENT.md and our own trials): it turns letter runs into products
   (`no` == `on`, `ab` == `ba`), lower-cases symbols (`A+1` == `a+1`), adds numbers split by a space (`3 4` == 7),
   reads dates and ranges as subtraction (`1914-1918` == `1939-1943`), times and scores as division
   (`10:30` == 1/3), drops primes and quotes, keeps the argument of commands it does not know (`\mbox{5}` == 5),
   and spends seconds to hours on power towers and deep nesting. Math-looking spans are parsed whole (LaTeX, with
   or without `$`): a span that does not parse as one expression never passes (`2\sqrt{2}` vs `2`).
   Plain numbers and fractions, and sets and intervals of them, are compared exactly in the caller's process
   (`settle_locally`), without math-verify; that is where most of the speed comes from, and it is stricter than
   math-verify, which rounds floats to 6 decimal places.
   Deliberate difference from the original CANOE code: it parsed the whole completion (a number inside
   `<think>` could score) and called `verify(pred, gold)`; we grade only the answer spans and pass gold first.

2. R1-Zero grading (SPEC section 3, `r1_zero_reward_fn` step 5; seed 002), written from the description:
   MATH-style normalisation (`normalize_math_answer`) compared as strings, then exact sympy equivalence built by
   our own small parser (`sympy_equivalent`: no `eval`, no numeric tolerance, decimals are exact rationals, so
   integers never equal non-integers; tuples and intervals compare element-wise with matching brackets), then
   with fast=False math-verify (`r1_latex_equal`). Sympy and math-verify run in the workers, under the deadline.
   Deliberate differences from the well-known implementation, which the worked cases mark as wrong: there
   `\sqrt[3]{2}` equals `\sqrt{2}` (the root's index is ignored) and `\frac{1+3}{2}` equals 2.5 (the brackets
   are lost: 1+3/2); our parser keeps both. `\fbox` is read as a box like `\boxed` (worked case `fbox`), while
   `\mbox` is text, not math (worked case `mbox`).

3. `MathGrader`: the parallel, hard-deadline front end the trainer uses. The cheap text/math decision runs in the
   caller's process; only math-looking pairs travel to worker processes (`deadline.DeadlinePool`), which import
   sympy and math-verify but never torch. A pair that overruns the deadline or crashes its worker falls back to
   exact string match and is counted in `MathGrader.timeouts`.

Math-verify's own signal-based timeouts are switched off (`parsing_timeout=None`, `timeout_seconds=None`):
they fail outside the main thread, and the worker deadline replaces them.
"""

from __future__ import annotations

import atexit
import functools
import logging
import re
import threading
from fractions import Fraction

import sympy
from latex2sympy2_extended.latex2sympy2 import NormalizationConfig
from math_verify import ExprExtractionConfig, LatexExtractionConfig, parse, verify

from deadline import DeadlinePool

logger = logging.getLogger(__name__)

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
MAX_NESTING = 8  # bracket depth; 300 nested parentheses take math-verify ~6 s


def _strip_outer(span: str) -> str:
    """Remove one pair of math delimiters or one `\\boxed{...}` enclosing the whole span."""
    for left, right in (("$$", "$$"), ("$", "$"), ("\\(", "\\)"), ("\\[", "\\]")):
        if len(span) >= len(left) + len(right) and span.startswith(left) and span.endswith(right):
            return span[len(left) : len(span) - len(right)].strip()
    if span.startswith("\\boxed{") and _matching_brace(span, len("\\boxed")) == len(span) - 1:
        return span[len("\\boxed{") : -1].strip()
    return span


def _matching_brace(text: str, open_at: int) -> int | None:
    """Index of the `}` closing the `{` at `open_at`, or None if unbalanced."""
    depth = 0
    for i in range(open_at, len(text)):
        if text[i] == "{":
            depth += 1
        elif text[i] == "}":
            depth -= 1
            if depth == 0:
                return i
    return None


def _without_commands(span: str) -> str:
    # Command names are not words (`\frac`), environment names neither. "#" keeps neighbours apart without
    # looking like a space, a letter or a digit: `\sqrt2` is not "t2", and `2\sqrt 2` is not "2 2".
    return _COMMAND.sub("#", _MATRIX_ENV.sub("#", span))


def prepare_span(span: str) -> str:
    """The form of an answer span that math-verify would see (outer delimiters removed)."""
    return _strip_outer(span.strip())


def reads_as_text(span: str) -> bool:
    """True if `span` (already through `prepare_span`) must be compared as a string, never symbolically.

    >>> [reads_as_text(s) for s in ["Paris", "ab", "42", "2\\\\sqrt{2}", "1914-1918", "\\\\mbox{5}", "x^2-1"]]
    [True, True, False, False, True, True, False]
    """
    if len(span) > MAX_MATH_CHARS or not _MATH_SIGN.search(span):
        return True  # plainly words (or empty): no digit, no LaTeX, no operator
    if any(name not in _MATH_COMMANDS for name in _COMMAND.findall(_MATRIX_ENV.sub(" ", span))):
        return True
    bare = _without_commands(span)
    if _LETTER_RUN.search(bare) or _TEXT_PATTERNS.search(bare):
        return True
    return bool(_POWER_TOWER.search(span)) or _nesting_depth(span) > MAX_NESTING


def _nesting_depth(text: str) -> int:
    depth = deepest = 0
    for char in text:
        if char in "([{":
            depth += 1
            deepest = max(deepest, depth)
        elif char in ")]}":
            depth -= 1
    return deepest


def _letters(span: str) -> frozenset[str]:
    return frozenset(_LETTER.findall(_without_commands(_ASSIGNMENT_LHS.sub("", span))))


def needs_math_verify(gold: str, pred: str) -> bool:
    """Whether two prepared, different spans should go to math-verify at all.

    Both must read as math and use the same letters, case-sensitively: math-verify lower-cases symbols, so
    without this `A+1` would equal `a+1`.
    """
    return not reads_as_text(gold) and not reads_as_text(pred) and _letters(gold) == _letters(pred)


_PLAIN_NUMBER = re.compile(r"[+-]?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?|[+-]?\.\d+")  # 42, -0.5, 1,000.25
_PLAIN_FRACTION = re.compile(r"([+-]?)\\[dt]?frac\{(\d+)\}\{(\d+)\}|([+-]?\d+)\s*/\s*(\d+)")  # \frac{1}{2}, 1/2


def _rational(text: str) -> Fraction | None:
    """The exact value of a plain number or fraction, else None."""
    text = text.strip()
    if _PLAIN_NUMBER.fullmatch(text):
        return Fraction(text.replace(",", ""))
    match = _PLAIN_FRACTION.fullmatch(text)
    if match is None:
        return None
    if match.group(2) is not None:
        numerator, denominator = int(match.group(2)), int(match.group(3))
        numerator = -numerator if match.group(1) == "-" else numerator
    else:
        numerator, denominator = int(match.group(4)), int(match.group(5))
    return None if denominator == 0 else Fraction(numerator, denominator)


def _rational_structure(span: str) -> tuple[str, object] | None:
    """("number", value), ("set", values) or ("pair", (brackets, a, b)) for spans made only of plain numbers,
    read as math-verify reads them: `\\{..\\}` and bare lists are sets; `(a, b]` is an interval if a < b and a
    tuple otherwise, and either way two such pairs are equal iff their brackets and elements are. Anything else
    (longer tuples, nesting, symbols): None."""
    value = _rational(span)
    if value is not None:
        return "number", value
    if span.startswith("\\{") and span.endswith("\\}"):
        kind, inner = "set", span[2:-2]
    elif len(span) > 2 and span[0] in "([" and span[-1] in ")]":
        kind, inner = "pair", span[1:-1]
    else:
        kind, inner = "set", span
    values = [_rational(part) for part in inner.split(",")]
    if len(values) < 2 or None in values:
        return None
    if kind == "set":
        return "set", frozenset(values)
    return ("pair", (span[0] + span[-1], *values)) if len(values) == 2 else None


def settle_locally(gold: str, pred: str) -> bool | None:
    """The verdict for two prepared spans when it needs no math-verify, else None.

    Identical spans are equal; text (see `reads_as_text`) equals only itself. Plain numbers and fractions
    (`1,000`, `-0.50`, `\\frac{3}{4}`, `3/4`), and sets and intervals made of them, are compared here, exactly,
    in microseconds; math-verify needs milliseconds, and ~20 ms for a set or an interval. Exactness is stricter
    than math-verify, which rounds floats to 6 places (it calls 0.1234561 and 0.1234564 equal).

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


_WHOLE_SPAN_LATEX = LatexExtractionConfig(
    boxed_match_priority=-1,  # a \boxed inside a longer span must not be graded alone
    normalization_config=NormalizationConfig(
        basic_latex=True, units=False, malformed_operators=True, nits=True, boxed="none", equations=False
    ),  # units=False: math-verify would delete `m`, `s`, ... and `5 m` would equal `5 s`
)


@functools.lru_cache(maxsize=4096)  # per worker: a group's gold is parsed once, not once per completion
def _math_verify_whole(span: str) -> list:
    """Parse the whole span as one LaTeX expression with math-verify; [] if it does not parse as a whole."""
    # `$...$` makes the whole span the only candidate; first_match stops math-verify from falling back to a
    # smaller piece of it when the whole does not parse (the partial parse that made `2\sqrt{2}` equal 2).
    return parse(
        f"${span}$",
        extraction_config=[_WHOLE_SPAN_LATEX],
        fallback_mode="no_fallback",
        extraction_mode="first_match",
        parsing_timeout=None,  # type: ignore[arg-type]  # the worker deadline replaces the signal-based timeout
    )


def canoe_math_equal(gold: str, pred: str) -> bool:
    """Worker job: math-verify equivalence of two prepared spans that passed `needs_math_verify`."""
    gold_parsed, pred_parsed = _math_verify_whole(gold), _math_verify_whole(pred)
    return bool(gold_parsed and pred_parsed and verify(gold_parsed, pred_parsed, timeout_seconds=None))


# ============================================================================ 2. R1-Zero: normalise, then sympy

MAX_R1_CHARS = 1000  # longer answers are compared as stripped strings: normalising them is not linear-time

# Unit words removed after a number (seed 002: "5 apples" is 5). Dollars are deliberately absent (worked case
# `units_dollars`): `\$` is the currency sign we drop.
_UNIT_WORDS = (
    "sq m|square meters?|square feet|cm|mm|km|m|meters?|metres?|centimeters?|kilometers?|inch(?:es)?|feet|foot|ft|"
    "yards?|miles?|mph|kg|g|grams?|kilograms?|pounds?|lbs?|liters?|litres?|ml|seconds?|sec|s|minutes?|mins?|"
    "hours?|hrs?|days?|weeks?|months?|years?|degrees?|deg|units?|apples?|people|students?|cents?"
)
_UNITS_AT_END = re.compile(rf"(?<=[\d}}])\s*(?:{_UNIT_WORDS})\s*\.?$")
_TEXT_WRAPPER = re.compile(r"\\(?:text|textbf|textrm|mathrm)\s*\{([^{}]*)\}")  # not \mbox (worked case `mbox`)
_DEGREES = re.compile(r"\^\s*\{?\s*\\circ\s*\}?|\\circ|°")
_PERCENT = re.compile(r"\\%|%|\s*\bpercent\b")
_LEFT_RIGHT = re.compile(r"\\(?:left|right)(?![A-Za-z])")
_SPACING = re.compile(r"(?<!\\)\\[,;:! ]|\\quad|\\qquad")  # not the `\\` row break of a matrix
_VARIABLE_PREFIX = re.compile(r"^[A-Za-z]\w{0,2}\s*=(?!=)\s*")  # `x = 5`, `xy = 5`
_MIXED_NUMBER = re.compile(r"^(-?)(\d+)\s+(\d+)\s*/\s*(\d+)$")  # `7 3/4`
_THOUSANDS = re.compile(r"(?<![\d.,])\d{1,3}(?:,\d{3})+(?![\d,])")
_FRAC_SHORT = re.compile(r"\\frac\s*(\d)\s*(\d)|\\frac\s*(\d)\s*(?=\{)|(\\frac\{[^{}]*\})\s*(\d)")
_SQRT_SHORT = re.compile(r"\\sqrt\s*([0-9a-zA-Z])")
_LEADING_DOT = re.compile(r"(?<![\d}])\.(\d)")
_LETTER_CHOICE = re.compile(r"^\(([a-z])\)$")


def _short_frac(match: re.Match) -> str:
    if match.group(1):
        return f"\\frac{{{match.group(1)}}}{{{match.group(2)}}}"
    if match.group(3):
        return f"\\frac{{{match.group(3)}}}"
    return f"{match.group(4)}{{{match.group(5)}}}"


def normalize_math_answer(answer: str) -> str:
    """MATH-style normal form of an answer (seed 002, step 5). The rules, in order, each with a worked case:

    >>> [normalize_math_answer(s) for s in ["\\\\text{ 12 inches}", "\\\\dfrac12", "x = 1,000"]]
    ['12', '\\\\frac{1}{2}', '1000']
    >>> normalize_math_answer("\\\\left( 4, 5 \\\\right)")
    '(4,5)'
    """
    text = answer.strip().replace("\n", " ")
    text = _TEXT_WRAPPER.sub(r"\1", text)  # `\text{5}` -> 5, `12\text{ inches}` -> 12 inches
    text = text.replace("\\!", "")
    text = re.sub(r"\\[dt]frac", r"\\frac", text)
    text = _LEFT_RIGHT.sub("", text)
    text = text.replace("{bmatrix}", "{pmatrix}")  # the same matrix in other brackets
    text = re.sub(r"\\geq(?![A-Za-z])", r"\\ge", re.sub(r"\\leq(?![A-Za-z])", r"\\le", text))
    text = re.sub(r"\\neq(?![A-Za-z])", r"\\ne", text)
    text = _DEGREES.sub("", text)  # `90^\circ` -> 90
    text = text.replace("\\$", "").replace("$", "")
    text = _PERCENT.sub("", text)  # `50\%`, `50 percent` -> 50
    text = _SPACING.sub(" ", text).strip()
    text = _VARIABLE_PREFIX.sub("", text)  # `x = 5` -> 5
    text = _UNITS_AT_END.sub("", text).strip()  # `5 meters`, `5 apples.`, `5 sq m` -> 5
    text = _MIXED_NUMBER.sub(r"(\1(\2+\3/\4))", text)  # `7 3/4` -> (7+3/4), before spaces go
    text = text.replace("\\{", "").replace("\\}", "")  # `\{1,2\}` -> 1,2: a set reads as its elements
    text = re.sub(r"\s+", "", text)
    text = _THOUSANDS.sub(lambda m: m.group(0).replace(",", ""), text)  # `1,000.5` -> 1000.5
    text = _FRAC_SHORT.sub(_short_frac, text)  # `\frac12` -> \frac{1}{2}
    text = _SQRT_SHORT.sub(r"\\sqrt{\1}", text)  # `\sqrt2` -> \sqrt{2}
    text = _LEADING_DOT.sub(r"0.\1", text)  # `.5` -> 0.5
    text = text.rstrip(".").lower()
    return _LETTER_CHOICE.sub(r"\1", text)  # `(A)` -> a


class _Unparsable(Exception):
    """The normalised answer is not something our sympy parser accepts; it then equals only itself."""


_TOKEN = re.compile(r"\d+\.?\d*|\.\d+|\\[a-z]+|[a-z]|[-+*/^(){}\[\]]")
_MAX_DEPTH = 40
_MAX_POWER_DIGITS = 10_000  # numeric powers with more digits than this are refused, not computed
_MAX_SYMBOLIC_EXPONENT = 32  # (x+1)^n is expanded when compared; keep n small


class _SympyParser:
    """Recursive descent over a normalised answer, building exact sympy values (no `eval`, no floats).

    Grammar: sum := product (('+'|'-') product)* ; product := signed ((op | implicit) signed)* ;
    signed := ('-'|'+') signed | power ; power := atom ('^' atom)? ; atom := number | letter | \\pi | \\infty
    | (sum) | {sum} | \\frac{..}{..} | \\sqrt[n]{..}. Braces are kept, so \\frac{1+3}{2} is 2, never 2.5.
    """

    def __init__(self, text: str):
        self.tokens = _TOKEN.findall(text)
        if "".join(self.tokens) != text:
            raise _Unparsable(text)  # a character we do not model (`=`, `\ge`, `!`, ...)
        self.pos = 0
        self.depth = 0

    def parse(self) -> sympy.Expr:
        value = self.sum()
        if self.pos != len(self.tokens):
            raise _Unparsable("trailing input")
        return value

    def peek(self) -> str | None:
        return self.tokens[self.pos] if self.pos < len(self.tokens) else None

    def take(self, expected: str | None = None) -> str:
        token = self.peek()
        if token is None or (expected is not None and token != expected):
            raise _Unparsable(f"expected {expected!r}, got {token!r}")
        self.pos += 1
        return token

    def sum(self) -> sympy.Expr:
        self.depth += 1
        if self.depth > _MAX_DEPTH:
            raise _Unparsable("nested too deeply")
        value = self.product()
        while self.peek() in ("+", "-"):
            value = value + self.product() if self.take() == "+" else value - self.product()
        self.depth -= 1
        return value

    def product(self) -> sympy.Expr:
        value = self.signed()
        while True:
            token = self.peek()
            if token in ("*", "\\cdot", "\\times"):
                self.take()
                value = value * self.signed()
            elif token in ("/", "\\div"):
                self.take()
                value = value / self.signed()
            elif token is not None and token not in ("+", "-", ")", "}", "]", "^"):
                value = value * self.signed()  # implicit multiplication: 2x, 2\sqrt{2}
            else:
                return value

    def signed(self) -> sympy.Expr:
        if self.peek() in ("-", "+"):
            return -self.signed() if self.take() == "-" else self.signed()
        return self.power()

    def power(self) -> sympy.Expr:
        base = self.atom()
        if self.peek() != "^":
            return base
        self.take()
        exponent = self.atom()
        if exponent.is_number and base.is_number:
            if not exponent.is_Rational:
                raise _Unparsable("irrational exponent")
            # digits of the result ~ |exponent| x digits of the base; irrational bases only to small powers
            base_digits = max(abs(base.p).bit_length(), base.q.bit_length()) * 0.31 if base.is_Rational else 100
            if abs(exponent) * base_digits > _MAX_POWER_DIGITS:
                raise _Unparsable("power too large to compute")
        elif not (exponent.is_Integer and abs(exponent) <= _MAX_SYMBOLIC_EXPONENT):
            raise _Unparsable("symbolic power too large to expand")
        return base**exponent

    def group(self) -> sympy.Expr:
        if self.peek() == "{":
            self.take()
            value = self.sum()
            self.take("}")
            return value
        return self.atom()

    def atom(self) -> sympy.Expr:
        token = self.take()
        if token[0].isdigit() or token[0] == ".":
            return sympy.Rational(token)  # exact: 0.333 is 333/1000, never 1/3
        if len(token) == 1 and token.isalpha():
            return sympy.Symbol(token)
        if token in ("(", "{", "["):
            value = self.sum()
            self.take({"(": ")", "{": "}", "[": "]"}[token])
            return value
        if token == "\\pi":
            return sympy.pi
        if token == "\\infty":
            return sympy.oo
        if token == "\\frac":
            numerator = self.group()
            return numerator / self.group()
        if token == "\\sqrt":
            index: sympy.Expr = sympy.Integer(2)
            if self.peek() == "[":
                self.take()
                index = self.sum()
                self.take("]")
            return sympy.root(self.group(), index)
        raise _Unparsable(f"unsupported token {token!r}")


def _split_top_level(text: str) -> list[str]:
    """Split at commas outside brackets; `(1,2),(3,4)` -> ['(1,2)', '(3,4)']."""
    parts, depth, start = [], 0, 0
    for i, char in enumerate(text):
        if char in "([{":
            depth += 1
        elif char in ")]}":
            depth -= 1
        elif char == "," and depth == 0:
            parts.append(text[start:i])
            start = i + 1
    parts.append(text[start:])
    return parts


def _enclosed(text: str) -> bool:
    """True if the bracket opening `text` closes at its last character: `(4,5]` yes, `(1,2),(3,4)` no."""
    depth = 0
    for i, char in enumerate(text):
        depth += (char in "([{") - (char in ")]}")
        if depth == 0:
            return i == len(text) - 1
    return False


def _as_sequence(text: str) -> tuple[str, list[str]]:
    """(bracket pair, elements) for tuples and intervals like `(4,5]`; ('', [text]) for a single value."""
    if len(text) > 2 and text[0] in "([" and text[-1] in ")]" and _enclosed(text):
        inner = _split_top_level(text[1:-1])
        if len(inner) > 1:
            return text[0] + text[-1], inner
    return "", _split_top_level(text)


def _sympy_value_equal(a: str, b: str) -> bool:
    if a == b:
        return True
    left, right = _SympyParser(a).parse(), _SympyParser(b).parse()
    if left.has(sympy.oo, -sympy.oo, sympy.zoo, sympy.nan) or right.has(sympy.oo, -sympy.oo, sympy.zoo, sympy.nan):
        return left == right  # oo - oo is nan: compare the structure instead
    return sympy.expand(left - right) == 0


def sympy_equivalent(a: str, b: str) -> bool:
    """Exact sympy equivalence of two normalised answers; tuples/intervals element-wise, brackets must match.

    >>> sympy_equivalent("0.5", "\\\\frac{2}{4}"), sympy_equivalent("\\\\sqrt[3]{2}", "\\\\sqrt{2}")
    (True, False)
    """
    if not a or not b or len(a) > MAX_R1_CHARS or len(b) > MAX_R1_CHARS:
        return False
    if _LETTER_RUN.search(_without_commands(a)) or _LETTER_RUN.search(_without_commands(b)):
        return False  # words, not products of symbols
    brackets_a, items_a = _as_sequence(a)
    brackets_b, items_b = _as_sequence(b)
    if brackets_a != brackets_b or len(items_a) != len(items_b):
        return False
    try:
        return all(_sympy_value_equal(x, y) for x, y in zip(items_a, items_b))
    except _Unparsable:
        return False  # other exceptions are bugs: in a worker they become MathGrader.errors, counted and logged


_LATEX_THEN_EXPRESSION = [LatexExtractionConfig(), ExprExtractionConfig()]  # math-verify's defaults


def r1_latex_equal(gold: str, pred: str) -> bool:
    """Worker job (r1_zero with fast=False): math-verify's own reading of each answer, LaTeX first.

    Each side is wrapped in `$...$` unless it has one; math-verify then tries LaTeX, and failing that the last
    number-like expression (so `She sold 72 clips.` reads as 72, while `5 dollars` parses as a product, not 5).
    """
    def read(text: str) -> list:
        text = text if "$" in text else f"${text}$"
        return parse(
            text,
            extraction_config=_LATEX_THEN_EXPRESSION,
            fallback_mode="no_fallback",
            parsing_timeout=None,  # type: ignore[arg-type]  # the worker deadline replaces the signal timeout
        )

    gold_parsed, pred_parsed = read(gold), read(pred)
    return bool(gold_parsed and pred_parsed and verify(gold_parsed, pred_parsed, timeout_seconds=None))


def r1_latex_candidate(text: str) -> bool:
    """Whether an answer may go to math-verify in r1_latex_equal: short, and only LaTeX commands we know."""
    return 0 < len(text) <= MAX_R1_CHARS and all(
        name in _MATH_COMMANDS for name in _COMMAND.findall(_MATRIX_ENV.sub(" ", text))
    )


def last_boxed(text: str) -> str | None:
    """Content of the last `\\boxed{...}` or `\\fbox{...}`; None if it has no balanced braces.

    >>> last_boxed("\\\\boxed{3} or \\\\boxed{\\\\frac{1}{2}}"), last_boxed("\\\\boxed{123")
    ('\\\\frac{1}{2}', None)
    """
    start = max(text.rfind("\\boxed"), text.rfind("\\fbox"))
    if start < 0:
        return None
    brace = start + (len("\\boxed") if text.startswith("\\boxed", start) else len("\\fbox"))
    while brace < len(text) and text[brace] == " ":
        brace += 1
    if brace >= len(text) or text[brace] != "{":
        return None  # `\boxed5`: no braces is a format error (SPEC step 3)
    end = _matching_brace(text, brace)
    return None if end is None else text[brace + 1 : end]


def r1_worker_equal(gold: str, pred: str, fast: bool) -> bool:
    """Worker job for r1_grade: exact sympy equivalence, then (fast=False) math-verify's reading."""
    if sympy_equivalent(normalize_math_answer(pred), normalize_math_answer(gold)):
        return True
    gold, pred = gold.strip(), pred.strip()
    return not fast and r1_latex_candidate(gold) and r1_latex_candidate(pred) and r1_latex_equal(gold, pred)


def r1_grade(model_answer: str, ground_truth: str, fast: bool = True, grader: MathGrader | None = None) -> bool:
    """SPEC step 5: the normalised strings match, or sympy shows them equal, or (fast=False) math-verify does.

    The string check runs here; sympy and math-verify run in `grader`'s workers (default: `default_grader()`)
    under its deadline, because both can take seconds on hostile input (`(x+1)^{32}(y+1)^{32}` expands for
    ~8 s). A timeout counts as not equal. Answers over MAX_R1_CHARS are compared as stripped strings.
    """
    if "\\boxed" in ground_truth or "\\fbox" in ground_truth:
        ground_truth = last_boxed(ground_truth) or ground_truth
    if len(model_answer) > MAX_R1_CHARS or len(ground_truth) > MAX_R1_CHARS:
        return model_answer.strip() == ground_truth.strip()  # the normalising regexes are not linear-time
    gold_norm = normalize_math_answer(ground_truth)
    if not gold_norm:
        return False
    if normalize_math_answer(model_answer) == gold_norm:
        return True
    return (grader or default_grader()).r1_equivalent(ground_truth, model_answer, fast)


# ============================================================================ 3. MathGrader: parallel, deadline

WORKER_JOBS = {"canoe": canoe_math_equal, "r1": r1_worker_equal}  # what deadline workers may run


def warm_up() -> None:
    """Run once in each worker before it reports ready. math-verify compiles its regexes and sympy imports its
    polynomial and radical code on first use (up to ~0.3 s); that must not count against a sample's deadline."""
    examples = [("\\frac{1}{2}", "0.5"), ("x^2-1", "(x-1)(x+1)"), ("\\sqrt{8}", "2\\sqrt{2}"), ("120", "5!"),
                ("(1,2)", "[1,2)")]
    for gold, pred in examples:
        canoe_math_equal(gold, pred)
        r1_worker_equal(gold, pred, fast=False)


def _quiet_math_verify() -> None:
    # math-verify warns once per process that its own timeout is off; that is deliberate here.
    logging.getLogger("math_verify").setLevel(logging.ERROR)


_quiet_math_verify()


class MathGrader:
    """Grade answer-span pairs in parallel worker processes, each pair under a hard deadline.

    Usage: `with MathGrader(workers=2, deadline_s=1.0) as grader: grader.equivalent_batch(golds, preds)`.
    Workers start in the background on construction and persist until `close()`.

    Counters (cumulative, for the trainer to log as per-step deltas):
      timeouts -- graded pairs that hit the deadline or crashed their worker (the worker is replaced, the pair
                  falls back to exact string match). Identical pairs in one batch are graded once, counted once.
      errors   -- pairs whose grading raised inside the worker (also string match; first one logged).
      slowest_s -- the longest time any single pair took, timeouts included.
    """

    def __init__(self, workers: int = 2, deadline_s: float = 1.0):
        self.deadline_s = deadline_s
        self._pool = DeadlinePool("grader", workers=workers, deadline_s=deadline_s)
        self.timeouts = 0
        self.errors = 0
        self.slowest_s = 0.0

    def equivalent_batch(self, golds: list[str], preds: list[str]) -> list[bool]:
        """One bool per (gold, pred) pair of answer spans: same string, or math-verify proves them equal."""
        if len(golds) != len(preds):
            raise ValueError(f"{len(golds)} golds but {len(preds)} preds")
        verdicts: list[bool] = []
        to_grade: dict[tuple[str, str], list[int]] = {}
        for i, (gold, pred) in enumerate(zip(golds, preds)):
            if not isinstance(gold, str) or not isinstance(pred, str):
                verdicts.append(False)
                continue
            gold, pred = prepare_span(gold), prepare_span(pred)
            verdict = settle_locally(gold, pred)
            verdicts.append(bool(verdict))
            if verdict is None:
                to_grade.setdefault((gold, pred), []).append(i)
        # identical spans never get here, so the string-match fallback of a timed-out pair is always False
        results = self._run("canoe", list(to_grade), [gold == pred for gold, pred in to_grade])
        for indices, result in zip(to_grade.values(), results):
            for i in indices:
                verdicts[i] = result
        return verdicts

    def wait_ready(self) -> None:
        """Block until all workers have started (~1-2 s after construction); optional, e.g. before timing."""
        self._pool.wait_ready()

    def r1_equivalent(self, gold: str, pred: str, fast: bool) -> bool:
        """The worker part of `r1_grade` (sympy, plus math-verify when not fast); False on timeout."""
        return self._run("r1", [(gold, pred, fast)], [False])[0]

    def _run(self, job: str, calls: list[tuple], fallbacks: list[bool]) -> list:
        """Run a worker job on each argument tuple; a timeout, crash or error gives that call's fallback."""
        if not calls:
            return []
        results = []
        for fallback, outcome in zip(fallbacks, self._pool.run([(job, args) for args in calls])):
            self.slowest_s = max(self.slowest_s, outcome.seconds)
            if outcome.status == "ok":
                results.append(outcome.value)
                continue
            if outcome.status == "error":
                self.errors += 1
                if self.errors == 1:
                    logger.warning("grader job failed (%s); counted in MathGrader.errors from now on", outcome.value)
            else:
                self.timeouts += 1
            results.append(fallback)
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
    """The process-wide MathGrader (2 workers, 1 s deadline), created on first use and closed at exit.

    Rewards use it when no `grader=` is passed; the trainer passes its own to control workers and deadline.
    """
    global _default_grader
    with _default_lock:
        if _default_grader is None:
            _default_grader = MathGrader()
            atexit.register(_default_grader.close)
        return _default_grader
