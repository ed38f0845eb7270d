"""The CANOE paper's short-form benchmarks, read and scored exactly as the official evaluation scripts do.

CANOE (arXiv 2505.16483) reports EM / accuracy on ConFiQA (QA, MR, MC), FiQA, CNQ, FaithEval and FollowRAG; a user
who has their files runs `canoe.py --eval --suite NAME --eval-file PATH` (evaluate.py runs the model and writes the
table). Here are the pure parts: each suite's reader, its user turn (prompt A or B, verbatim), the answer's
extraction, SQuAD's normalisation and the scores, all by the rules of `eval/**/evaluation_ours*.py` of the CANOE
repository, quirks included (each named where it lives):

| suite | file | user turn | gold | scores |
|---|---|---|---|---|
| confiqa | `ConFiQA-{QA,MR,MC}-test.json` (a JSON list) | A(`cf_context`, `question`) | `cf_answer` + `cf_alias` | em, ps, po, mr |
| fiqa | the same files | A(`orig_context`, `question`) | `orig_answer` + `orig_alias` | em, ps, po, mr |
| cnq | `conflict_dev_filtered.json` (a JSON list) | A(`context`, `question`) | `answer` | em |
| faitheval | FaithEval-counterfactual, split `test` | B(`context`, `question`, `choices`) | see `faitheval_golds` | acc, acc_fixed |
| followrag | `{hq,nq,tq,webq}.json` (JSON lists) | A(cut of `prompt`, `question`) | `answer_gold` split on "/" | em |

FiQA swaps ConFiQA's roles: its gold is the original answer, its "other" (p_o) the counterfactual one. Scores are
percentages over every item. Unlike the official arithmetic (invisible at two decimals): we divide by n, not
n + 1e-5, and refuse an empty file; MR is 0 when ps + po = 0 (the official value too) instead of dividing by
ps + po + 1e-10.
"""

from __future__ import annotations

import re
import string
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from data import DataError, load_records, read_json_list
# Prompt A (ConFiQA, FiQA, CNQ, FollowRAG), formatted with (context, question): no spaces inside the tags, a
# space after "words." and after the newline, none after "Question:".
PROMPT_A = (
    "<context>{}</context>\n\nRefer to the passages above, first think about the reasoning process internally and "
    "then answer the following question with just a few words. \n Question:{}"
)
# Prompt B (FaithEval), formatted with (context, question): spaces inside the tags; the options follow.
PROMPT_B = (
    "<context> {} </context>\n\nPlease select the correct option according to the question, and just output the "
    "option letter (e.g. A/B/C/D) Question: {}\n"
)


def indent_system_prompt(system_prompt: str) -> str:
    """The evaluation scripts' system prompt: the training one with every non-empty line indented by 4 spaces."""
    return "\n".join("    " + line if line.strip() else line for line in system_prompt.split("\n"))


def faitheval_prompt(context: str, question: str, labels: Sequence[str], texts: Sequence[str]) -> str:
    """Prompt B, then "Options: \\n", then the options as "{label}: {text}" joined by a newline and a space."""
    options = "\n ".join(f"{label}: {text}" for label, text in zip(labels, texts))
    return PROMPT_B.format(context, question) + "Options: \n" + options


# Without DOTALL, as in the official scripts: a section with a newline inside does not match, and the fallback
# (the whole stripped output) is used instead. Our training rewards read sections with DOTALL (tags.py).
_SECTION_RES = {name: re.compile(f"<{name}>(.*?)</{name}>") for name in ("think", "long_answer", "answer")}


def extract(output: str) -> dict[str, str]:
    """`think`, `long_answer` and `answer` of a model output, the official way: each the first non-DOTALL match of
    `<tag>(.*?)</tag>` in the stripped output, stripped; with no match, the whole stripped output.

    >>> extract("<answer>Ro\\nme</answer>")["answer"]
    '<answer>Ro\\nme</answer>'
    """
    text = output.strip()
    matches = {name: pattern.search(text) for name, pattern in _SECTION_RES.items()}
    return {name: match.group(1).strip() if match else text for name, match in matches.items()}


def has_answer_span(output: str) -> bool:
    """Whether `extract` finds an `<answer>` span rather than falling back to the whole output (not an official
    score: printed beside them so that a zero EM caused by the format shows at once)."""
    return _SECTION_RES["answer"].search(output.strip()) is not None


def answer_share(outputs: Sequence[str]) -> float:
    """The share (0-1) of outputs that hold an `<answer>` span (`has_answer_span`); ValueError if none."""
    if not outputs:
        raise ValueError("no outputs")
    return sum(map(has_answer_span, outputs)) / len(outputs)


_ARTICLES_RE = re.compile(r"\b(a|an|the)\b")
_PUNCTUATION = frozenset(string.punctuation)


def normalize(text: str) -> str:
    """SQuAD's normalisation: lowercase, delete ASCII punctuation, articles to spaces, collapse whitespace.

    Punctuation is deleted, not replaced ("Cluj-Napoca" → "clujnapoca"); only `string.punctuation` counts (a curly
    quote stays). A lone option letter "A" is an article and normalises to "".
    """
    no_punct = "".join(ch for ch in text.lower() if ch not in _PUNCTUATION)
    return " ".join(_ARTICLES_RE.sub(" ", no_punct).split())


# The official negation list (ConFiQA/FiQA only).
NEGATION_WORDS = ("no", "not", "never", "none", "cannot", "nobody", "nothing", "nowhere", "neither", "nor",
                  "without", "hardly")


def _negated(text: str) -> bool:
    return any(word in text.split() for word in NEGATION_WORDS)


def exact_match(prediction: str, golds: Sequence[str], negation_guard: bool) -> bool:
    """The official EM: the normalised prediction equals a normalised gold, and (with the guard) the RAW prediction
    has no negation word. The guard is case-sensitive and keeps punctuation attached, so "No" and "nothing." slip
    through it, as in the official scripts."""
    if negation_guard and _negated(prediction):
        return False
    pred = normalize(prediction)
    return any(pred == normalize(gold) for gold in golds)


def recall(prediction: str, golds: Sequence[str], negation_guard: bool) -> bool:
    """The official recall: some normalised gold is a substring of the normalised prediction, and (with the
    guard) the NORMALISED prediction has no negation word. A substring, not a word: "ian" is in "brian"."""
    pred = normalize(prediction)
    if negation_guard and _negated(pred):
        return False
    return any(normalize(gold) in pred for gold in golds)


def faitheval_golds(answer_key: str, labels: Sequence[str], texts: Sequence[str]) -> list[str]:
    """The official FaithEval gold list, bug included: the key, then for EVERY option "label: text" and text, so
    that naming any option's text scores, right or wrong (`faitheval_fixed` scores without the bug)."""
    golds = [answer_key]
    for label, text in zip(labels, texts):
        golds += [f"{label}: {text}", text]
    return golds


def faitheval_fixed(prediction: str, answer_key: str, labels: Sequence[str], texts: Sequence[str]) -> bool:
    """FaithEval scored right: the key letter, or the key's text, or "key: text" (any of them alone).

    The letter is compared lowercased without punctuation and spaces ("(C)" and "C." are C; SQuAD's normalisation
    would turn "A" into "", so an empty answer would score when the key is A); the texts with SQuAD's
    normalisation. An empty prediction never scores.
    """
    letter = "".join(ch for ch in prediction.lower() if ch not in _PUNCTUATION and not ch.isspace())
    if letter and letter == answer_key.lower():
        return True
    pred = normalize(prediction)
    key_text = dict(zip(labels, texts)).get(answer_key)
    if not pred or key_text is None:
        return False
    return pred in (normalize(key_text), normalize(f"{answer_key}: {key_text}"))


@dataclass(frozen=True)
class Item:
    """One benchmark record, read the official way. `problem` is the user turn; `golds` the accepted answers;
    `others` the competing ones (ConFiQA/FiQA's other answers, NQ-Swap's original ones, else empty); `key`,
    `labels` and `texts` FaithEval's answer key and options."""

    index: int
    id: Any
    question: str
    problem: str
    golds: tuple[str, ...]
    others: tuple[str, ...] = ()
    key: str = ""
    labels: tuple[str, ...] = ()
    texts: tuple[str, ...] = ()


def _field(record: dict, name: str, kind: type, where: str) -> Any:
    value = record.get(name)
    if not isinstance(value, kind):
        raise DataError(f"{where}: field {name!r} missing or not a {kind.__name__}")
    return value


def _confiqa_item(index: int, record: dict, where: str, factual: bool) -> Item:
    question = _field(record, "question", str, where)
    cf = [_field(record, "cf_answer", str, where), *_field(record, "cf_alias", list, where)]
    orig = [_field(record, "orig_answer", str, where), *_field(record, "orig_alias", list, where)]
    context = _field(record, "orig_context" if factual else "cf_context", str, where)
    if not all(isinstance(answer, str) for answer in cf + orig):
        raise DataError(f"{where}: 'cf_alias' and 'orig_alias' must be lists of strings")
    golds, others = (orig, cf) if factual else (cf, orig)
    return Item(index, record.get("id", index), question, PROMPT_A.format(context, question), tuple(golds),
                tuple(others))


def _cnq_item(index: int, record: dict, where: str) -> Item:
    # `org_answer` (NQ-Swap's original answers, a string or a list; absent from CANOE's file) becomes `others`, to
    # count the memorised answer winning over the passage; the official em never reads it.
    question = _field(record, "question", str, where)
    context = _field(record, "context", str, where)
    original = record.get("org_answer", [])
    original = [original] if isinstance(original, str) else original
    if not (isinstance(original, list) and all(isinstance(answer, str) for answer in original)):
        raise DataError(f"{where}: 'org_answer' must be a string or a list of strings")
    return Item(index, record.get("uid", index), question, PROMPT_A.format(context, question),
                (_field(record, "answer", str, where),), tuple(original))


FOLLOWRAG_START = "Given the following information:"
FOLLOWRAG_END = "Answer the following question"


def followrag_context(prompt: str) -> str:
    """FollowRAG's passages: the official `prompt.split(START)[1].split(END)[0].strip()`."""
    return prompt.split(FOLLOWRAG_START)[1].split(FOLLOWRAG_END)[0].strip()


def _followrag_item(index: int, record: dict, where: str) -> Item:
    question = _field(record, "question", str, where)
    prompt = _field(record, "prompt", str, where)
    if FOLLOWRAG_START not in prompt:
        raise DataError(f"{where}: 'prompt' lacks {FOLLOWRAG_START!r}, where the passages begin")
    gold = _field(record, "answer_gold", str, where)
    # Every "/" splits, even one inside an answer, as in the official script.
    golds = gold.split("/") if "/" in gold else [gold]
    return Item(index, record.get("key", index), question, PROMPT_A.format(followrag_context(prompt), question),
                tuple(golds))


def _faitheval_item(index: int, record: dict, where: str) -> Item:
    question = _field(record, "question", str, where)
    context = _field(record, "context", str, where)
    key = _field(record, "answerKey", str, where)
    choices = _field(record, "choices", dict, where)
    labels, texts = choices.get("label"), choices.get("text")
    if not (isinstance(labels, list) and isinstance(texts, list) and len(labels) == len(texts)):
        raise DataError(f"{where}: 'choices' must hold two lists of equal length, 'label' and 'text'")
    return Item(index, record.get("id", index), question, faitheval_prompt(context, question, labels, texts),
                tuple(faitheval_golds(key, labels, texts)), key=key, labels=tuple(labels), texts=tuple(texts))


SUITES = ("confiqa", "fiqa", "cnq", "faitheval", "followrag")
_READERS = {
    "confiqa": lambda i, r, w: _confiqa_item(i, r, w, factual=False),
    "fiqa": lambda i, r, w: _confiqa_item(i, r, w, factual=True),
    "cnq": _cnq_item,
    "faitheval": _faitheval_item,
    "followrag": _followrag_item,
}


def read_suite(suite: str, path: str | Path) -> list[Item]:
    """Every record of `path` as an Item of `suite`; a bad record is a DataError naming its index. A `.json` file is
    a JSON list, as the official scripts read it; any other, what `data.load_records` reads (FaithEval from the hub:
    parquet, JSONL, a `save_to_disk` folder)."""
    if suite not in _READERS:
        raise ValueError(f"unknown suite {suite!r}; choose from {SUITES}")
    records = read_json_list(path) if Path(path).suffix.lower() == ".json" else load_records(path, split="test")
    if not records:
        raise DataError(f"{path}: no records")
    items = []
    for index, record in enumerate(records):
        where = f"{path}: item {index}"
        if not isinstance(record, dict):
            raise DataError(f"{where}: expected an object, got {type(record).__name__}")
        items.append(_READERS[suite](index, record, where))
    return items


# The score names the official scripts print, per suite; acc_fixed is ours (FaithEval scored without the bug).
METRICS = {"confiqa": ("em", "ps", "po", "mr"), "fiqa": ("em", "ps", "po", "mr"), "cnq": ("em",),
           "faitheval": ("acc", "acc_fixed"), "followrag": ("em",)}


def item_hits(suite: str, item: Item, prediction: str) -> dict[str, bool]:
    """What one prediction (an extracted answer) scores on one item, per counted metric."""
    if suite in ("confiqa", "fiqa"):
        gold = recall(prediction, item.golds, negation_guard=True)
        other = recall(prediction, item.others, negation_guard=False)
        return {"em": exact_match(prediction, item.golds, negation_guard=True), "ps": gold and not other,
                "po": other}
    if suite == "faitheval":
        return {"acc": exact_match(prediction, item.golds, negation_guard=False),
                "acc_fixed": faitheval_fixed(prediction, item.key, item.labels, item.texts)}
    return {"em": exact_match(prediction, item.golds, negation_guard=False)}  # cnq, followrag: no guard


def score(suite: str, items: Sequence[Item], predictions: Sequence[str]) -> dict[str, float]:
    """The suite's scores in percent over every item; ConFiQA/FiQA add MR = po / (ps + po) × 100."""
    if not items or len(items) != len(predictions):
        raise ValueError(f"need one prediction per item, got {len(predictions)} for {len(items)} items")
    hits = [item_hits(suite, item, pred) for item, pred in zip(items, predictions)]
    scores = {name: 100.0 * sum(h[name] for h in hits) / len(hits) for name in hits[0]}
    if "po" in scores:
        total = scores["ps"] + scores["po"]
        scores["mr"] = 100.0 * scores["po"] / total if total else 0.0
    return {"n": len(items), **{name: scores[name] for name in METRICS[suite]}}


RUNNING_PRINT_SUITES = ("confiqa", "fiqa", "faitheval")
OFFICIAL_PRINT_EVERY = 100


def official_last_printed(suite: str, items: Sequence[Item], predictions: Sequence[str]) -> dict | None:
    """{"items": m, "scores": the scores over the first m = n // 100 * 100 items}: the figure the official ConFiQA,
    FiQA and FaithEval scripts (RUNNING_PRINT_SUITES) last print, since they print the running score after every
    100th item and only then; to compare with a paper's table. None for other suites and files of <= 100 items."""
    if suite not in RUNNING_PRINT_SUITES or len(items) <= OFFICIAL_PRINT_EVERY:
        return None
    m = len(items) // OFFICIAL_PRINT_EVERY * OFFICIAL_PRINT_EVERY
    scores = score(suite, items[:m], predictions[:m])
    return {"items": m, "scores": {name: value for name, value in scores.items() if name != "n"}}
