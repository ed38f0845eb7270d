"""Reading the tagged sections of a CANOE text: `<think>`, `<long_answer>`, `<answer>`, `<context>`.

The content of a section is the first `<tag>(.*?)</tag>` match (DOTALL), stripped; an opening tag without a closing
one is no section. Sections are found with two `str.find` calls, not the regex, which is quadratic on a megabyte of
unclosed tags."""

from __future__ import annotations


def _content_bounds(text: str, tag: str) -> tuple[int, int] | None:
    # The regex's leftmost match opens at the first `<tag>`: if no `</tag>` follows it, none follows a later one.
    start = text.find(f"<{tag}>")
    end = -1 if start < 0 else text.find(f"</{tag}>", start + len(tag) + 2)
    return None if end < 0 else (start + len(tag) + 2, end)


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
    """`text` with the content of the section `tag_content` reads replaced by `content` (literally); None if
    there is no such section.

    >>> replace_content("<context>old</context>\\n\\nQ? <context>x</context>", "context", "new")
    '<context>new</context>\\n\\nQ? <context>x</context>'
    """
    bounds = _content_bounds(text, tag)
    return None if bounds is None else text[: bounds[0]] + content + text[bounds[1] :]


def answer_span(text: str) -> str:
    """The *answer span* of a text, as CANOE's rewards read both the completion and the gold solution: the first
    `<answer>` content, stripped; the whole text stripped if there is none.

    >>> answer_span("<think>7</think><answer> 42 </answer><answer>43</answer>"), answer_span(" 42 ")
    ('42', '42')
    """
    inside = tag_content(text, "answer")
    return text.strip() if inside is None else inside
