"""Where a policy's short answers go on the items it loses to the plain base: the items of one scoreboard file
(cnq500, NQ-Swap, unless --file names synthetic or heldout) whose gold the plain base's answer holds and the
policy's short answer does not (scoreboard's `contains`), sorted by what the policy answered instead; --items lists
each one. Read it to aim a lever at the span the short-answer format picks, not at the reading.

    .venv/bin/python bench/lost_items.py --benchmarks DIR --config CONFIG RUN/.../scoreboard.predictions.jsonl ...
    .venv/bin/python bench/lost_items.py --file heldout --items RUN/.../scoreboard.predictions.jsonl ...

The kind of a lost item is the first of these that holds for the policy's answer span (`lost_kind`):
- `example`: it names the prompt's worked example where the item does not (scoreboard.copies_example);
- `empty`: nothing is left of it after SQuAD's normalisation;
- `question`: it is a span of the question (the question's subject, a character for an actor);
- `passage`: it is another span of the passage;
- `elsewhere`: its words are in neither.
`won` counts the reverse: the policy's answer holds the gold, the plain base's does not.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import re
import sys
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from config import load_config  # noqa: E402
from evaluation import suites  # noqa: E402
from grading.tags import answer_span  # noqa: E402

_spec = importlib.util.spec_from_file_location("pool_seeds", ROOT / "bench" / "pool_seeds.py")
pool_seeds = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(pool_seeds)
scoreboard = pool_seeds.scoreboard  # the scoring, loaded once by pool_seeds

KINDS = ("example", "empty", "question", "passage", "elsewhere")


def lost_kind(output: str, item: suites.Item, names: list[str]) -> str:
    """What the policy answered instead of the gold on `item` (one of KINDS).

    >>> item = suites.Item(0, 0, "who plays captain vell in the salt road",
    ...                    "<context>Tamsin Orrow plays Captain Vell.</context> who plays captain vell",
    ...                    ("Tamsin Orrow",))
    >>> lost_kind("<answer>Captain Vell</answer>", item, ["Osric Hallam"])
    'question'
    """
    if scoreboard.copies_example(output, item.problem, names):
        return "example"
    span = suites.normalize(suites.extract(output)["answer"])
    if not span:
        return "empty"

    def holds(text: str) -> bool:  # whole words, tags apart from them: "x" is no span of "next" or "<context>x"
        return f" {span} " in f" {suites.normalize(re.sub('[<>]', ' ', text))} "

    if holds(item.question):
        return "question"
    return "passage" if holds(item.problem) else "elsewhere"


def as_item(index: int, item: suites.Item | dict) -> suites.Item:
    """A synthetic-format row (the synthetic and held-out files) as a suites.Item: its question is what follows the
    context, its gold the solution's answer span."""
    if isinstance(item, suites.Item):
        return item
    question = item["problem"].rsplit("</context>", 1)[-1].strip()
    return suites.Item(index, item.get("id"), question, item["problem"], (answer_span(item["solution"]),))


def tally(target, items: list, policy: list[str], plain: list[str], names: list[str],
          lost: list | None = None) -> Counter:
    """Counts of the lost items of `target` (scoreboard.Target) by kind, with `lost` (all of them) and `won`; each
    lost item's (index, kind) is appended to `lost` where given."""
    policy_hits = scoreboard.per_item_hits(target, items, policy)["contains"]  # (n,)
    plain_hits = scoreboard.per_item_hits(target, items, plain)["contains"]  # (n,)
    counts = Counter({kind: 0 for kind in ("lost", "won", *KINDS)})
    for index, (item, output, ours, theirs) in enumerate(zip(items, policy, policy_hits, plain_hits)):
        if theirs and not ours:
            kind = lost_kind(output, as_item(index, item), names)
            counts["lost"] += 1
            counts[kind] += 1
            if lost is not None:
                lost.append((index, kind))
        elif ours and not theirs:
            counts["won"] += 1
    return counts


def run_name(predictions: Path, index: int) -> str:
    """"RUN seed S" for a checkpoint's policy, the model folder's name for a model, from the scoreboard.json
    beside the predictions; else pool_seeds' label."""
    report = predictions.with_name("scoreboard.json")
    if not report.exists():
        return pool_seeds.run_label(predictions, index)
    info = json.loads(report.read_text())
    model = Path(info["model"])
    return f"{model.parents[2].name} seed {info['seed']}" if model.name == "policy" else model.name


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("predictions", nargs="+", type=Path, help="scoreboard.predictions.jsonl, one per run")
    parser.add_argument("--file", default="cnq500", choices=("cnq500", "synthetic", "heldout"),
                        help="the scoreboard file whose items to read")
    parser.add_argument("--benchmarks", type=Path, help="the folder the scoreboards read (for cnq500)")
    parser.add_argument("--config", default=str(ROOT / "config.toml"), help="the policies' config (its example)")
    parser.add_argument("--items", action="store_true", help="then list each lost item, its gold and the answer")
    args = parser.parse_args(argv)
    if args.file == "cnq500" and args.benchmarks is None:
        parser.error("cnq500 needs --benchmarks DIR (the folder with cnq-nqswap.dev500.json)")
    targets = (scoreboard.benchmark_targets(args.benchmarks) if args.file == "cnq500" else
               [scoreboard.Target("synthetic", scoreboard.SYNTHETIC), scoreboard.Target("heldout", scoreboard.HELDOUT)])
    [target] = scoreboard.present([t for t in targets if t.name == args.file])
    items, _ = scoreboard.read_items(target)
    names = scoreboard.example_names(load_config(args.config).prompt_style())
    columns = ("lost", *KINDS, "won")
    labels = [run_name(path, i) for i, path in enumerate(args.predictions)]
    width = max(24, *(len(label) + 2 for label in labels))
    print(f"{'run':<{width}}" + "".join(f"{c:>10}" for c in columns))
    listed = []
    for path, label in zip(args.predictions, labels):
        run = pool_seeds.read_predictions(path)
        if args.file not in run:
            raise SystemExit(f"error: {path}: no {args.file} outputs"
                             + (" (scored without --benchmarks?)" if args.file == "cnq500" else ""))
        lost = []
        counts = tally(target, items, run[args.file]["policy"], run[args.file]["plain"], names, lost)
        print(f"{label:<{width}}" + "".join(f"{counts[c]:>10}" for c in columns))
        listed += [(label, index, kind, run[args.file]["policy"][index]) for index, kind in lost]
    print(f"(of {len(items)} {args.file} items; lost: the plain base's answer holds the gold and the policy's short "
          "answer does not, by kind of what the policy answered; won: the reverse)")
    for name, index, kind, output in listed if args.items else []:
        task = items[index].get("task", "") if isinstance(items[index], dict) else ""
        answer = suites.extract(output)["answer"]  # the whole output where it has no <answer>
        print(f"{name}: item {index}{f' ({task})' if task else ''}, {kind}: gold "
              f"{as_item(index, items[index]).golds[0]!r}, answered {answer[:80] + '…' * (len(answer) > 80)!r}")


if __name__ == "__main__":
    main()
