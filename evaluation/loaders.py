"""Evaluation files as training rows `{problem, solution, ...}`, and the `check` command for any data file.

`load_eval_rows` reads what evaluate.py scores without `--suite`: a ConFiQA-style JSON list (`load_confiqa`) or
anything `data.load_dataset` reads. (The paper's benchmarks, read by their official rules, are suites.py's.)
Run (every row checked; with a tokenizer, the prompts' lengths against `--max-prompt-tokens`, default 256):
    python -m evaluation.loaders check data/synth/train.jsonl [--tokenizer models/SmolLM2-135M-Instruct]
"""

from __future__ import annotations

import argparse
import sys
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import data
from data import DataError

# The (context, answer) fields of each variant of a ConFiQA-style object; variant=None takes the first variant
# whose two fields the first object has, and then every object must have them.
CONFIQA_VARIANTS: dict[str, tuple[str, str]] = {
    "counterfactual": ("cf_context", "cf_answer"),
    "original": ("orig_context", "orig_answer"),
    "plain": ("context", "answer"),
}


def load_confiqa(path: str | Path, variant: str | None = None) -> list[dict]:
    """A JSON list of ConFiQA-style objects as records problem = "<context>{context}</context>\\n\\n{question}",
    solution = "<answer>{answer}</answer>" (fields per `variant`, CONFIQA_VARIANTS), every other field kept.
    DataError names every bad item by its 0-based index."""
    if variant is not None and variant not in CONFIQA_VARIANTS:
        raise ValueError(f"unknown ConFiQA variant {variant!r}; choose from {sorted(CONFIQA_VARIANTS)}")
    path = Path(path)
    items = data.read_json_list(path)
    if not items:
        raise DataError(f"{path}: no records (the list is empty)")
    if variant is None:
        first = items[0] if isinstance(items[0], dict) else {}
        variant = next((name for name, fields in CONFIQA_VARIANTS.items() if all(f in first for f in fields)), None)
        if variant is None:
            options = ", ".join(f"{name}: {c}/{a}" for name, (c, a) in CONFIQA_VARIANTS.items())
            raise DataError(f"{path}: item 0 has none of the known context/answer field pairs ({options})")
    context_field, answer_field = CONFIQA_VARIANTS[variant]
    records, errors = [], []
    for index, item in enumerate(items):
        record = _confiqa_record(item, context_field, answer_field)
        if isinstance(record, str):
            errors.append(f"{path}: item {index}: {record}")
        else:
            records.append(record)
    data.raise_collected(path, errors, "item(s)")
    return records


def _confiqa_record(item: Any, context_field: str, answer_field: str) -> dict | str:
    """The record of one ConFiQA-style object, or why it cannot be one."""
    if not isinstance(item, dict):
        return f"expected a JSON object, got {type(item).__name__}"
    bad = [f for f in ("question", context_field, answer_field) if not isinstance(item.get(f), str)]
    if bad:
        return f"field(s) {', '.join(repr(f) for f in bad)} missing or not a string"
    context = item[context_field]
    if "<context>" in context or "</context>" in context:  # it would end the block early and cut the passage
        return f"'{context_field}' contains a <context> tag"
    taken = {f for f in data.REQUIRED_FIELDS if f in item}
    if taken:
        return f"already has field(s) {sorted(taken)}, which the mapping would overwrite"
    problem = f"<context>{context}</context>\n\n{item['question']}"
    reason = data.problem_reason(problem)
    if reason is not None:
        return f"{reason} (from '{context_field}')"
    rest = {k: v for k, v in item.items() if k not in ("question", context_field, answer_field)}
    return {"problem": problem, "solution": f"<answer>{item[answer_field]}</answer>", **rest}


def _holds_records(path: Path) -> bool:
    try:
        items = data.read_json_list(path)
    except DataError:
        return False  # load_confiqa names the problem
    return bool(items) and isinstance(items[0], dict) and all(name in items[0] for name in data.REQUIRED_FIELDS)


def load_eval_rows(path: str | Path, confiqa_variant: str | None = None) -> list[dict]:
    """Evaluation rows: a `.json` file that is not a list of training records as a ConFiQA-style list
    (`load_confiqa`), any other file as training data is (`data.load_dataset`)."""
    path = Path(path)
    if path.suffix.lower() == ".json" and not _holds_records(path):
        return load_confiqa(path, confiqa_variant)
    return data.load_dataset(path)


def _load_tokenizer(name: str) -> Any:
    from transformers import AutoTokenizer  # heavy; only the `check --tokenizer` command needs it

    path = Path(name)
    if path.suffix == ".gguf":
        return AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
    return AutoTokenizer.from_pretrained(name)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)  # `check` (synth.py writes the synthetic data)
    check = commands.add_parser("check", help="validate a data file; with --tokenizer, report prompt lengths")
    check.add_argument("path", type=Path)
    check.add_argument("--tokenizer", help="tokenizer directory or a .gguf file")
    check.add_argument("--max-prompt-tokens", type=int, default=256)
    check.add_argument("--confiqa-variant", choices=sorted(CONFIQA_VARIANTS))
    args = parser.parse_args(argv)

    try:
        rows = load_eval_rows(args.path, args.confiqa_variant)
        print(f"{args.path}: {len(rows)} rows ({data.task_counts(rows)})")
        if args.tokenizer:
            with warnings.catch_warnings():  # the summary printed below already lists the dropped prompts
                warnings.simplefilter("ignore", data.PromptOverflowWarning)
                _, report = data.prepare_prompts(_load_tokenizer(args.tokenizer), rows, args.max_prompt_tokens, "drop")
            print(report.summary())
    except DataError as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
