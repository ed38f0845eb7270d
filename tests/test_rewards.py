"""Tests for rewards.py: every worked case in tests/cases, our own cases, malformed and hostile input, the debug log.

Run: .venv/bin/python -m pytest tests/test_rewards.py -q
"""

import json
import re
import time
from collections import Counter
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from conftest import DEADLINE_S, LOADED_S

import rewards
from config import known_rewards
from rewards import (
    REWARD_FUNCS,
    REWARD_ISSUES,
    accuracy_reward,
    format_reward,
    grounding_reward,
    influence_reward,
    len_reward,
    r1_zero_reward_fn,
)

CASES_DIR = Path(__file__).resolve().parent / "cases"
CANOE_CASES = json.loads((CASES_DIR / "canoe_reward_cases.json").read_text())
R1_CASES = json.loads((CASES_DIR / "r1_zero_cases.json").read_text())


def chat(text):
    """One completion entry as the trainer passes it: a list of messages."""
    return [{"role": "assistant", "content": text}]


def tagged(answer, think="t", long_answer="l"):
    return f"<think>{think}</think><long_answer>{long_answer}</long_answer><answer>{answer}</answer>"


# ------------------------------------------------------------------------------------------------ worked cases


def run_case(case, math_grader):
    fn = case["fn"]
    if fn == "accuracy":
        return accuracy_reward([chat(case["completion"])], [case["solution"]], grader=math_grader)[0]
    if fn == "format":
        return format_reward([chat(case["completion"])])[0]
    if fn == "influence":
        return influence_reward([chat(case["completion"])], [case["solution"]], [case["long_answer_completion"]])[0]
    if fn == "length":
        return len_reward([chat(case["completion"])], [case["problem"]])[0]
    raise AssertionError(f"unknown fn {fn}")


REWARD_CASES = [c for c in CANOE_CASES if c["fn"] != "substitute_context"]  # substitute_context: rollout.py's tests


def test_case_file_is_covered():
    assert {c["fn"] for c in REWARD_CASES} == {"accuracy", "format", "influence", "length"}
    assert len(REWARD_CASES) + sum(c["fn"] == "substitute_context" for c in CANOE_CASES) == len(CANOE_CASES)


@pytest.mark.parametrize("case", REWARD_CASES, ids=[c["id"] for c in REWARD_CASES])
def test_canoe_case(case, math_grader):
    assert run_case(case, math_grader) == case["expected"]


def r1_values(case, fast, math_grader):
    result = r1_zero_reward_fn(case["response"], case["ground_truth"], fast=fast, grader=math_grader)
    assert set(result) == {"format_reward", "answer_reward", "reward"}
    return [result["format_reward"], result["answer_reward"], result["reward"]]


# The fast grade of each case whose band in the case file is [0, 1], by SPEC's fast rules (normalised strings or
# sympy; tuples in order): 1 where sympy or a normalisation rule shows the two equal, 0 where only math-verify would.
FAST_ANSWER = {"unreduced_frac": 1.0,  # sympy: 2/4 = 1/2
               "unreduced_slash": 1.0,  # sympy: 2/4 = 1/2
               "xy_eq_5": 1.0,  # the "x =" prefix rule drops "xy ="
               "list_order": 0.0,  # tuples are compared element by element, in order
               "power_brace": 1.0,  # sympy: 10^3 = 1000
               "handout_clips_right_sentence": 0.0,  # no rule takes a number out of a sentence
               "apples_trailing_period": 1.0,  # the unit word "apples" and the trailing period go
               "frac_sum_num_vs_int": 1.0,  # sympy: (1 + 3) / 2 = 2
               "int_gt_vs_expr": 1.0}  # sympy: 2 + 3 = 5


@pytest.mark.parametrize("case", R1_CASES, ids=[c["id"] for c in R1_CASES])
def test_r1_case_fast(case, math_grader):
    values = r1_values(case, True, math_grader)
    assert all(low <= v <= high for low, v, high in zip(case["fast_at_least"], values, case["expected"])), values
    if case["fast_at_least"] != case["expected"]:  # a band: the fast grade is pinned to one end of it
        assert values == [1.0, FAST_ANSWER[case["id"]], FAST_ANSWER[case["id"]]], values


def test_every_band_of_the_fast_grade_is_pinned():
    assert {c["id"] for c in R1_CASES if c["fast_at_least"] != c["expected"]} == set(FAST_ANSWER)


@pytest.mark.parametrize("case", R1_CASES, ids=[c["id"] for c in R1_CASES])
def test_r1_case_slow(case, math_grader):
    assert r1_values(case, False, math_grader) == case["expected"]


# ------------------------------------------------------------------------------------------------ our own cases


@pytest.mark.parametrize(
    "completion, solution, expected",
    [
        (tagged("2\\sqrt{2}"), "<answer>\\sqrt{8}</answer>", 1.0),
        (tagged("1,000"), "<answer>1000</answer>", 1.0),
        (tagged("$\\frac{1}{2}$"), "<answer>0.5</answer>", 1.0),
        (tagged("x = 5"), "<answer>5</answer>", 1.0),
        (tagged("ab"), "<answer>ba</answer>", 0.0),
        (tagged("A+1"), "<answer>a+1</answer>", 0.0),
        (tagged("1939-1943"), "<answer>1914-1918</answer>", 0.0),  # both are -4 as subtractions
        (tagged("Marie Curie"), "<answer>Marie  Curie</answer>", 0.0),  # string match is exact
        (tagged("41", think="the answer is 42"), "<answer>42</answer>", 0.0),  # <think> never counts
        ("42 <answer>41</answer> <answer>42</answer>", "<answer>42</answer>", 0.0),  # the first <answer> counts
        ("<answer>42", "<answer>42</answer>", 0.0),  # unclosed: the whole text is the span
        (tagged("42"), "42", 1.0),
        (tagged(""), "<answer></answer>", 1.0),  # identical (empty) spans
    ],
)
def test_accuracy_compares_the_first_answer_spans_as_strings_or_math(completion, solution, expected, math_grader):
    assert accuracy_reward([chat(completion)], [solution], grader=math_grader) == [expected]


@pytest.mark.parametrize(
    "completion, expected",
    [
        (tagged("c") + "\n", 1.0),  # the original failed on the trailing newline
        ("\n  " + tagged("c") + "  \n", 1.0),
        ("<think>a</think>\n\n<long_answer>b</long_answer> \t<answer>c</answer>", 1.0),
        (tagged("c") + ".", 0.0),
        ("x" + tagged("c"), 0.0),
        ("<think>a</think><answer>c</answer><long_answer>b</long_answer>", 0.0),
        ("<think><think>a</think></think><long_answer>b</long_answer><answer>c</answer>", 1.0),  # lazy .*? allows
        ("<think>a</think><long_answer>b</long_answer><answer>c</answer><answer>d</answer>", 1.0),  # as the regex
        ("<think></think><long_answer></long_answer><answer></answer>", 1.0),
        ("<think>a</think><long_answer>b</long_answer><answer>", 0.0),
    ],
)
def test_format_extra(completion, expected):
    assert format_reward([chat(completion)]) == [expected]


FORMAT_REGEX = re.compile(r"<think>.*?</think>\s*<long_answer>.*?</long_answer>\s*<answer>.*?</answer>", re.DOTALL)
TAG_PIECES = ["<think>", "</think>", "<long_answer>", "</long_answer>", "<answer>", "</answer>", " ", "\n", "a", "<"]


@settings(max_examples=300, deadline=None)
@given(st.lists(st.sampled_from(TAG_PIECES), max_size=14))
def test_format_matches_the_spec_regex(pieces):
    text = "".join(pieces)
    expected = 1.0 if FORMAT_REGEX.fullmatch(text.strip()) else 0.0
    assert format_reward([chat(text)]) == [expected]


def test_format_is_linear_on_hostile_tags():
    text = "<think>" + "</think> " * 100_000 + "</long_answer>" * 100_000 + "</answer>"
    start = time.monotonic()
    assert format_reward([chat(text)]) == [0.0]
    assert time.monotonic() - start < 1.0 + LOADED_S  # a quadratic scan of 200 000 tags takes minutes


def test_influence_extra():
    solution = ["<answer>42</answer>"] * 4
    stage2 = [None, chat("<answer>42</answer>"), "not messages", chat(None)]
    assert influence_reward([chat("x")] * 4, solution, stage2) == [0.0, 1.0, 0.0, 0.0]


CONTEXT_100 = "<context>" + "x" * 100 + "</context>\n\nWhat is asked?"


@pytest.mark.parametrize(
    "long_answer, problem, expected",
    [
        ("y" * 50, [{"role": "system", "content": "s"}, {"role": "user", "content": CONTEXT_100}], 1.0),  # chat
        ("y" * 80, "<context>" + "x" * 100 + "</context>", 0.0),  # exactly 80%: strict
        ("y" * 79, "<context>" + "x" * 100 + "</context>", 1.0),
        ("y" * 50, "<context>" + "x" * 100 + "</context> and <context>x</context>", 1.0),  # first context
        ("y" * 50, "<context>   </context>", 0.0),  # empty after stripping
        ("y" * 50, None, 0.0),
    ],
)
def test_length_extra(long_answer, problem, expected):
    assert len_reward([chat(tagged("a", long_answer=long_answer))], [problem]) == [expected]


PASSAGE = "<context>The Varnel Bridge was designed by the engineer\n  Osric Hallam in 1911.</context>\n\nWho?"


@pytest.mark.parametrize(
    "answer, problem, expected",
    [
        ("Osric Hallam", PASSAGE, 1.0),
        ("the ENGINEER   osric hallam", PASSAGE, 1.0),  # case and runs of whitespace ignored, across the line break
        ("Hallam Osric", PASSAGE, 0.0),  # the words, but not in the passage's order
        ("Mira Castell", PASSAGE, 0.0),
        ("1911", "<context>1911 is not here</context>\n\nWhen? 1911", 1.0),
        ("Varnel Bridge", "Varnel Bridge, but no context", 0.0),
        ("", PASSAGE, 0.0),  # an empty answer is no span
        ("a b c d e f g h i j k l", "<context>a b c d e f g h i j k l m</context>", 1.0),  # twelve words
        ("a b c d e f g h i j k l m", "<context>a b c d e f g h i j k l m</context>", 0.0),  # thirteen
        ("Osric Hallam", [{"role": "user", "content": PASSAGE}], 1.0),  # a chat prompt
    ],
)
def test_grounding(answer, problem, expected):
    assert grounding_reward([chat(tagged(answer))], [problem]) == [expected]


def test_grounding_reads_only_the_answer_tag_and_scores_malformed_input_0():
    untagged = [chat("Osric Hallam"), chat(None), "not messages"]
    assert grounding_reward(untagged, [PASSAGE] * 3) == [0.0, 0.0, 0.0]
    assert grounding_reward([chat("<answer>Osric Hallam</answer>")], [None]) == [0.0]
    assert REWARD_FUNCS["grounding"] is grounding_reward


CANOE_REWARDS = {"accuracy": accuracy_reward, "format": format_reward, "influence": influence_reward,
                 "length": len_reward}


def test_registry_holds_the_four_canoe_rewards():
    # other rewards may be registered beside them (docs/reward-ideas.md); these four must be there as they are
    for name, fn in CANOE_REWARDS.items():
        assert REWARD_FUNCS[name] is fn


def test_the_docs_reward_idea_is_ideas_brevity_and_scores_by_its_rule(isolated_registry):
    """docs/reward-ideas.md's example is ideas/brevity.py as shipped, and a config naming the file registers it."""
    root = Path(__file__).resolve().parent.parent
    section = (root / "docs" / "reward-ideas.md").read_text().split("## Adding a reward", 1)[1]
    assert section.split("```python\n", 1)[1].split("```", 1)[0] == (root / "ideas" / "brevity.py").read_text()
    assert "brevity" not in REWARD_FUNCS
    assert "brevity" in known_rewards(Path("idea.toml"), [str(root / "ideas" / "brevity.py")])
    brevity = REWARD_FUNCS["brevity"]
    texts = ["<answer>Paris</answer>", "<answer> one two three four five </answer>",
             "<answer>one two three four five six</answer>"]
    assert brevity([chat(t) for t in texts], solution=["x"] * 3) == [1.0, 1.0, 0.0]
    # its own rule: a malformed input (None, no <answer> tag, an unclosed or empty one) scores 0
    malformed = [None, "Paris", "<think>t</think>", "<answer>Paris", "<answer>  </answer>", ""]
    assert brevity([chat(t) for t in malformed], solution=["x"] * 6) == [0.0] * 6


def test_trainer_kwargs_are_accepted(math_grader, tmp_path):
    # the trainer passes grader=, log_dir= and every dataset column to every reward
    common = dict(grader=math_grader, log_dir=str(tmp_path), solution=["<answer>1</answer>"],
                  problem=["<context>" + "x" * 10 + "</context>"], completions_long_answer=[None], extra_column=[1])
    completion = chat(tagged("1", long_answer="lllll"))  # 5 characters: between 20% and 80% of the 10 of the context
    expected = {"accuracy": [1.0], "format": [1.0], "influence": [0.0], "length": [1.0]}  # influence: no stage 2
    assert {name: fn([completion], **common) for name, fn in CANOE_REWARDS.items()} == expected


def issues_added(before: Counter) -> dict:
    return dict(REWARD_ISSUES - before)


@pytest.mark.parametrize(
    "name, args, expected, issues",
    [
        # not a list at all: nothing to score, counted once
        ("accuracy", (None, ["1"]), [], {"accuracy/malformed": 1}),
        ("format", ("a string",), [], {"format/malformed": 1}),
        ("influence", (42, ["1"], [None]), [], {"influence/malformed": 1}),
        ("length", ({"content": "x"}, ["<context>x</context>"]), [], {"length/malformed": 1}),
        # malformed entries score 0 and are counted once per batch; the well-formed one is scored
        ("format", ([chat(tagged("c")), None, [{"content": 42}], []],), [1.0, 0.0, 0.0, 0.0], {"format/malformed": 1}),
        ("length", ([chat(tagged("a", long_answer="y" * 50)), chat(None)], [CONTEXT_100] * 2), [1.0, 0.0],
         {"length/malformed": 1}),
        # a malformed completion and a short solution column: two problems, each counted
        ("accuracy", ([chat("1"), "bare", chat("2")], ["1", "2"]), [1.0, 0.0, 0.0], {"accuracy/malformed": 2}),
        # a column of the wrong length is padded with None (0.0) and counted
        ("length", ([chat(tagged("a", long_answer="y" * 50))] * 2, None), [0.0, 0.0], {"length/malformed": 1}),
        # influence counts each malformed stage-2 completion (None is no stage 2, not malformed) and a short column
        ("influence", ([chat("x")] * 4, ["<answer>1</answer>"] * 4,
                       [None, chat("<answer>1</answer>"), "text", chat(None)]), [0.0, 1.0, 0.0, 0.0],
         {"influence/malformed": 2}),
        ("influence", ([chat("x")] * 2, ["<answer>1</answer>"] * 2, [chat("<answer>1</answer>")]), [1.0, 0.0],
         {"influence/malformed": 1}),
        # missing tags are ordinary wrong answers: 0.0, not counted
        ("length", ([chat("no tags")], [CONTEXT_100]), [0.0], {}),
        ("format", ([chat("<think>a</think><answer>c</answer>")],), [0.0], {}),
    ],
)
def test_malformed_inputs_score_zero_and_are_counted(name, args, expected, issues, math_grader):
    before = Counter(REWARD_ISSUES)
    kwargs = {"grader": math_grader} if name == "accuracy" else {}
    assert CANOE_REWARDS[name](*args, **kwargs) == expected
    assert issues_added(before) == issues


def test_a_bug_in_a_reward_propagates():
    class BrokenGrader:
        def equivalent_batch(self, golds, preds):
            raise ValueError("bug in the grader")

    before = Counter(REWARD_ISSUES)
    with pytest.raises(ValueError, match="bug in the grader"):
        accuracy_reward([chat("1"), chat("2")], ["1", "2"], grader=BrokenGrader())
    assert issues_added(before) == {}  # a bug is not a malformed input: nothing counted, nothing scored


def test_a_bug_in_a_helper_propagates(monkeypatch):
    def broken(text, tag):
        raise RuntimeError("bug in tag_content")

    monkeypatch.setattr(rewards, "tag_content", broken)
    with pytest.raises(RuntimeError, match="bug in tag_content"):
        len_reward([chat(tagged("a"))], ["<context>x</context>"])


def test_a_registered_reward_that_raises_propagates(monkeypatch):
    def crashing_reward(completions, **kwargs):
        return [1.0 / len(c[0]["content"]) for c in completions]  # ZeroDivisionError on an empty text

    monkeypatch.setitem(REWARD_FUNCS, "crashing", crashing_reward)
    with pytest.raises(ZeroDivisionError):
        REWARD_FUNCS["crashing"]([chat("")])


def test_r1_ground_truth_types(math_grader):
    response = "<think>r</think> <answer>5</answer>"
    assert r1_zero_reward_fn(response, ["4", "5"], grader=math_grader)["reward"] == 1.0
    for bad in (None, {"a": 1}, ("5",), ["5", 5], True):
        with pytest.raises(TypeError):
            r1_zero_reward_fn(response, bad)


# ------------------------------------------------------------------------------------------------ debug log


def test_debug_log(monkeypatch, tmp_path, math_grader):
    monkeypatch.setenv("DEBUG_MODE", "true")
    monkeypatch.delenv("LOG_PATH", raising=False)
    accuracy_reward([chat(tagged("42")), chat("\ud800")], ["<answer>42</answer>"] * 2, grader=math_grader,
                    log_dir=str(tmp_path))
    influence_reward([chat("x")], ["<answer>42</answer>"], [chat("<answer>42</answer>")], log_dir=str(tmp_path))
    accuracy_log = (tmp_path / "accuracy_reward.log").read_text()
    assert re.search(r"^-+ \d{4}-\d\d-\d\d [\d:.]+ Accuracy reward: 1\.0 -+$", accuracy_log, re.M)
    assert "Accuracy reward: 0.0" in accuracy_log and "Content: \\ud800" in accuracy_log
    assert "Solution: <answer>42</answer>\n\n" in accuracy_log
    influence_log = (tmp_path / "influence_accuracy_reward.log").read_text()
    assert "influence_Accuracy reward: 1.0" in influence_log

    monkeypatch.setenv("LOG_PATH", str(tmp_path / "all.log"))
    influence_reward([chat("x")], ["<answer>1</answer>"], [None])
    assert "influence_Accuracy reward: 0.0" in (tmp_path / "all.log").read_text()


def test_no_log_without_debug_mode(monkeypatch, tmp_path, math_grader):
    monkeypatch.delenv("DEBUG_MODE", raising=False)
    accuracy_reward([chat("1")], ["1"], grader=math_grader, log_dir=str(tmp_path))
    assert list(tmp_path.iterdir()) == []


# ------------------------------------------------------------------------------------------------ hostile input

MEGABYTE = "x" * 1_000_000
HOSTILE_TEXTS = [
    None,
    42,
    3.5,
    ["nested", ["list"]],
    {"content": "not in a list"},
    "",
    "<answer>",
    "</answer><answer>",
    "<answer>" * 100_000,
    "<think>" + MEGABYTE + "</think><long_answer>" + MEGABYTE + "</long_answer><answer>1</answer>",
    "<answer>" + MEGABYTE + "</answer>",
    "<answer>" + "\\frac{" * 10_000 + "</answer>",
    "<answer>" + "(" * 300 + "1" + ")" * 300 + "</answer>",
    "<answer>\ud800</answer>",
    "\ud800\udfff\x00",
    "<answer>9^{9^{9^{9}}}</answer>",
    "<answer>1" + " " * 100_000 + "</answer>",
]


def hostile_entries():
    """Completion entries of every broken shape: the text itself, and texts inside well-formed messages."""
    entries = [None, 42, "bare string", [], [None], [{"role": "assistant"}], [{"content": 42}]]
    return entries + [chat(text) for text in HOSTILE_TEXTS]


def test_hostile_inputs_give_zero_and_never_raise(math_grader):
    entries = hostile_entries()
    n = len(entries)
    before = Counter(REWARD_ISSUES)
    start = time.monotonic()
    results = {
        "accuracy": accuracy_reward(entries, ["<answer>1</answer>"] * n, grader=math_grader),
        "format": format_reward(entries),
        "influence": influence_reward(entries, ["<answer>1</answer>"] * n, entries),
        "length": len_reward(entries, ["<context>" + "x" * 10 + "</context>"] * n),
        "accuracy_bad_solution": accuracy_reward(entries, ([None, 1, ["x"]] * n)[:n], grader=math_grader),
    }
    assert time.monotonic() - start < 10.0 + LOADED_S
    for name, values in results.items():
        assert len(values) == n, name
        assert set(values) <= {0.0, 1.0}, name
    # two hostile texts are in fact right: the megabyte one is well formed, and "1" padded with spaces strips to 1
    well_formed, padded = (entries.index(chat(t)) for t in (HOSTILE_TEXTS[9], HOSTILE_TEXTS[16]))
    assert results["format"] == [1.0 if i == well_formed else 0.0 for i in range(n)]
    assert results["accuracy"] == [1.0 if i in (well_formed, padded) else 0.0 for i in range(n)]
    assert results["accuracy_bad_solution"] == [0.0] * n
    for name in ("accuracy", "format", "influence", "length"):
        assert REWARD_FUNCS[name](None, solution=None, completions_long_answer=None, problem=None) == []
    # Counted, exactly: once per batch holding a malformed completion (accuracy twice, format, length), once per
    # malformed stage-2 entry (the 6 broken shapes after the leading None, which means "no stage 2", and the 5
    # non-string texts of HOSTILE_TEXTS), and once per None batch.
    assert issues_added(before) == {"accuracy/malformed": 2 + 1, "format/malformed": 1 + 1,
                                    "influence/malformed": 6 + 5 + 1, "length/malformed": 1 + 1}


def test_hostile_r1_inputs(math_grader):
    errors_before = math_grader.errors
    for text in HOSTILE_TEXTS:
        for fast in (True, False):
            response = text if not isinstance(text, str) else f"<think>r</think> <answer>{text}</answer>"
            start = time.monotonic()
            result = r1_zero_reward_fn(response, "1", fast=fast, grader=math_grader)
            assert time.monotonic() - start < DEADLINE_S + 3.0 + LOADED_S  # + a replacement worker's start-up
            assert set(result.values()) <= {0.0, 1.0}
    assert math_grader.errors == errors_before  # no job raised: odd input is handled, not an error


PIECES = st.sampled_from(
    ["<answer>", "</answer>", "<think>", "</think>", "<long_answer>", "</long_answer>", "\\frac{", "\\sqrt", "{", "}",
     "^", "9", "1", "0", ".", ",", "-", ":", "x", "A", "Paris", " ", "\n", "$", "\\", "\ud800", "\\boxed{", "(", ")",
     "[", "]", "\\text{", "=", "%", "\\pi", "e"]
)
HOSTILE_TEXT = st.one_of(st.lists(PIECES, max_size=30).map("".join), st.text(max_size=60))


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(st.tuples(HOSTILE_TEXT, HOSTILE_TEXT), min_size=1, max_size=4))
def test_property_rewards_never_raise_nor_overrun(math_grader, samples):
    completions = [chat(text) for text, _ in samples]
    solutions = [gold for _, gold in samples]
    n = len(samples)
    before = Counter(REWARD_ISSUES)
    grader_errors_before = math_grader.errors
    start = time.monotonic()
    for name, fn in REWARD_FUNCS.items():
        values = fn(completions, solution=solutions, completions_long_answer=completions, problem=solutions,
                    grader=math_grader)
        assert len(values) == n and set(values) <= {0.0, 1.0}, name
    # each math pair runs under the deadline; a killed worker's replacement may add its start-up once
    assert time.monotonic() - start < n * (DEADLINE_S + 0.5) + 3.0 + LOADED_S
    assert math_grader.slowest_s < DEADLINE_S + LOADED_S
    assert issues_added(before) == {}  # every input here is in the documented shape
    gold, pred = samples[0]
    result = r1_zero_reward_fn(f"<think>r</think> <answer>{pred}</answer>", gold, fast=False, grader=math_grader)
    assert set(result.values()) <= {0.0, 1.0}
    assert math_grader.errors == grader_errors_before


MATH_PIECES = st.sampled_from(
    ["\\frac", "\\sqrt", "[3]", "{", "}", "(", ")", "[", "]", "^", "-", "+", "*", "/", "0", "1", "9", ".", ",",
     "x", "y", "\\pi", "\\infty", "\\cdot", " ", "\\{", "\\}", "%", "\\circ", "\\text{", "=", "\\left(",
     "\\right)", "\\boxed{", "\\dfrac", "e", "10^{"]
)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(MATH_PIECES, max_size=16).map("".join), st.lists(MATH_PIECES, max_size=16).map("".join))
def test_property_r1_math_like_input(math_grader, answer, gold):
    errors_before = math_grader.errors
    for fast in (True, False):
        result = r1_zero_reward_fn(f"<think>r</think> <answer>{answer}</answer>", gold, fast=fast, grader=math_grader)
        assert set(result.values()) <= {0.0, 1.0}
    assert math_grader.errors == errors_before  # sympy or math-verify raising would be a bug in our parser
