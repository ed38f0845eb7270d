"""Reading the tagged sections of a CANOE text: `<think>`, `<long_answer>`, `<answer>`, `<context>`.

One rule for every file that reads them (rewards.py, rollout.py, data.py): the content of a section is the first
`<tag>(.*?)</tag>` match (DOTALL: it may span lines), stripped; an opening tag without a closing one is no
section. The *answer span* of a text is its first `<answer>` section, or the whole text stripped when it has
none; CANOE's rewards read both the completion and the gold `solution` this way (the original code,
`code/train/src/open_r1/grpo.py`, `accuracy_reward` and `influence_reward`). `replace_content` rewrites that same
first section: stage 2 puts the long answer in place of the `<context>` that data.py checked and the length reward
measures.

`tag_content` gives exactly what that regular expression gives, but with two `str.find` calls, so it stays linear
on hostile text (a megabyte of unclosed `<answer>` tags makes the lazy regex quadratic).
"""

from __future__ import annotations


def _content_bounds(text: str, tag: str) -> tuple[int, int] | None:
    """Where the first section's content lies in `text`, unstripped: `text[start:end]` is the regex's group 1."""
    # The regex's leftmost match opens at the first `<tag>`: if no `</tag>` follows it, none follows a later one.
    start = text.find(f"<{tag}>")
    if start < 0:
        return None
    start += len(tag) + 2
    end = text.find(f"</{tag}>", start)
    return None if end < 0 else (start, end)


def tag_content(text: str, tag: str) -> str | None:
    """First `<tag>(.*?)</tag>` of `text` (DOTALL), stripped; None if there is none.

    >>> tag_content("<think>t</think><long_answer> L1\\nL2 </long_answer>", "long_answer")
    'L1\\nL2'
    >>> tag_content("<answer>unclosed", "answer") is None
    True
    """
    bounds = _content_bounds(text, tag)
    return None if bounds is None else text[bounds[0] : bounds[1]].strip()


def replace_content(text: str, tag: str, content: str) -> str | None:
    """`text` with the content of its first `<tag>` section (the one `tag_content` reads) replaced by `content`,
    inserted literally; None if there is no such section.

    >>> replace_content("<context>old</context>\\n\\nQ? <context>x</context>", "context", "new")
    '<context>new</context>\\n\\nQ? <context>x</context>'
    """
    bounds = _content_bounds(text, tag)
    return None if bounds is None else text[: bounds[0]] + content + text[bounds[1] :]


def answer_span(text: str) -> str:
    """The first `<answer>` content, stripped; the whole text stripped if there is none.

    >>> answer_span("<think>7</think><answer> 42 </answer><answer>43</answer>"), answer_span(" 42 ")
    ('42', '42')
    """
    inside = tag_content(text, "answer")
    return text.strip() if inside is None else inside
