r"""R1-Zero grading: is a model's math answer equal to the ground truth? The grader behind `r1_zero_reward_fn`.

The rules of understand-r1-zero's `grade(model_answer, ground_truth, fast)` (Liu et al. 2025, arXiv 2503.20783),
written from its description (docs/DESIGN.md, "The R1-Zero math reward"): 1. MATH-style normalisation, compared as
strings (`normalize_math_answer`); 2. exact sympy equivalence by our own small parser (`sympy_equivalent`: no
`eval`, no numeric tolerance, tuples and intervals element-wise with matching brackets); 3. with fast=False,
math-verify's reading of both answers (`r1_latex_equal`). `r1_grade` does step 1 in the caller's process; steps 2
and 3 can take seconds on hostile input, so they run in `grader.MathGrader`'s workers under its deadline (the job
"r1"), and this module must never import torch.

Differs from the well-known implementation (docs/differences.md, D18) where its worked cases
(tests/cases/r1_zero_cases.json) call it wrong: a root's index and a numerator's braces are kept (`_SympyParser`),
and `\fbox` is a box like `\boxed` (`last_boxed`)."""

from __future__ import annotations

import re

import sympy
from math_verify import ExprExtractionConfig, LatexExtractionConfig, parse, verify

from grading.grader import (WARM_UP_PAIRS, MathGrader, as_sequence, default_grader, has_word, matching_brace,
                            only_known_commands)

MAX_R1_CHARS = 1000  # longer answers are compared as stripped strings: normalising them is not linear-time

# Unit words removed after a number, as the reference grader's unit list does ("5 apples" is 5). Dollars are
# deliberately absent (worked case `units_dollars`): `\$` is the currency sign we drop.
_UNIT_WORDS = (
    "sq m|square meters?|square feet|cm|mm|km|m|meters?|metres?|centimeters?|kilometers?|inch(?:es)?|feet|foot|ft|"
    "yards?|miles?|mph|kg|g|grams?|kilograms?|pounds?|lbs?|liters?|litres?|ml|seconds?|sec|s|minutes?|mins?|"
    "hours?|hrs?|days?|weeks?|months?|years?|degrees?|deg|units?|apples?|people|students?|cents?"
)


def _short_frac(match: re.Match) -> str:
    """`\\frac12` -> \\frac{1}{2}, `\\frac1{2}` -> \\frac{1}{2}, `\\frac{1}2` -> \\frac{1}{2}."""
    if match.group(1):
        return f"\\frac{{{match.group(1)}}}{{{match.group(2)}}}"
    if match.group(3):
        return f"\\frac{{{match.group(3)}}}"
    return f"{match.group(4)}{{{match.group(5)}}}"


def normalize_math_answer(answer: str) -> str:
    """MATH-style normal form of an answer (step 1 above). The rules, in order, each with a worked case:

    >>> [normalize_math_answer(s) for s in ["\\\\text{ 12 inches}", "\\\\dfrac12", "x = 1,000"]]
    ['12', '\\\\frac{1}{2}', '1000']
    >>> normalize_math_answer("\\\\left( 4, 5 \\\\right)")
    '(4,5)'
    """
    text = answer.strip().replace("\n", " ")
    # `\text{5}` -> 5, `12\text{ inches}` -> 12 inches; not \mbox (worked case `mbox`)
    text = re.sub(r"\\(?:text|textbf|textrm|mathrm)\s*\{([^{}]*)\}", r"\1", text).replace("\\!", "")
    text = re.sub(r"\\(?:left|right)(?![A-Za-z])", "", re.sub(r"\\[dt]frac", r"\\frac", text))
    text = text.replace("{bmatrix}", "{pmatrix}")  # the same matrix in other brackets
    text = re.sub(r"\\(le|ge|ne)q(?![A-Za-z])", r"\\\1", text)
    text = re.sub(r"\^\s*\{?\s*\\circ\s*\}?|\\circ|°", "", text)  # `90^\circ` -> 90
    text = re.sub(r"\\%|%|\s*\bpercent\b", "", text.replace("\\$", "").replace("$", ""))  # `50\%`, `50 percent`
    text = re.sub(r"(?<!\\)\\[,;:! ]|\\quad|\\qquad", " ", text).strip()  # spacing, not a matrix's `\\` row break
    text = re.sub(r"^[A-Za-z]\w{0,2}\s*=(?!=)\s*", "", text)  # `x = 5`, `xy = 5` -> 5
    text = re.sub(rf"(?<=[\d}}])\s*(?:{_UNIT_WORDS})\s*\.?$", "", text).strip()  # `5 meters`, `5 apples.`, `5 sq m`
    text = re.sub(r"^(-?)(\d+)\s+(\d+)\s*/\s*(\d+)$", r"(\1(\2+\3/\4))", text)  # `7 3/4` -> (7+3/4), before spaces go
    text = re.sub(r"\s+", "", text.replace("\\{", "").replace("\\}", ""))  # `\{1,2\}` -> 1,2: a set, its elements
    text = re.sub(r"(?<![\d.,])\d{1,3}(?:,\d{3})+(?![\d,])", lambda m: m[0].replace(",", ""), text)  # `1,000.5`
    text = re.sub(r"\\frac\s*(\d)\s*(\d)|\\frac\s*(\d)\s*(?=\{)|(\\frac\{[^{}]*\})\s*(\d)", _short_frac, text)
    text = re.sub(r"\\sqrt\s*([0-9a-zA-Z])", r"\\sqrt{\1}", text)  # `\sqrt2` -> \sqrt{2}
    text = re.sub(r"(?<![\d}])\.(\d)", r"0.\1", text).rstrip(".").lower()  # `.5` -> 0.5
    return re.sub(r"^\(([a-z])\)$", r"\1", text)  # `(A)` -> a


class _Unparsable(Exception):
    """The normalised answer is not something our sympy parser accepts; it then equals only itself."""


_TOKEN = re.compile(r"\d+\.?\d*|\.\d+|\\[a-z]+|[a-z]|[-+*/^(){}\[\]]")
_MAX_DEPTH = 40
_MAX_POWER_DIGITS = 10_000  # numeric powers with more digits than this are refused, not computed
_MAX_SYMBOLIC_EXPONENT = 32  # (x+1)^n is expanded when compared; keep n small
_CLOSING = {"(": ")", "{": "}", "[": "]"}
_CONSTANTS = {"\\pi": sympy.pi, "\\infty": sympy.oo}


class _SympyParser:
    """Recursive descent over a normalised answer, building exact sympy values (no `eval`, no floats).

    Grammar: sum := product (('+'|'-') product)* ; product := signed ((op | implicit) signed)* ;
    signed := ('-'|'+') signed | power ; power := atom ('^' atom)? ; atom := number | letter | \\pi | \\infty
    | (sum) | {sum} | \\frac atom atom | \\sqrt[n]? atom. Braces are kept, so \\frac{1+3}{2} is 2, never 2.5.
    """

    def __init__(self, text: str):
        self.tokens = _TOKEN.findall(text)
        if "".join(self.tokens) != text:
            raise _Unparsable(text)  # a character we do not model (`=`, `\ge`, `!`, ...)
        self.tokens.append("")  # the end
        self.pos = 0
        self.depth = 0

    def parse(self) -> sympy.Expr:
        value = self.sum()
        if self.peek():
            raise _Unparsable("trailing input")
        return value

    def peek(self) -> str:
        return self.tokens[self.pos]

    def take(self, expected: str | None = None) -> str:
        token = self.peek()
        if not token or (expected is not None and token != expected):
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
        while self.peek() not in ("", "+", "-", ")", "}", "]", "^"):
            # an operator, or none: implicit multiplication (2x, 2\sqrt{2})
            operator = self.take() if self.peek() in ("*", "\\cdot", "\\times", "/", "\\div") else "*"
            value = value / self.signed() if operator in ("/", "\\div") else value * self.signed()
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

    def atom(self) -> sympy.Expr:
        token = self.take()
        if token[0].isdigit() or token[0] == ".":
            return sympy.Rational(token)  # exact: 0.333 is 333/1000, never 1/3
        if len(token) == 1 and token.isalpha():
            return sympy.Symbol(token)
        if token in _CLOSING:
            value = self.sum()
            self.take(_CLOSING[token])
            return value
        if token in _CONSTANTS:
            return _CONSTANTS[token]
        if token == "\\frac":
            return self.atom() / self.atom()  # numerator first
        if token == "\\sqrt":
            index = self.atom() if self.peek() == "[" else sympy.Integer(2)  # `[n]` is an atom: `[sum]`
            return sympy.root(self.atom(), index)
        raise _Unparsable(f"unsupported token {token!r}")


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
    if not a or not b or len(a) > MAX_R1_CHARS or len(b) > MAX_R1_CHARS or has_word(a) or has_word(b):
        return False  # has_word: words, never products of symbols
    (brackets_a, items_a), (brackets_b, items_b) = as_sequence(a), as_sequence(b)
    if brackets_a != brackets_b or len(items_a) != len(items_b):
        return False
    try:
        return all(_sympy_value_equal(x, y) for x, y in zip(items_a, items_b))
    except _Unparsable:
        return False  # other exceptions are bugs: in a worker they become MathGrader.errors, counted and logged


_LATEX_THEN_EXPRESSION = [LatexExtractionConfig(), ExprExtractionConfig()]  # math-verify's defaults


def r1_latex_equal(gold: str, pred: str) -> bool:
    """Worker job (fast=False): math-verify's own reading of each answer, wrapped in `$...$` unless it has one:
    LaTeX first, else the last number-like expression (`She sold 72 clips.` reads as 72, `5 dollars` as a product).
    """
    # parsing_timeout=None: the worker deadline replaces math-verify's signal-based timeout
    gold_parsed, pred_parsed = (parse(text if "$" in text else f"${text}$", extraction_config=_LATEX_THEN_EXPRESSION,
                                      fallback_mode="no_fallback", parsing_timeout=None)  # type: ignore[arg-type]
                                for text in (gold, pred))
    return bool(gold_parsed and pred_parsed and verify(gold_parsed, pred_parsed, timeout_seconds=None))


_BOX_OPENING = re.compile(r"\\(?:boxed|fbox) *\{")


def last_boxed(text: str) -> str | None:
    """Content of the last `\\boxed{...}` or `\\fbox{...}`; None if it has no balanced braces.

    >>> last_boxed("\\\\boxed{3} or \\\\boxed{\\\\frac{1}{2}}"), last_boxed("\\\\boxed{123")
    ('\\\\frac{1}{2}', None)
    """
    start = max(text.rfind("\\boxed"), text.rfind("\\fbox"))
    if start < 0 or not (box := _BOX_OPENING.match(text, start)):
        return None  # `\boxed5`: no braces is a format error (r1_zero_reward_fn, step 3)
    end = matching_brace(text, box.end() - 1)
    return None if end is None else text[box.end() : end]


def r1_worker_equal(gold: str, pred: str, fast: bool) -> bool:
    """Worker job for r1_grade: exact sympy equivalence, then (fast=False) math-verify's reading of short answers
    with only known LaTeX commands."""
    if sympy_equivalent(normalize_math_answer(pred), normalize_math_answer(gold)):
        return True
    gold, pred = gold.strip(), pred.strip()
    return (not fast and all(0 < len(text) <= MAX_R1_CHARS and only_known_commands(text) for text in (gold, pred))
            and r1_latex_equal(gold, pred))


def r1_grade(model_answer: str, ground_truth: str, fast: bool = True, grader: MathGrader | None = None) -> bool:
    """The grade of `r1_zero_reward_fn` (its step 5): the normalised strings match, or sympy shows them equal, or
    (fast=False) math-verify does. Sympy and math-verify run in `grader`'s workers (default: `default_grader()`);
    a timeout counts as not equal. Answers over MAX_R1_CHARS are compared as stripped strings.
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


# ------------------------------------------------------------------------------------------------ worker side

WORKER_JOBS = {"r1": r1_worker_equal}  # what grading workers may run from this module (see grader.WORKER_MODULES)
WARM_UP = [("r1", (gold, pred, False)) for gold, pred in WARM_UP_PAIRS]  # see grader.WARM_UP_PAIRS
