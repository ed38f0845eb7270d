"""Tests for grader.py, r1_grader.py and deadline.py: the text/math decision, R1 normalisation and sympy, the
deadline pool.

Run: .venv/bin/python -m pytest tests/test_grader.py -q
"""

import doctest
import threading
import time

import pytest
from conftest import DEADLINE_S, LOADED_S

from grading import grader
from grading import r1_grader
from grading.deadline import DeadlinePool, WorkerStartError
from grading.grader import MathGrader, needs_math_verify, prepare_span, reads_as_text
from grading.r1_grader import last_boxed, normalize_math_answer, sympy_equivalent

HANG = "10000000!"  # math-verify computes the factorial when comparing: a genuine hang (minutes)


# ------------------------------------------------------------------------------------------------ text or math


@pytest.mark.parametrize(
    "span, is_text, why",
    [
        ("Paris", True, "plain words"),
        ("ab", True, "letters would become a product"),
        ("x", True, "no digit, operator or LaTeX: exact match decides"),
        ("", True, "empty"),
        ("42", False, "number"),
        ("2\\sqrt{2}", False, "LaTeX without $"),
        ("\\{1,2\\}", False, "set"),
        ("1,000", False, "thousands"),
        ("x^2-1", False, "algebra with one-letter symbols"),
        ("3-2\\sqrt{2}", False, "a difference involving a root"),
        ("1914-1918", True, "integer range"),
        ("2001-02-03", True, "date"),
        ("3/4/2020", True, "date"),
        ("1.2.3", True, "version"),
        ("10:30", True, "time, math-verify divides"),
        ("3 4", True, "numbers split by a space, math-verify adds them"),
        ("1e5", True, "letter then digit"),
        ("007", True, "leading zero"),
        ("f'(x)", True, "prime, math-verify deletes quotes"),
        ("\\text{Paris}", True, "words inside \\text"),
        ("\\text{5}", False, "a number inside \\text"),
        ("\\mbox{5}", True, "unknown command"),
        ("\\operatorname{lcm}(2,3)", True, "unknown command"),
        ("costs $5", True, "prose with a dollar"),
        ("\\begin{pmatrix}1\\\\2\\end{pmatrix}", False, "matrix environment names are not words"),
        ("1" * 600, True, "longer than MAX_MATH_CHARS"),
        ("9^{9^{9^{9}}}", True, "power tower: latex2sympy would evaluate it for hours"),
        ("(" * 9 + "1" + ")" * 9, True, "nested deeper than MAX_NESTING"),
        ("((1,2),(3,4))", False, "nested, but shallow"),
    ],
)
def test_reads_as_text(span, is_text, why):
    assert reads_as_text(span) is is_text, why


@pytest.mark.parametrize(
    "raw, prepared",
    [(" $\\frac{1}{2}$ ", "\\frac{1}{2}"), ("\\(x\\)", "x"), ("\\boxed{42}", "42"), ("\\boxed{5}+1", "\\boxed{5}+1"),
     ("$$ 3 $$", "3"), ("$5", "$5")],
)
def test_prepare_span(raw, prepared):
    assert prepare_span(raw) == prepared


def test_letters_must_match_case_sensitively():
    # math-verify lower-cases symbols; without this rule A+1 would equal a+1
    assert not needs_math_verify("A+1", "a+1")
    assert needs_math_verify("x+1", "1+x")
    assert needs_math_verify("5", "x = 5")  # the assigned variable is not part of the value
    assert not needs_math_verify("5", "5 m")


# ------------------------------------------------------------------------------------------------ equivalence


ACCURACY_PAIRS = [  # (gold, pred, equivalent)
    ("2\\sqrt{2}", "\\sqrt{8}", True),
    ("\\{1,2\\}", "\\{2,1\\}", True),
    ("1000", "1,000", True),
    ("\\frac{1}{2}", "0.5", True),
    ("$\\frac{1}{2}$", "0.5", True),
    ("42", "\\boxed{42}", True),
    ("x+1", "1+x", True),
    ("x^2-1", "(x-1)(x+1)", True),
    ("5", "x = 5", True),
    ("10^{3}", "1000", True),
    ("\\begin{pmatrix}1\\\\2\\end{pmatrix}", "\\begin{bmatrix}1\\\\2\\end{bmatrix}", True),
    ("2", "2\\sqrt{2}", False),  # partial parse never passes
    ("Paris", "paris", False),
    ("no", "on", False),
    ("ab", "ba", False),
    ("A+1", "a+1", False),
    ("(1,2)", "(2,1)", False),
    ("[1,2]", "[1,2)", False),
    ("1914-1918", "1939-1943", False),  # both are -4 as subtractions
    ("2001-02-03", "2001-03-02", False),
    ("10:30", "1:3", False),
    ("7", "3 4", False),
    ("1e5", "5e1", False),
    ("5 m", "5 s", False),  # math-verify's unit stripping is off
    ("\\text{Paris}", "\\text{paris}", False),
    ("5", "\\mbox{5}", False),
    ("\\pi", "3.14159", False),
    ("007", "7", False),
    ("1/0", "2/0", False),
    ("\ud800", "x", False),
]


def test_equivalent_batch_table(math_grader):
    golds, preds, expected = zip(*ACCURACY_PAIRS)
    assert math_grader.equivalent_batch(list(golds), list(preds)) == list(expected)


def test_equivalent_batch_shapes(math_grader):
    assert math_grader.equivalent_batch([], []) == []
    not_strings = math_grader.equivalent_batch([None, 42, "1"], ["x", 42, None])  # type: ignore[list-item]
    assert not_strings == [False, False, False]
    with pytest.raises(ValueError, match="2 golds but 1 preds"):
        math_grader.equivalent_batch(["1", "2"], ["1"])


def test_identical_pairs_are_graded_once(math_grader):
    before = math_grader.timeouts
    golds, preds = [HANG] * 3 + ["1"], ["1"] * 3 + ["1"]
    assert math_grader.equivalent_batch(golds, preds) == [False, False, False, True]
    assert math_grader.timeouts == before + 1  # one distinct pair, one timeout


# ------------------------------------------------------------------------------------------------ R1 grading


@pytest.mark.parametrize(
    "raw, normal",
    [
        ("\\text{ 12 inches}", "12"),
        ("12\\text{ inches}", "12"),
        ("\\dfrac12", "\\frac{1}{2}"),
        ("\\frac1{2}", "\\frac{1}{2}"),
        ("\\frac{1}2", "\\frac{1}{2}"),
        ("\\sqrt2", "\\sqrt{2}"),
        ("x = 1,000", "1000"),
        ("1,000.5", "1000.5"),
        ("2,3", "2,3"),
        ("\\left( 4, 5 \\right)", "(4,5)"),
        ("90^\\circ", "90"),
        ("90^{\\circ}", "90"),
        ("\\$5", "5"),
        ("50\\%", "50"),
        ("50 percent", "50"),
        ("5 sq m", "5"),
        ("5 apples.", "5"),
        ("5 dollars", "5dollars"),
        (".5", "0.5"),
        ("- 3", "-3"),
        ("7 3/4", "((7+3/4))"),
        ("\\{1,2\\}", "1,2"),
        ("\\text{(A)}", "a"),
        ("\\text{Monday}", "monday"),
        ("\\mbox{5}", "\\mbox{5}"),
        ("x \\geq 2", "x\\ge2"),
        ("\\begin{bmatrix} 1 \\\\ 2 \\end{bmatrix}", "\\begin{pmatrix}1\\\\2\\end{pmatrix}"),
    ],
)
def test_normalize_math_answer(raw, normal):
    assert normalize_math_answer(raw) == normal


@pytest.mark.parametrize(
    "a, b, equal",
    [
        ("0.5", "\\frac{1}{2}", True),
        ("\\frac{2}{4}", "\\frac{1}{2}", True),
        ("1/2+1/4", "0.75", True),
        ("42.0", "42", True),
        ("-0", "0", True),
        ("2\\sqrt{2}", "\\sqrt{8}", True),
        ("\\frac{1}{\\sqrt{2}}", "\\frac{\\sqrt{2}}{2}", True),
        ("x^2+2x+1", "(x+1)^2", True),
        ("10^{3}", "1000", True),
        ("\\frac{1+3}{2}", "2", True),
        ("(4,5)", "(4,5)", True),
        ("(-\\infty,3]", "(-\\infty,3]", True),
        ("\\frac{1+3}{2}", "2.5", False),  # the well-known implementation drops the brackets: 1+3/2
        ("\\sqrt[3]{2}", "\\sqrt{2}", False),  # ... and ignores the root's index
        ("\\frac{1}{3}", "0.333", False),  # no numeric tolerance
        ("3.14159", "\\pi", False),
        ("0.50001", "0.5", False),
        ("(4,5)", "[4,5]", False),  # brackets must match
        ("3,2", "2,3", False),  # element-wise, in order
        ("(1,2),(3,4)", "(1,2),(3,4)", True),
        ("ab", "ba", False),  # words are never products
        ("2^{2^{2^{2^{2}}}}", "1", False),  # refused, not computed (65536-bit exponent)
        ("", "0", False),
    ],
)
def test_sympy_equivalent(a, b, equal):
    assert sympy_equivalent(a, b) is equal


@pytest.mark.parametrize(
    "text, content",
    [("\\boxed{5}", "5"), ("\\boxed{3} or \\boxed{\\frac{1}{2}}", "\\frac{1}{2}"), ("\\fbox{7}", "7"),
     ("\\boxed {5}", "5"), ("\\boxed{}", ""), ("\\boxed{123", None), ("\\boxed5", None), ("no box", None)],
)
def test_last_boxed(text, content):
    assert last_boxed(text) == content


def test_r1_pathological_sympy_is_cut_off(math_grader):
    math_grader.wait_ready()  # an earlier test killed a worker; its replacement may still be starting
    before = math_grader.timeouts
    start = time.monotonic()
    assert not r1_grader.r1_grade("(x+1)^{32}(y+1)^{32}(z+1)^{32}", "1", fast=True, grader=math_grader)
    assert time.monotonic() - start < DEADLINE_S + LOADED_S
    assert math_grader.timeouts == before + 1


# ------------------------------------------------------------------------------------------------ the deadline


def test_hanging_sample_is_cut_off_counted_and_replaced(math_grader):
    math_grader.wait_ready()
    pids_before = set(math_grader._pool.pids())
    before = math_grader.timeouts
    start = time.monotonic()
    verdicts = math_grader.equivalent_batch([HANG, "2\\sqrt{2}"], ["1", "\\sqrt{8}"])
    elapsed = time.monotonic() - start
    assert verdicts == [False, True]  # the hung pair fell back to string match; the other was graded
    assert elapsed < DEADLINE_S + LOADED_S  # HANG takes minutes
    assert math_grader.timeouts == before + 1
    assert math_grader.slowest_s < DEADLINE_S + LOADED_S
    assert len(pids_before - set(math_grader._pool.pids())) == 1  # exactly one worker was killed and replaced
    assert math_grader.equivalent_batch(["\\frac{1}{2}"], ["0.5"]) == [True]  # and the pool still works


def test_timeout_falls_back_to_string_match(math_grader):
    before = math_grader.timeouts
    # test hook: a job that sleeps past the deadline; the fallbacks say what string match would give
    assert math_grader._run("_sleep", [(5, True), (5, True)], [True, False]) == [True, False]
    assert math_grader.timeouts == before + 2


def test_crashed_worker_is_counted_and_replaced(math_grader):
    before = math_grader.timeouts
    assert math_grader._run("_crash", [(3,)], [False]) == [False]
    assert math_grader.timeouts == before + 1
    assert math_grader.equivalent_batch(["1"], ["1.0"]) == [True]


def test_job_error_is_counted_not_raised(math_grader):
    before = math_grader.errors
    assert math_grader._run("no_such_job", [("a", "a")], [True]) == [True]
    assert math_grader.errors == before + 1


def test_the_first_job_error_warns_once_with_the_exception():
    with MathGrader(workers=1, deadline_s=DEADLINE_S) as fresh:
        with pytest.warns(RuntimeWarning, match="no_such_job: KeyError") as caught:
            assert fresh._run("no_such_job", [("a", "a"), ("b", "b")], [True, False]) == [True, False]
            fresh._run("no_such_job", [("c", "c")], [True])
        assert len([w for w in caught if issubclass(w.category, RuntimeWarning)]) == 1
        assert fresh.errors == 3


def test_deadline_works_off_the_main_thread(math_grader):
    results = {}

    def grade() -> None:
        start = time.monotonic()
        results["verdicts"] = math_grader.equivalent_batch([HANG, "1000"], ["1", "1,000"])
        results["elapsed"] = time.monotonic() - start

    thread = threading.Thread(target=grade)
    thread.start()
    thread.join(timeout=30)
    assert results["verdicts"] == [False, True]
    assert results["elapsed"] < DEADLINE_S + LOADED_S + 3.0  # may wait for a replacement worker to start


def test_workers_never_import_the_trainer_stack(math_grader):
    pytest.importorskip("torch")  # the trainer's process holds torch; its grading workers must not
    (outcome,) = math_grader._pool.run([("_modules", ())])
    assert outcome.status == "ok" and {"math_verify", "grading.grader", "grading.r1_grader"} <= set(outcome.value)
    assert not {"torch", "vllm", "deepspeed", "__mp_main__"} & set(outcome.value)


def test_canoe_workers_leave_the_r1_grader_out():
    """CANOE's rewards grade with `grader` alone: a grader made without r1 does not import r1_grader in its
    workers, and refuses R1-Zero's job with a message that says how to get it."""
    with MathGrader(workers=1, deadline_s=DEADLINE_S) as canoe_only:
        (outcome,) = canoe_only._pool.run([("_modules", ())])
        assert outcome.status == "ok" and "grading.grader" in outcome.value
        assert "grading.r1_grader" not in outcome.value
        assert canoe_only.equivalent_batch(["\\frac{1}{2}"], ["0.5"]) == [True]
        with pytest.raises(ValueError, match="r1=True"):
            canoe_only.r1_equivalent("2", "2", fast=True)


def test_pool_outcomes_and_close():
    pool = DeadlinePool("grading.deadline", workers=1, deadline_s=0.5)  # a job module with only the test hooks: starts fast
    ok, slow, crash = pool.run([("_sleep", (0.0, "done")), ("_sleep", (5, None)), ("_crash", (1,))])
    assert (ok.status, ok.value) == ("ok", "done")
    assert slow.status == "timeout" and 0.5 <= slow.seconds < 0.5 + LOADED_S  # the job would sleep 5 s
    assert crash.status == "crash"
    processes = [w.proc for w in pool._workers]
    pool.close()
    assert all(p.poll() is not None for p in processes)
    with pytest.raises(RuntimeError, match="closed"):
        pool.run([("_sleep", (0.0,))])


def test_workers_that_cannot_start_raise():
    pool = DeadlinePool("no_such_module_for_workers", workers=1, deadline_s=1.0)
    try:
        with pytest.raises(WorkerStartError, match="failed to start"):
            pool.run([("_sleep", (0.0,))])
    finally:
        pool.close()


@pytest.mark.parametrize("module", [grader, r1_grader], ids=lambda m: m.__name__)
def test_doctests(module):
    result = doctest.testmod(module)
    assert result.attempted > 0 and result.failed == 0
