"""Data for CANOE's Dual-GRPO: loading training rows, rendering prompts, per-rank batching, answer matching.

A training row is `{"problem": "<context>…</context>\\n\\nQuestion", "solution": "<answer>…</answer>", ...}`;
extra fields are kept and reach the reward functions as keyword arguments. `exact_match` is the answer match of
the synthetic evaluation and of `faithfulness/em`. Evaluation sets in other shapes are evaluation/loaders.py's.

    python -m synthetic.synth --out data/synth                  # the synthetic training data (synthetic/synth.py)
    python -m evaluation.loaders check FILE [--tokenizer DIR]   # check a data file, report its prompt lengths
"""

from __future__ import annotations

import json
import random
import re
import string
import unicodedata
import warnings
import zlib
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from grading.tags import answer_span, tag_content  # answer_span: re-exported, read as data.answer_span

# --- 1. Loading -----------------------------------------------------------------------------------------------

REQUIRED_FIELDS = ("problem", "solution")
_MAX_LISTED = 20  # error messages list at most this many bad lines/rows, then a count


class DataError(ValueError):
    """A data file or row that cannot be used; the message names the file, the line and the reason."""


def problem_reason(problem: str) -> str | None:
    """Why `problem` cannot be used (no context block, empty context), or None if it can."""
    context = tag_content(problem, "context")
    if context is None:
        return "'problem' has no <context>...</context> block"
    if not context:  # the length reward needs a context, and a faithfulness item without one teaches nothing
        return "'problem' has an empty <context></context> block"
    return None


def _record_reason(record: Any) -> str | None:
    if not isinstance(record, dict):
        return f"expected a JSON object, got {type(record).__name__}"
    for name in REQUIRED_FIELDS:
        if name not in record:
            return f"missing field '{name}'"
        if not isinstance(record[name], str):
            return f"field '{name}' must be a string, got {type(record[name]).__name__}"
    return problem_reason(record["problem"])


def _listed(items: Sequence[str], separator: str) -> str:
    more = [f"... and {len(items) - _MAX_LISTED} more"] if len(items) > _MAX_LISTED else []
    return separator.join([*items[:_MAX_LISTED], *more])


def raise_collected(path: Path, errors: list[str], what: str) -> None:
    """Raise one DataError listing the collected errors (the first _MAX_LISTED, then a count), if there are any."""
    if errors:
        listed = _listed(errors, "\n  ")
        raise DataError(f"{path}: {len(errors)} malformed {what}:\n  {listed}")


def _read_bytes(path: str | Path) -> tuple[Path, bytes]:
    path = Path(path)
    try:
        return path, path.read_bytes()
    except FileNotFoundError:
        raise DataError(f"{path}: data file not found") from None
    except OSError as err:
        raise DataError(f"{path}: cannot read data file ({err.strerror or err})") from err


def load_jsonl(path: str | Path) -> list[dict]:
    """Load a JSONL file of {problem, solution, ...} records; raise DataError naming every bad line. Blank lines
    are allowed only after the last record, so record i is always line i + 1."""
    path, raw = _read_bytes(path)
    # bytes.splitlines splits on \\n, \\r\\n and \\r only; str.splitlines would also split inside JSON strings at
    # U+2028 and similar characters, which JSON allows unescaped.
    lines = raw.removeprefix(b"\xef\xbb\xbf").splitlines()  # without the UTF-8 byte-order mark some editors write
    while lines and not lines[-1].strip():
        lines.pop()
    if not lines:
        raise DataError(f"{path}: no records (the file is empty or only blank lines)")
    parsed = [_parse_line(line) for line in lines]  # (record, reason it is bad or None)
    raise_collected(path, [f"{path}:{number}: {reason}" for number, (_, reason) in enumerate(parsed, 1) if reason],
                    "line(s)")
    return [record for record, _ in parsed]


def _parse_line(line: bytes) -> tuple[Any, str | None]:
    if not line.strip():
        return None, "blank line (blank lines are allowed only at the end of the file)"
    try:
        record = json.loads(line.decode("utf-8"))
    except UnicodeDecodeError:
        return None, "not valid UTF-8"
    except json.JSONDecodeError as err:
        return None, f"not valid JSON ({err.msg} at column {err.colno})"
    return record, _record_reason(record)


def load_records(path: str | Path, split: str | None = None) -> list[dict]:
    """The rows of a parquet, JSON or JSONL file, or of a `datasets` folder, as plain dicts; no field is checked.

    A `save_to_disk` folder holding several splits gives `split` (or its only one); any other folder is read as a
    folder of data files (e.g. one downloaded from the hub)."""
    import datasets  # heavy; only these formats need it

    path = Path(path)
    if not path.exists():
        raise DataError(f"{path}: data file not found")
    if not path.is_dir() and path.suffix.lower() not in (".parquet", ".json", ".jsonl"):
        raise _unknown_type(path)
    try:
        if path.is_dir() and ((path / "dataset_dict.json").exists() or (path / "state.json").exists()):
            loaded = datasets.load_from_disk(str(path), keep_in_memory=True)
        elif path.is_dir():
            loaded = datasets.load_dataset(str(path), keep_in_memory=True)
        elif path.suffix.lower() == ".parquet":
            loaded = datasets.Dataset.from_parquet(str(path), keep_in_memory=True)
        else:
            loaded = datasets.Dataset.from_json(str(path), keep_in_memory=True)
    except (OSError, ValueError, datasets.exceptions.DatasetGenerationError) as err:
        raise DataError(f"{path}: cannot be read as a dataset ({err})") from err
    if isinstance(loaded, datasets.DatasetDict):
        names = list(loaded)
        split = names[0] if split is None and len(names) == 1 else split
        if split not in loaded:
            missing = "" if split is None else f", not {split!r}"
            raise DataError(f"{path}: holds the splits {names}{missing}; give the folder of one: {path}/<split>")
        loaded = loaded[split]
    return loaded.to_list()


def _unknown_type(path: Path) -> DataError:
    return DataError(f"{path}: unknown data file type {path.suffix!r} (expected .jsonl, .json, .parquet or "
                     "a folder saved by the datasets library)")


def _checked_rows(path: Path, rows: list, what: str) -> list[dict]:
    """`rows` if every one is a training record, else one DataError naming each bad row by its 0-based index."""
    reasons = [(index, _record_reason(row)) for index, row in enumerate(rows)]
    raise_collected(path, [f"{path}: {what} {index}: {reason}" for index, reason in reasons if reason], f"{what}(s)")
    if not rows:
        raise DataError(f"{path}: no records")
    return rows


def read_json_list(path: str | Path) -> list:
    """The JSON list a `.json` file holds; DataError naming the file if it is not UTF-8, not JSON or not a list."""
    path, raw = _read_bytes(path)
    try:
        items = json.loads(raw.decode("utf-8"))
    except UnicodeDecodeError:
        raise DataError(f"{path}: not valid UTF-8") from None
    except json.JSONDecodeError as err:
        raise DataError(f"{path}:{err.lineno}: not valid JSON ({err.msg} at column {err.colno})") from None
    if not isinstance(items, list):
        raise DataError(f"{path}: expected a JSON list of objects, got {type(items).__name__}")
    return items


def load_dataset(path: str | Path) -> list[dict]:
    """Checked training rows ({problem, solution, ...}) from a .jsonl, .json (a list), .parquet or `datasets` folder;
    every bad line or row is named in one DataError, none skipped.

    CANOE's own `final_10k.jsonl` loads as it is: its `message` column is an ordinary extra field, since stage 2
    builds its prompt from `problem` (rollout.substitute_context)."""
    path = Path(path)
    suffix = path.suffix.lower()
    if suffix == ".jsonl":
        return load_jsonl(path)
    if suffix == ".json":
        return _checked_rows(path, read_json_list(path), "item")
    if suffix == ".parquet" or path.is_dir():
        return _checked_rows(path, load_records(path), "row")
    raise _unknown_type(path)


# The CANOE paper's four task types: the `task` field of the synthetic data, which the evaluation reports per type.
TASKS = ("straightforward", "multi_hop", "inconsistent", "counterfactual")


def task_counts(rows: Iterable[dict]) -> str:
    """Rows per `task` value, the four CANOE task types first: "straightforward 75, multi_hop 75, ..."."""
    counts = Counter(row.get("task", "(no task)") for row in rows)
    order = [t for t in TASKS if t in counts] + sorted(t for t in counts if t not in TASKS)
    return ", ".join(f"{t} {counts[t]}" for t in order)


# --- 2. Prompts -----------------------------------------------------------------------------------------------

# The original CANOE system prompt's meaning, one line per answer section; a config's `system_prompt` replaces it.
# Differs from CANOE (docs/differences.md, D9): no period after "</answer>", "needs to", "in complete sentences".
SYSTEM_PROMPT = (
    "A conversation between User and Assistant. The user gives an instruction that consists of two parts: "
    "a passage and the actual instruction, separated by two newline characters.\n\n"
    "The passage is provided within <context> and </context> tags. The Assistant needs to refer to the given "
    "passage and complete the instruction.\n\n"
    "The response must be structured and include the following three sections:\n"
    "- Reasoning Process: <think>reasoning process</think>\n"
    "- Long Answer: <long_answer>detailed answer in complete sentences</long_answer>\n"
    "- Short Answer: <answer>concise answer</answer>"
)

OVERFLOW_RULES = ("drop", "error")


def build_messages(problem: str, system_prompt: str = SYSTEM_PROMPT, example: Sequence[str] = ()) -> list[dict]:
    """The chat for one prompt: the system prompt, the worked example's two turns when `example` is a (problem,
    response) pair, then the problem as the user message."""
    turns = [("system", system_prompt), *zip(("user", "assistant"), example), ("user", problem)]
    return [{"role": role, "content": content} for role, content in turns]


def render_prompt(tokenizer: Any, problem: str, system_prompt: str = SYSTEM_PROMPT, response_prefix: str = "",
                  example: Sequence[str] = (), examples: Sequence[Sequence[str]] = ()) -> str:
    """The prompt text the model sees: the chat template applied, then the assistant's turn opener and
    `response_prefix` (the first words of every answer, e.g. `<think>`: the rewards see it, it is never trained).
    With `examples`, the worked example is the one the problem's CRC-32 picks: a prompt sees the same one in
    training and evaluation, and no single example is in every prompt (docs/differences.md, D23)."""
    example = examples[zlib.crc32(problem.encode()) % len(examples)] if examples else example
    chat = build_messages(problem, system_prompt, example)
    return tokenizer.apply_chat_template(chat, add_generation_prompt=True, tokenize=False) + response_prefix


@dataclass(frozen=True)
class Overflow:
    """A prompt longer than the limit. `index` is its 0-based position in the rows given to prepare_prompts
    (for rows from load_jsonl that is line `index + 1`); `row_id` is the row's own "id" field, if any."""

    index: int
    row_id: Any
    num_tokens: int

    def describe(self) -> str:
        name = f"row {self.index}" + (f" (id {self.row_id})" if self.row_id is not None else "")
        return f"{name}: {self.num_tokens} tokens"


@dataclass(frozen=True)
class PromptReport:
    """What prepare_prompts did: how many prompts were kept, which ones overflowed, and token-length stats."""

    total: int
    kept: int
    max_prompt_tokens: int
    on_overflow: str
    overflow: tuple[Overflow, ...]
    min_tokens: int  # over all prompts, kept or not
    mean_tokens: float
    max_tokens: int

    def summary(self) -> str:
        text = (f"{self.total - len(self.overflow)}/{self.total} prompts within max_prompt_tokens="
                f"{self.max_prompt_tokens}; prompt tokens min {self.min_tokens}, mean {self.mean_tokens:.1f}, "
                f"max {self.max_tokens}")
        if self.overflow:
            listed = _listed([o.describe() for o in self.overflow], "; ")
            action = "dropped" if self.on_overflow == "drop" else "rejected"
            text += f"\n{len(self.overflow)} prompt(s) over the limit, {action} (never truncated): {listed}"
        return text


class PromptOverflowWarning(UserWarning):
    """Some prompts were longer than max_prompt_tokens and were dropped."""


def prepare_prompts(tokenizer: Any, rows: Sequence[dict], max_prompt_tokens: int, on_overflow: str = "drop",
                    system_prompt: str = SYSTEM_PROMPT, response_prefix: str = "",
                    example: Sequence[str] = (), examples: Sequence[Sequence[str]] = ()
                    ) -> tuple[list[dict], PromptReport]:
    """Render and tokenize every row's prompt; keep those within `max_prompt_tokens`, as new dicts with `prompt`
    (the text) and `prompt_ids` set.

    A prompt is never truncated (that would cut the `</context>` tag). Longer ones are dropped with a
    PromptOverflowWarning (on_overflow="drop") or raise DataError ("error"); if every row is too long, DataError.
    """
    if on_overflow not in OVERFLOW_RULES:
        raise ValueError(f"on_overflow must be one of {OVERFLOW_RULES}, got {on_overflow!r}")
    if max_prompt_tokens < 1:
        raise ValueError(f"max_prompt_tokens must be positive, got {max_prompt_tokens}")
    if not rows:
        raise DataError("no rows to prepare")
    texts = [render_prompt(tokenizer, row["problem"], system_prompt, response_prefix, example, examples)
             for row in rows]
    # The chat template already writes every special token (BOS included where the model has one); letting the
    # tokenizer add its own would double them and make the count wrong.
    all_ids = tokenizer(texts, add_special_tokens=False)["input_ids"]
    kept = [{**row, "prompt": text, "prompt_ids": list(ids)} for row, text, ids in zip(rows, texts, all_ids)
            if len(ids) <= max_prompt_tokens]
    overflow = [Overflow(index=index, row_id=row.get("id"), num_tokens=len(ids))
                for index, (row, ids) in enumerate(zip(rows, all_ids)) if len(ids) > max_prompt_tokens]
    lengths = [len(ids) for ids in all_ids]
    report = PromptReport(total=len(rows), kept=len(kept), max_prompt_tokens=max_prompt_tokens, on_overflow=on_overflow,
                          overflow=tuple(overflow), min_tokens=min(lengths), mean_tokens=sum(lengths) / len(lengths),
                          max_tokens=max(lengths))
    if overflow and (on_overflow == "error" or not kept):
        rule = "on_overflow='error'" if on_overflow == "error" else "every prompt is over the limit"
        raise DataError(f"prompts longer than max_prompt_tokens ({rule}):\n{report.summary()}")
    if overflow:
        warnings.warn(report.summary(), PromptOverflowWarning, stacklevel=2)
    return kept, report


# --- 3. Batching ----------------------------------------------------------------------------------------------


class PromptSampler:
    """Row indices for one rank, one batch at a time, epoch after epoch.

    Every epoch is a permutation of range(num_rows) drawn from (seed, epoch) alone, so all ranks agree without
    communicating. A global batch is the next `batch_size * world_size` rows of it, and rank r takes its r-th slice.
    An epoch's leftover rows (fewer than a global batch) are skipped for that epoch. `state_dict()` saves (epoch,
    `position`: global batches taken this epoch), so a resumed run, even with another world_size and the same
    global batch size, takes exactly the batches the interrupted one had not.
    """

    def __init__(self, num_rows: int, batch_size: int, seed: int, rank: int = 0, world_size: int = 1) -> None:
        if num_rows < 1 or batch_size < 1 or world_size < 1:
            raise ValueError(f"need num_rows, batch_size, world_size >= 1; got {num_rows}, {batch_size}, {world_size}")
        if not 0 <= rank < world_size:
            raise ValueError(f"rank {rank} is outside 0..{world_size - 1}")
        self.num_rows = num_rows
        self.batch_size = batch_size
        self.seed = seed
        self.rank = rank
        self.world_size = world_size
        self.global_batch_size = batch_size * world_size
        self.steps_per_epoch = num_rows // self.global_batch_size
        if self.steps_per_epoch == 0:
            raise ValueError(f"{num_rows} rows cannot fill one global batch of {self.global_batch_size} "
                             f"(batch_size {batch_size} x world_size {world_size})")
        self.epoch = self.position = 0

    def epoch_order(self, epoch: int) -> list[int]:
        """The permutation of row indices for `epoch` (the same on every rank)."""
        order = list(range(self.num_rows))
        # A string seed is hashed with SHA-512 by `random`, so the order is the same in every process and run.
        random.Random(f"prompt-sampler:{self.seed}:{epoch}").shuffle(order)
        return order

    def next_batch(self) -> list[int]:
        """This rank's `batch_size` row indices for the next step, moving to the next epoch when one ends."""
        if self.position == self.steps_per_epoch:
            self.epoch += 1
            self.position = 0
        start = self.position * self.global_batch_size + self.rank * self.batch_size
        self.position += 1
        return self.epoch_order(self.epoch)[start : start + self.batch_size]

    def state_dict(self) -> dict:
        return {"epoch": self.epoch, "position": self.position, "num_rows": self.num_rows, "seed": self.seed,
                "global_batch_size": self.global_batch_size}

    def load_state_dict(self, state: dict) -> None:
        """Continue from a saved state; ValueError for a key this sampler does not save or another data setup."""
        unknown = sorted(set(state) - set(self.state_dict()))
        if unknown:
            raise ValueError(f"sampler state has keys this sampler does not know: {', '.join(unknown)}")
        for key in ("num_rows", "seed", "global_batch_size"):
            if state[key] != getattr(self, key):
                raise ValueError(f"sampler state has {key}={state[key]!r}, this sampler has {getattr(self, key)!r}")
        if not 0 <= state["position"] <= self.steps_per_epoch or state["epoch"] < 0:
            raise ValueError(f"sampler state epoch={state['epoch']}, position={state['position']} is out of range")
        self.epoch = int(state["epoch"])
        self.position = int(state["position"])


# --- 4. Answers -----------------------------------------------------------------------------------------------

_ARTICLES_RE = re.compile(r"\b(a|an|the)\b")
_CONTRACTION_RE = re.compile(r"n['\u2019]t\b")
_ASCII_PUNCTUATION = frozenset(string.punctuation)
# The official ConFiQA negation list (suites.NEGATION_WORDS), plus the forms punctuation removal makes of "don't".
NEGATION_WORDS = frozenset(
    "no not never none nothing nobody nowhere neither nor cannot without hardly "
    "dont doesnt didnt isnt arent wasnt werent cant couldnt wont wouldnt shouldnt hasnt havent hadnt aint".split()
)


def normalize_answer(text: str) -> str:
    """SQuAD's normalisation (lowercase, punctuation deleted, articles dropped, whitespace collapsed), where
    punctuation is every Unicode punctuation character besides SQuAD's ASCII `string.punctuation`.

    >>> normalize_answer("\u201c$5 + <b>\u201d  The  Eiffel-Tower!")
    '5 b eiffeltower'
    """
    lowered = text.lower()
    no_punct = "".join(ch for ch in lowered
                       if ch not in _ASCII_PUNCTUATION and not unicodedata.category(ch).startswith("P"))
    return " ".join(_ARTICLES_RE.sub(" ", no_punct).split())


def _has_negation(text: str) -> bool:
    return bool(_CONTRACTION_RE.search(text.lower())) or not NEGATION_WORDS.isdisjoint(normalize_answer(text).split())


def exact_match(prediction: Any, gold: str | Iterable[str], contains: bool = False) -> bool:
    """Whether normalize_answer(prediction) equals that of `gold` (or of any of its aliases), or with `contains`
    holds the gold's words as a contiguous run; a non-string prediction is False. A prediction with a negation word
    or "n't" fails unless the gold has one too. Unlike the official ConFiQA EM (suites.exact_match), on purpose:
    Unicode punctuation is deleted, the guard reads normalised words ("No", "nothing.", "n't"), a negated gold is
    exempt, an empty gold never matches and `contains` asks for whole words (not "ian" in "brian").

    >>> exact_match("The Paris.", "paris"), exact_match("I think it is Paris", "Paris", contains=True)
    (True, True)
    >>> exact_match("It isn't Paris", "Paris", contains=True)
    False
    """
    if not isinstance(prediction, str):
        return False
    golds = [gold] if isinstance(gold, str) else [g for g in gold if isinstance(g, str)]
    negated = _has_negation(prediction)
    words = normalize_answer(prediction).split()
    for candidate in golds:
        gold_words = normalize_answer(candidate).split()
        if not gold_words or (negated and not _has_negation(candidate)):
            continue
        n = len(gold_words)  # with `contains`, equal words are a contiguous run too
        if words == gold_words or (contains and any(words[i : i + n] == gold_words for i in range(len(words) - n + 1))):
            return True
    return False
