"""Tests for tags.py: `tag_content` gives exactly what the regex `<tag>(.*?)</tag>` (DOTALL, stripped) gives,
`replace_content` rewrites that regex's first match, and `answer_span` falls back to the whole text; the rewards,
rollout.py and data.py all read tags through them."""

from __future__ import annotations

import doctest
import re
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from conftest import LOADED_S

import data
import rewards
import rollout
from grading import tags
from grading.tags import answer_span, replace_content, tag_content


def regex_content(text: str, tag: str) -> str | None:
    match = re.search(f"<{tag}>(.*?)</{tag}>", text, re.DOTALL)
    return match.group(1).strip() if match else None


@pytest.mark.parametrize(
    "text, span",
    [
        ("<answer> Paris </answer>", "Paris"),
        ("<think>no</think><answer>a\nb</answer><answer>c</answer>", "a\nb"),
        ("  plain text ", "plain text"),
        ("<answer>unclosed", "<answer>unclosed"),
        ("<answer></answer>", ""),
        ("</answer><answer>x</answer>", "x"),
        ("<answer><answer>x</answer>", "<answer>x"),
    ],
)
def test_answer_span(text, span):
    assert answer_span(text) == span


PIECES = st.sampled_from(["<answer>", "</answer>", "<answer", "answer>", "<context>", "</context>", "<long_answer>",
                          "</long_answer>", " ", "\n", "x", "<", ">", "/", "\u2028"])


@settings(max_examples=500, deadline=None)
@given(st.lists(PIECES, max_size=16).map("".join), st.sampled_from(["answer", "context", "long_answer"]))
def test_tag_content_is_the_regex(text, tag):
    assert tag_content(text, tag) == regex_content(text, tag)


@settings(max_examples=500, deadline=None)
@given(st.lists(PIECES, max_size=16).map("".join), st.sampled_from(["x", r"\1 </context>", ""]))
def test_replace_content_is_the_regex(text, content):
    # the block stage 2 rewrote before tags.replace_content: the regex's first match, replaced literally
    match = re.search(r"<context>.*?</context>", text, re.DOTALL)
    expected = None if match is None else text[: match.start()] + f"<context>{content}</context>" + text[match.end() :]
    assert replace_content(text, "context", content) == expected


def test_tag_content_is_linear_on_unclosed_tags():
    text = "<answer>" * 200_000
    start = time.monotonic()
    assert answer_span(text) == text
    assert time.monotonic() - start < 1.0 + LOADED_S  # a quadratic scan of 200 000 tags takes minutes


def test_one_rule_everywhere():
    # the names the other files use are this module's functions, not copies
    assert rewards.answer_span is answer_span and data.answer_span is answer_span
    assert rewards.tag_content is tag_content and rollout.tag_content is tag_content and data.tag_content is tag_content
    assert rollout.replace_content is replace_content


def test_doctests():
    result = doctest.testmod(tags)
    assert result.attempted > 0 and result.failed == 0
