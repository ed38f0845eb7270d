"""Evaluation sets in shapes other than the training rows', and the `check` command for any data file.

`load_confiqa` maps a ConFiQA-style JSON list onto the training rows' shape, `{problem, solution, ...}`, so the
synthetic evaluation (evaluate.py without `--suite`) can score it like any other set; `load_eval_rows` reads an
evaluation file: such a list, or anything `data.load_dataset` reads. The paper's benchmarks read and scored by
their official rules are suites.py's.

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

# ConFiQA-style files are one JSON list of objects, each with a question, a context and an answer. Which context
# and answer fields are used is the "variant": the counterfactual pair (the ConFiQA task), the original pair,
# or plain names. With variant=None the first variant whose two fields are in the first object is used, and then
# every object must have them.
CONFIQA_VARIANTS: dict[str, tuple[str, str]] = {
    "counterfactual": ("cf_context", "cf_answer"),
    "original": ("orig_context", "orig_answer"),
    "plain": ("context", "answer"),
}
CONFIQA_QUESTION = "question"


def load_confiqa(path: str | Path, variant: str | None = None) -> list[dict]:
    """Load a JSON list of ConFiQA-style objects as {problem, solution, ...} records.

    problem = "<context>{context}</context>\\n\\n{question}", solution = "<answer>{answer}</answer>", with the
    context/answer fields given by `variant` (see CONFIQA_VARIANTS). The question, context and answer fields are
    consumed; every other field (e.g. the other variant's answer, alias lists) is kept. Errors name the item
    index (0-based).
    """
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
    records: list[dict] = []
    errors: list[str] = []
    for index, item in enumerate(items):
        where = f"{path}: item {index}"
        if not isinstance(item, dict):
            errors.append(f"{where}: expected a JSON object, got {type(item).__name__}")
            continue
        bad = [f for f in (CONFIQA_QUESTION, context_field, answer_field) if not isinstance(item.get(f), str)]
        if bad:
            errors.append(f"{where}: field(s) {', '.join(repr(f) for f in bad)} missing or not a string")
            continue
        context = item[context_field]
        if "<context>" in context or "</context>" in context:
            # A tag inside the context would end the block early and cut the passage.
            errors.append(f"{where}: '{context_field}' contains a <context> tag")
            continue
        taken = {f for f in data.REQUIRED_FIELDS if f in item}
        if taken:
            errors.append(f"{where}: already has field(s) {sorted(taken)}, which the mapping would overwrite")
            continue
        problem = f"<context>{context}</context>\n\n{item[CONFIQA_QUESTION]}"
        reason = data.problem_reason(problem)
        if reason is not None:
            errors.append(f"{where}: {reason} (from '{context_field}')")
            continue
        rest = {k: v for k, v in item.items() if k not in (CONFIQA_QUESTION, context_field, answer_field)}
        records.append({"problem": problem, "solution": f"<answer>{item[answer_field]}</answer>", **rest})
    data.raise_collected(path, errors, "item(s)")
    return records


def _holds_records(path: Path) -> bool:
    """Whether a `.json` file is a list of training records (its first item has `problem` and `solution`)."""
    try:
        items = data.read_json_list(path)
    except DataError:
        return False  # load_confiqa names the problem
    return bool(items) and isinstance(items[0], dict) and all(name in items[0] for name in data.REQUIRED_FIELDS)


def load_eval_rows(path: str | Path, confiqa_variant: str | None = None) -> list[dict]:
    """Evaluation rows ({problem, solution, ...}): a `.json` file that is not a list of training records is read
    as a ConFiQA-style list (`load_confiqa`); every other file as training data is (`data.load_dataset`)."""
    path = Path(path)
    if path.suffix.lower() == ".json" and not _holds_records(path):
        return load_confiqa(path, confiqa_variant)
    return data.load_dataset(path)


# --------------------------------------------------------------------------------------------------------------
# Command line
# --------------------------------------------------------------------------------------------------------------


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
