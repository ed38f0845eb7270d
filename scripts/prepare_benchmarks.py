"""Build the decision set's benchmark files (`make scoreboard`, `make compare`, `BENCHMARKS=DIR`) from the public
releases a user downloaded, by the rules of docs/evaluation.md ("The decision set from public sources"), and check
each output's sha256 against the one recorded there (`RECORDED`).

    .venv/bin/python scripts/prepare_benchmarks.py --out runs/benchmarks --followrag followRAG_ifnq.json \
        --confiqa ConFiQA/ --nqswap dev-00000-of-00001.parquet
    make benchmarks FOLLOWRAG=F CONFIQA=DIR NQSWAP=F [OUT=runs/benchmarks]

- `--followrag`: FollowRAG's `followRAG/followRAG_ifnq.json`, copied byte for byte to followrag-nq.json;
- `--confiqa`: a folder with Context-DPO's `ConFiQA-QA.json`, `ConFiQA-MR.json` and `ConFiQA-MC.json`: items 0-24
  of each, nine fields (`CONFIQA_FIELDS`), to ConFiQA-{QA,MR,MC}.dev25.json;
- `--nqswap`: NQ-Swap's dev split (the hub's parquet file, or JSON / JSONL rows with its five columns): the rows
  `nqswap_items` keeps, to cnq-nqswap.dev500.json.

Each source given is built; a line per output says whether its sha256 is the recorded one. The exit status is 1
when one differs: that file is not the one bench/RESULTS.md measured (docs/evaluation.md says which sources could
not be compared byte for byte).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import random
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from data import load_records  # noqa: E402
from evaluation.suites import normalize  # noqa: E402

RECORDED = {
    "followrag-nq.json": "02dc6c93b930be0104cb5eca1af68ccb860507d4fa40353be00eb89b7f222093",
    "ConFiQA-QA.dev25.json": "9cb462776a069048904d4dfa13a6f09358e55b5ec2e32f19509c5467a865b822",
    "ConFiQA-MR.dev25.json": "61dbd3689f6f36cfbacc549f27138dbe2ab1399587ba336509fe7db95870ed33",
    "ConFiQA-MC.dev25.json": "afa1daed20993837267c6b51a83649a869b564cddba20127ae14ef108f3d0a2b",
    "cnq-nqswap.dev500.json": "97ffc85cc4aca92a7d27600dc135a16440bca71483db67f80aa09eb3e189c181",
}
# The fields a ConFiQA item keeps, in the order they are written.
CONFIQA_FIELDS = ("orig_path_labeled", "cf_path_labeled", "orig_answer", "cf_answer", "orig_alias", "cf_alias",
                  "question", "orig_context", "cf_context")
NQSWAP_COLUMNS = ("question", "org_context", "org_answer", "sub_context", "sub_answer")
NQSWAP_SEED, NQSWAP_ITEMS = 20261128, 500


def confiqa_file(records: list, source: Path) -> bytes:
    """Items 0-24 of a ConFiQA subset, each reduced to CONFIQA_FIELDS in that order, as one JSON list."""
    if not isinstance(records, list) or len(records) < 25:
        raise SystemExit(f"error: {source}: not a JSON list of at least 25 ConFiQA items")
    items = []
    for i, record in enumerate(records[:25]):
        missing = [key for key in CONFIQA_FIELDS if key not in record]
        if missing:
            raise SystemExit(f"error: {source}: item {i} lacks {missing}")
        items.append({key: record[key] for key in CONFIQA_FIELDS})
    return json.dumps(items, ensure_ascii=False, indent=1).encode()


def nqswap_items(rows: list[dict], source: Path) -> list[dict]:
    """NQ-Swap's dev rows (in their published order) to CANOE's CNQ items, with norm = SQuAD's normalisation:
    1. a row is kept when it has one `sub_answer`, norm(sub_answer) occurs in norm(sub_context) and no non-empty
       norm(a) of its `org_answer` does (memory and context must disagree, and the context must hold its answer);
    2. of the kept rows, the first of each distinct question;
    3. those shuffled with random.Random(NQSWAP_SEED), the first NQSWAP_ITEMS;
    4. each as {"uid": "nqswap-<row index>", "question", "context": sub_context, "answer": sub_answer[0],
       "org_answer"}."""
    kept, questions = [], set()
    for i, row in enumerate(rows):
        missing = [key for key in NQSWAP_COLUMNS if key not in row]
        if missing:
            raise SystemExit(f"error: {source}: row {i} lacks {missing}")
        context = normalize(row["sub_context"])
        if (len(row["sub_answer"]) != 1 or normalize(row["sub_answer"][0]) not in context
                or any(normalize(a) and normalize(a) in context for a in row["org_answer"])):
            continue
        if row["question"] not in questions:
            questions.add(row["question"])
            kept.append((i, row))
    random.Random(NQSWAP_SEED).shuffle(kept)
    return [{"uid": f"nqswap-{i}", "question": row["question"], "context": row["sub_context"],
             "answer": row["sub_answer"][0], "org_answer": list(row["org_answer"])}
            for i, row in kept[:NQSWAP_ITEMS]]


def built(args: argparse.Namespace) -> dict[str, bytes]:
    """Every output the given sources make: file name → bytes."""
    files = {}
    if args.followrag:
        files["followrag-nq.json"] = args.followrag.read_bytes()
    if args.confiqa:
        for kind in ("QA", "MR", "MC"):
            source = args.confiqa / f"ConFiQA-{kind}.json"
            if not source.exists():
                raise SystemExit(f"error: {source} not found (--confiqa names Context-DPO's ConFiQA folder)")
            files[f"ConFiQA-{kind}.dev25.json"] = confiqa_file(json.loads(source.read_text()), source)
    if args.nqswap:
        rows = load_records(args.nqswap)
        print(f"{args.nqswap}: {len(rows)} rows (the published dev set has 4,746)")
        items = nqswap_items(rows, args.nqswap)
        files["cnq-nqswap.dev500.json"] = json.dumps(items, ensure_ascii=False, indent=0).encode()
    return files


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=ROOT / "runs" / "benchmarks", help="the folder to write")
    parser.add_argument("--followrag", type=Path, help="FollowRAG's followRAG/followRAG_ifnq.json")
    parser.add_argument("--confiqa", type=Path, help="the folder of Context-DPO's ConFiQA-{QA,MR,MC}.json")
    parser.add_argument("--nqswap", type=Path, help="NQ-Swap's dev split: parquet, JSON or JSONL")
    args = parser.parse_args(argv)
    if not (args.followrag or args.confiqa or args.nqswap):
        parser.error("give at least one of --followrag, --confiqa, --nqswap")
    files = built(args)
    args.out.mkdir(parents=True, exist_ok=True)
    differ = []
    for name, content in files.items():
        (args.out / name).write_bytes(content)
        digest = hashlib.sha256(content).hexdigest()
        same = digest == RECORDED[name]
        print(f"{args.out / name}: sha256 {digest}: "
              + ("the recorded one" if same else f"differs from the recorded {RECORDED[name]}"))
        differ += [] if same else [name]
    if differ:
        raise SystemExit(f"error: {', '.join(differ)} differ from the files the figures in bench/RESULTS.md were "
                         "measured on (docs/evaluation.md, \"The decision set from public sources\")")


if __name__ == "__main__":
    main()
