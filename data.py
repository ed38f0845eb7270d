"""Data for CANOE's Dual-GRPO: loading, prompt rendering, per-rank batching, answer matching.

What lives here (docs/DESIGN.md, "Data"), in reading order:

1. **Loading.** `load_jsonl` reads one JSON object per line,
   `{"problem": "<context>…</context>\\n\\nQuestion", "solution": "<answer>…</answer>", ...extra fields}`.
   Extra fields are kept (the driver passes them to the reward functions as keyword arguments). Every bad line
   is an error naming file, line number and reason: not valid UTF-8, not JSON, not an object, `problem` or
   `solution` missing or not a string, no `<context>…</context>` block in `problem`, or an empty one. Blank
   lines are allowed only at the end of the file (so row i is always line i + 1, which is how
   `prepare_prompts` names dropped rows); a blank line before a record is an error. A file with no records
   is an error. Nothing is skipped silently. `load_records` reads parquet files and folders saved by the
   `datasets` library; `load_dataset` picks the loader from the file extension and checks every row. CANOE's own
   training file loads as it is (its `message` column is kept like any extra field). `task_counts` summarises
   the `task` field. Evaluation sets in other shapes (ConFiQA's JSON lists) are evaluation/loaders.py's.
2. **Prompts.** `SYSTEM_PROMPT` says what the original CANOE code's system prompt says: the passage comes in
   `<context>` tags, the instruction after two newlines, and the answer in three sections, each on its own line as
   `- Name: <tag>what goes there</tag>`, with no period after `</answer>` (D9, where the system prompt can also be
   set in the config). `prepare_prompts` renders every prompt with the tokenizer's chat template and never
   truncates (that would cut the `</context>` tag): a prompt longer than `max_prompt_tokens` is either dropped and
   reported (`on_overflow="drop"`, with a warning) or an error (`on_overflow="error"`).
3. **Batching.** `PromptSampler` gives each rank its own disjoint slice of every global batch, reshuffles
   every epoch from (seed, epoch), and saves/restores its position so a resumed run sees exactly the data it
   had not seen yet.
4. **Answers.** `answer_span` (`tags.answer_span`, the rule the rewards use) and `exact_match`, our SQuAD-style
   normalised match with a guard against negated predictions (its differences from the official ConFiQA EM of
   suites.py are listed in its docstring).

The synthetic training data in the CANOE paper's four task types is made by `python -m synthetic.synth` (synthetic/synth.py).
`python -m evaluation.loaders check FILE [--tokenizer DIR]` checks a data file and reports its prompt lengths.
"""

from __future__ import annotations

import json
import random
import re
import string
import unicodedata
import warnings
from collections import Counter
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from grading.tags import answer_span, tag_content  # answer_span: re-exported, read as data.answer_span

# --------------------------------------------------------------------------------------------------------------
# 1. Loading
# --------------------------------------------------------------------------------------------------------------

REQUIRED_FIELDS = ("problem", "solution")
_MAX_LISTED = 20  # error messages list at most this many bad lines/rows, then a count


class DataError(ValueError):
    """A data file or row that cannot be used; the message names the file, the line and the reason."""


def problem_reason(problem: str) -> str | None:
    """Why `problem` cannot be used (no context block, empty context), or None if it can."""
    context = tag_content(problem, "context")
    if context is None:
        return "'problem' has no <context>...</context> block"
    if not context:
        # The length reward needs a non-empty context, and a faithfulness item without one teaches nothing.
        return "'problem' has an empty <context></context> block"
    return None


def _record_reason(record: Any) -> str | None:
    """Why a parsed JSON value is not a usable record, or None if it is."""
    if not isinstance(record, dict):
        return f"expected a JSON object, got {type(record).__name__}"
    for name in REQUIRED_FIELDS:
        if name not in record:
            return f"missing field '{name}'"
        if not isinstance(record[name], str):
            return f"field '{name}' must be a string, got {type(record[name]).__name__}"
    return problem_reason(record["problem"])


def raise_collected(path: Path, errors: list[str], what: str) -> None:
    """Raise one DataError listing every collected error (the first _MAX_LISTED, then a count)."""
    if not errors:
        return
    listed = "\n  ".join(errors[:_MAX_LISTED])
    more = f"\n  ... and {len(errors) - _MAX_LISTED} more" if len(errors) > _MAX_LISTED else ""
    raise DataError(f"{path}: {len(errors)} malformed {what}:\n  {listed}{more}")


def _read_bytes(path: str | Path) -> tuple[Path, bytes]:
    path = Path(path)
    try:
        return path, path.read_bytes()
    except FileNotFoundError:
        raise DataError(f"{path}: data file not found") from None
    except OSError as err:
        raise DataError(f"{path}: cannot read data file ({err.strerror or err})") from err


def load_jsonl(path: str | Path) -> list[dict]:
    """Load a JSONL file of {problem, solution, ...} records; raise DataError naming every bad line.

    Blank (whitespace-only) lines are allowed only after the last record. Extra fields are kept as they are.
    """
    path, raw = _read_bytes(path)
    # bytes.splitlines splits on \\n, \\r\\n and \\r only; str.splitlines would also split inside JSON strings
    # holding U+2028 and similar characters, which JSON allows unescaped.
    lines = raw.splitlines()
    while lines and not lines[-1].strip():
        lines.pop()
    if lines and lines[0].startswith(b"\xef\xbb\xbf"):  # a UTF-8 byte-order mark some editors write
        lines[0] = lines[0][3:]
    if not lines:
        raise DataError(f"{path}: no records (the file is empty or only blank lines)")
    records: list[dict] = []
    errors: list[str] = []
    for number, line in enumerate(lines, start=1):
        where = f"{path}:{number}"
        if not line.strip():
            errors.append(f"{where}: blank line (blank lines are allowed only at the end of the file)")
            continue
        try:
            text = line.decode("utf-8")
        except UnicodeDecodeError:
            errors.append(f"{where}: not valid UTF-8")
            continue
        try:
            record = json.loads(text)
        except json.JSONDecodeError as err:
            errors.append(f"{where}: not valid JSON ({err.msg} at column {err.colno})")
            continue
        reason = _record_reason(record)
        if reason is not None:
            errors.append(f"{where}: {reason}")
            continue
        records.append(record)
    raise_collected(path, errors, "line(s)")
    return records


def load_records(path: str | Path, split: str | None = None) -> list[dict]:
    """The rows of a parquet, JSON or JSONL file, or of a folder the `datasets` library wrote, as plain dicts.

    Read with `datasets` (nested columns such as `message` come back as lists of dicts). A folder written by
    `save_to_disk` is loaded as it is; one holding several splits (a DatasetDict) gives `split`, or its only
    split; any other folder is read as a folder of data files (e.g. a dataset downloaded from the hub). No
    field is checked here: `load_dataset` checks training rows, suites.py benchmark records.
    """
    import datasets  # heavy; only these formats need it

    path = Path(path)
    if not path.exists():
        raise DataError(f"{path}: data file not found")
    try:
        if path.is_dir() and ((path / "dataset_dict.json").exists() or (path / "state.json").exists()):
            loaded = datasets.load_from_disk(str(path), keep_in_memory=True)
        elif path.is_dir():
            loaded = datasets.load_dataset(str(path), keep_in_memory=True)
        elif path.suffix.lower() == ".parquet":
            loaded = datasets.Dataset.from_parquet(str(path), keep_in_memory=True)
        elif path.suffix.lower() in (".json", ".jsonl"):
            loaded = datasets.Dataset.from_json(str(path), keep_in_memory=True)
        else:
            raise DataError(f"{path}: unknown data file type {path.suffix!r} (expected .jsonl, .json, .parquet or "
                            "a folder saved by the datasets library)")
    except (OSError, ValueError, datasets.exceptions.DatasetGenerationError) as err:
        if isinstance(err, DataError):
            raise
        raise DataError(f"{path}: cannot be read as a dataset ({err})") from err
    if isinstance(loaded, datasets.DatasetDict):
        names = list(loaded)
        if split is None and len(names) == 1:
            split = names[0]
        if split not in loaded:
            missing = "" if split is None else f", not {split!r}"
            raise DataError(f"{path}: holds the splits {names}{missing}; give the folder of one: {path}/<split>")
        loaded = loaded[split]
    return loaded.to_list()


def _checked_rows(path: Path, rows: list, what: str) -> list[dict]:
    """`rows` if every one is a training record, else one DataError naming each bad row by its 0-based index."""
    errors = []
    for index, row in enumerate(rows):
        reason = _record_reason(row)
        if reason is not None:
            errors.append(f"{path}: {what} {index}: {reason}")
    raise_collected(path, errors, f"{what}(s)")
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
    """Training rows ({problem, solution, ...}) from any of the formats a user may have:

    - `.jsonl`: `load_jsonl` (errors name the line);
    - `.json`: a list of {problem, solution, ...} records (`read_json_list`, then every item is checked);
    - `.parquet`, or a folder saved by the `datasets` library: `load_records`, then every row is checked.

    CANOE's own training file (`final_10k.jsonl`) loads as it is: besides `problem` and `solution` its rows
    carry `message` (the chat, a list of {role, content}), which the original trainer only edits for stage 2.
    Our stage 2 builds its prompt from `problem` (rollout.substitute_context), so `message`, and `messages`
    likewise, are kept as ordinary extra columns: they reach the reward functions as keyword arguments and
    nothing else reads them.
    """
    path = Path(path)
    suffix = path.suffix.lower()
    if suffix == ".jsonl":
        return load_jsonl(path)
    if suffix == ".json":
        return _checked_rows(path, read_json_list(path), "item")
    if suffix == ".parquet" or path.is_dir():
        return _checked_rows(path, load_records(path), "row")
    raise DataError(f"{path}: unknown data file type {suffix!r} (expected .jsonl, .json, .parquet or a folder "
                    "saved by the datasets library)")


# The CANOE paper's four task types: the `task` field of the synthetic data (synth.py), reported per type by the
# `check` command (evaluation/loaders.py) and by the evaluation.
TASKS = ("straightforward", "multi_hop", "inconsistent", "counterfactual")


def task_counts(rows: Iterable[dict]) -> str:
    """Rows per `task` value, the four CANOE task types first: "straightforward 75, multi_hop 75, ..."."""
    counts = Counter(row.get("task", "(no task)") for row in rows)
    order = [t for t in TASKS if t in counts] + sorted(t for t in counts if t not in TASKS)
    return ", ".join(f"{t} {counts[t]}" for t in order)


# --------------------------------------------------------------------------------------------------------------
# 2. Prompts
# --------------------------------------------------------------------------------------------------------------

# The meaning of the original CANOE system prompt, one line per answer section.
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
    response) pair, then the problem as the user message.

    The example is an earlier exchange about a passage of its own, so the model reads its answer as a question
    already answered rather than as text to repeat.
    """
    chat = [{"role": "system", "content": system_prompt}]
    if example:
        example_problem, example_response = example
        chat += [{"role": "user", "content": example_problem}, {"role": "assistant", "content": example_response}]
    return chat + [{"role": "user", "content": problem}]


def render_prompt(
    tokenizer: Any, problem: str, system_prompt: str = SYSTEM_PROMPT, response_prefix: str = "",
    example: Sequence[str] = (),
) -> str:
    """The prompt text the model sees: the chat template applied, ending with the assistant's turn opener.

    `response_prefix` is written after the opener as the first words of the answer (understand-r1-zero's R1-Zero
    prompt ends with `<think>`); the trainer counts it as part of the completion the rewards see, never as trained
    tokens. `example` is build_messages'.
    """
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
        text = (
            f"{self.total - len(self.overflow)}/{self.total} prompts within max_prompt_tokens="
            f"{self.max_prompt_tokens}; prompt tokens min {self.min_tokens}, mean {self.mean_tokens:.1f}, "
            f"max {self.max_tokens}"
        )
        if self.overflow:
            listed = "; ".join(o.describe() for o in self.overflow[:_MAX_LISTED])
            more = f"; ... and {len(self.overflow) - _MAX_LISTED} more" if len(self.overflow) > _MAX_LISTED else ""
            action = "dropped" if self.on_overflow == "drop" else "rejected"
            text += f"\n{len(self.overflow)} prompt(s) over the limit, {action} (never truncated): {listed}{more}"
        return text


class PromptOverflowWarning(UserWarning):
    """Some prompts were longer than max_prompt_tokens and were dropped."""


def prepare_prompts(
    tokenizer: Any, rows: Sequence[dict], max_prompt_tokens: int, on_overflow: str = "drop",
    system_prompt: str = SYSTEM_PROMPT, response_prefix: str = "", example: Sequence[str] = (),
) -> tuple[list[dict], PromptReport]:
    """Render and tokenize every row's prompt; keep those within `max_prompt_tokens`.

    A prompt is never truncated: cutting it would cut the `</context>` tag (and the question after it). Rows
    over the limit are handled by `on_overflow`: "drop" removes them and warns (PromptOverflowWarning) with their
    indices and ids; "error" raises DataError naming them. If every row overflows, that is a DataError either way.
    Each kept row is a new dict (the input rows are not modified) with `prompt` (the rendered text) and
    `prompt_ids` (its token ids) set, replacing any fields of those names.
    """
    if on_overflow not in OVERFLOW_RULES:
        raise ValueError(f"on_overflow must be one of {OVERFLOW_RULES}, got {on_overflow!r}")
    if max_prompt_tokens < 1:
        raise ValueError(f"max_prompt_tokens must be positive, got {max_prompt_tokens}")
    if not rows:
        raise DataError("no rows to prepare")
    texts = [render_prompt(tokenizer, row["problem"], system_prompt, response_prefix, example) for row in rows]
    # The chat template already writes every special token (BOS included where the model has one); letting the
    # tokenizer add its own would double them and make the count wrong.
    all_ids = tokenizer(texts, add_special_tokens=False)["input_ids"]
    kept: list[dict] = []
    overflow: list[Overflow] = []
    for index, (row, text, ids) in enumerate(zip(rows, texts, all_ids)):
        if len(ids) > max_prompt_tokens:
            overflow.append(Overflow(index=index, row_id=row.get("id"), num_tokens=len(ids)))
        else:
            kept.append({**row, "prompt": text, "prompt_ids": list(ids)})
    lengths = [len(ids) for ids in all_ids]
    report = PromptReport(
        total=len(rows),
        kept=len(kept),
        max_prompt_tokens=max_prompt_tokens,
        on_overflow=on_overflow,
        overflow=tuple(overflow),
        min_tokens=min(lengths),
        mean_tokens=sum(lengths) / len(lengths),
        max_tokens=max(lengths),
    )
    if overflow and (on_overflow == "error" or not kept):
        rule = "on_overflow='error'" if on_overflow == "error" else "every prompt is over the limit"
        raise DataError(f"prompts longer than max_prompt_tokens ({rule}):\n{report.summary()}")
    if overflow:
        warnings.warn(report.summary(), PromptOverflowWarning, stacklevel=2)
    return kept, report


# --------------------------------------------------------------------------------------------------------------
# 3. Batching
# --------------------------------------------------------------------------------------------------------------


class PromptSampler:
    """Row indices for one rank, one batch at a time, epoch after epoch.

    Every epoch is a permutation of range(num_rows) drawn from (seed, epoch) alone, so every rank computes the
    same order without communicating. A global batch is the next `batch_size * world_size` rows of that order;
    rank r takes the r-th slice of `batch_size`, so the ranks' batches are disjoint and together cover the global
    batch. The rows left over at the end of an epoch (fewer than a global batch) are skipped for that epoch (the
    next permutation differs, so no row is skipped every time).

    `position` counts the global batches already taken in the current epoch; `state_dict()` saves
    (epoch, position) and `load_state_dict()` restores it, so a resumed run continues with exactly the batches
    the interrupted one had not taken. The state also holds num_rows, seed and global batch size, and loading
    refuses a state from a different setup. It may be loaded with a different world_size as long as
    the global batch size is the same.
    """

    def __init__(
        self, num_rows: int, batch_size: int, seed: int, rank: int = 0, world_size: int = 1) -> None:
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
        self.epoch = 0
        self.position = 0
        self._order_epoch = -1
        self._order: list[int] = []

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
        if self._order_epoch != self.epoch:
            self._order, self._order_epoch = self.epoch_order(self.epoch), self.epoch
        start = self.position * self.global_batch_size + self.rank * self.batch_size
        batch = self._order[start : start + self.batch_size]
        self.position += 1
        return batch

    def __iter__(self) -> Iterator[list[int]]:
        return self

    def __next__(self) -> list[int]:
        return self.next_batch()

    def state_dict(self) -> dict:
        return {
            "epoch": self.epoch,
            "position": self.position,
            "num_rows": self.num_rows,
            "seed": self.seed,
            "global_batch_size": self.global_batch_size,
        }

    def load_state_dict(self, state: dict) -> None:
        """Continue from a saved state (not modified); refuse one saved with a different data or batch setup, or
        with keys this sampler does not know (saved by another version of it)."""
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


# --------------------------------------------------------------------------------------------------------------
# 4. Answers
# --------------------------------------------------------------------------------------------------------------

_ARTICLES_RE = re.compile(r"\b(a|an|the)\b")
_CONTRACTION_RE = re.compile(r"n['\u2019]t\b")
_ASCII_PUNCTUATION = frozenset(string.punctuation)
# The official ConFiQA negation list (suites.NEGATION_WORDS), plus the apostrophe-less forms that punctuation
# removal turns "don't" into.
NEGATION_WORDS = frozenset(
    "no not never none nothing nobody nowhere neither nor cannot without hardly "
    "dont doesnt didnt isnt arent wasnt werent cant couldnt wont wouldnt shouldnt hasnt havent hadnt aint".split()
)


def normalize_answer(text: str) -> str:
    """SQuAD's normalisation: lowercase, delete punctuation, articles a/an/the to spaces, collapse whitespace.

    One difference from SQuAD's (suites.normalize): besides the ASCII `string.punctuation` characters SQuAD
    deletes, every Unicode punctuation character is deleted too (curly quotes, dashes, guillemets).

    >>> normalize_answer("  The  Eiffel-Tower! ")
    'eiffeltower'
    >>> normalize_answer("\u201c$5 + <b>\u201d")
    '5 b'
    """
    lowered = text.lower()
    no_punct = "".join(ch for ch in lowered
                       if ch not in _ASCII_PUNCTUATION and not unicodedata.category(ch).startswith("P"))
    return " ".join(_ARTICLES_RE.sub(" ", no_punct).split())


def _has_negation(text: str) -> bool:
    if _CONTRACTION_RE.search(text.lower()):
        return True
    return any(word in NEGATION_WORDS for word in normalize_answer(text).split())


def exact_match(prediction: Any, gold: str | Iterable[str], contains: bool = False) -> bool:
    """Our normalised match of `prediction` against `gold` (one answer or several aliases; any may match).

    This is the EM of the synthetic evaluation and of the training metric `faithfulness/em`. It is not the
    official ConFiQA EM (suites.exact_match, which `--eval --suite` uses); the differences, all deliberate:
    1. Unicode punctuation is deleted too (normalize_answer);
    2. the negation guard reads the normalised words, so it is case-insensitive, sees "No" and "nothing." and
       also catches "n't" contractions (the official guard reads the raw `prediction.split()`);
    3. a gold that itself has a negation word is exempt from the guard ("No" can match "no");
    4. an empty gold never matches (officially "" equals any prediction that normalises to "");
    5. `contains=True` asks for whole words (the official recall is a substring test: "ian" is in "brian").

    contains=False: the normalised strings are equal (ConFiQA/SQuAD exact match).
    contains=True: the gold's normalised words appear as a contiguous run of the prediction's words (the
    "answer appears in the response" reading of a long prediction).
    Negation guard, in both modes: a prediction with a negation word (no, not, never, none, n't, ...) fails
    unless that gold has one too, so "It is not Paris" never matches "Paris". An empty gold never matches;
    a non-string prediction is False.

    >>> exact_match("The Paris.", "paris")
    True
    >>> exact_match("I think it is Paris", "Paris", contains=True)
    True
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
        if not contains and words == gold_words:
            return True
        n = len(gold_words)
        if contains and any(words[i : i + n] == gold_words for i in range(len(words) - n + 1)):
            return True
    return False
