"""Build the decision set's benchmark files (`make scoreboard`, `make compare`, `BENCHMARKS=DIR`) from the public
releases a user downloaded, by the rules of docs/evaluation.md ("The decision set from public sources"), and check
each output's sha256 against the one recorded there (`RECORDED`).

    python3 scripts/prepare_benchmarks.py --out runs/benchmarks \
        --followrag FollowRAG/FollowRAG/followRAG/followRAG_ifnq.json --confiqa Context-DPO/ConFiQA \
        --nqswap NQ-Swap/data/dev-00000-of-00001.parquet
    make benchmarks FOLLOWRAG=F CONFIQA=DIR NQSWAP=F [OUT=runs/benchmarks]

- `--followrag`: FollowRAG's `FollowRAG/followRAG/followRAG_ifnq.json`, copied byte for byte to followrag-nq.json;
- `--confiqa`: a folder with Context-DPO's `ConFiQA-QA.json`, `ConFiQA-MR.json` and `ConFiQA-MC.json`: items 0-24
  of each, nine fields (`CONFIQA_FIELDS`), to ConFiQA-{QA,MR,MC}.dev25.json;
- `--nqswap`: NQ-Swap's dev split (the hub's parquet file, or JSON / JSONL rows with its five columns): the rows
  `nqswap_items` keeps, to cnq-nqswap.dev500.json.

FollowRAG and ConFiQA need only the standard library; NQ-Swap's parquet needs `datasets` (imported only then).
Every source is read and checked before anything is written; a source that cannot be used stops it with one line
naming the file and what is wrong with it (exit status 1). Each output is written under a temporary name and moved
into place only when its sha256 is the recorded one; one that differs leaves the file of that name as it was, is
kept beside it as NAME.differs, and is named in one line with both digests (exit status 1): it is not the file
bench/RESULTS.md measured (docs/evaluation.md says which sources could not be compared byte for byte).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import random
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

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


def stop(path: Path, what: str) -> SystemExit:
    """The one line that stops the build: the file and what is wrong with it."""
    return SystemExit(f"error: {path}: {what}")


def source_text(path: Path, flag: str, expected: str) -> str:
    """The text of a source file; a missing, unreadable, empty or not UTF-8 one stops the build."""
    try:
        text = path.read_bytes().decode("utf-8")
    except FileNotFoundError:
        raise stop(path, f"not found ({flag} names {expected})") from None
    except UnicodeDecodeError as err:
        raise stop(path, f"not UTF-8 text (byte {err.start}): not {expected}") from None
    except OSError as err:
        raise stop(path, f"cannot be read ({err.strerror or err})") from None
    if not text.strip():
        raise stop(path, f"empty: not {expected}")
    return text


def json_list(path: Path, flag: str, expected: str) -> list:
    """The JSON list a source file holds. A file cut short, JSON Lines where the list belongs, other JSON or another
    value stops the build with one line saying which."""
    text = source_text(path, flag, expected)
    try:
        value = json.loads(text)
    except json.JSONDecodeError as err:
        where = f"line {err.lineno} column {err.colno}: {err.msg}"
        if err.msg == "Extra data":
            lines = "JSON Lines (one value per line" if text.lstrip().startswith("{") else "more than one JSON value ("
            raise stop(path, f"{lines}; {where}), not the JSON list {flag} needs: {expected}") from None
        if err.pos >= len(text.rstrip()) or err.msg.startswith("Unterminated string"):
            raise stop(path, f"the JSON ends early ({where}): the file is cut short; download it again") from None
        raise stop(path, f"not valid JSON ({where})") from None
    if not isinstance(value, list):
        raise stop(path, f"a JSON {type(value).__name__}, not the JSON list {flag} needs: {expected}")
    return value


def jsonl_rows(path: Path, flag: str, expected: str) -> list:
    """The rows of a JSON Lines file; the first line that is not JSON stops the build, named."""
    lines = source_text(path, flag, expected).split("\n")
    rows = []
    for number, line in enumerate(lines, 1):
        if line.strip():
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError as err:
                cut = "; the file is cut short: download it again" if not "".join(lines[number:]).strip() else ""
                raise stop(path, f"line {number} is not valid JSON (column {err.colno}: {err.msg}){cut}") from None
    return rows


def confiqa_file(records: list, source: Path) -> bytes:
    """Items 0-24 of a ConFiQA subset, each reduced to CONFIQA_FIELDS in that order, as one JSON list."""
    if len(records) < 25:
        raise stop(source, f"{len(records)} items, not the at least 25 of a ConFiQA subset")
    items = []
    for i, record in enumerate(records[:25]):
        if not isinstance(record, dict):
            raise stop(source, f"item {i} is a JSON {type(record).__name__}, not a ConFiQA record")
        missing = [key for key in CONFIQA_FIELDS if key not in record]
        if missing:
            raise stop(source, f"item {i} lacks {missing}")
        items.append({key: record[key] for key in CONFIQA_FIELDS})
    return json.dumps(items, ensure_ascii=False, indent=1).encode()


def nqswap_rows(path: Path) -> list:
    """NQ-Swap's dev rows from a JSON list or JSON Lines (the standard library) or the hub's parquet file (pyarrow,
    which `make setup` installs with `datasets`, imported only here)."""
    expected = "NQ-Swap's dev split: the hub's parquet file, or JSON / JSONL rows"
    if path.suffix.lower() == ".json":
        return json_list(path, "--nqswap", expected)
    if path.suffix.lower() == ".jsonl":
        return jsonl_rows(path, "--nqswap", expected)
    try:
        import pyarrow.parquet
    except ModuleNotFoundError as err:
        raise stop(path, f"reading parquet needs the {err.name!r} package: run `make setup` (or give the rows as "
                   "JSONL)") from None
    try:
        return pyarrow.parquet.read_table(path).to_pylist()
    except FileNotFoundError:
        raise stop(path, f"not found (--nqswap names {expected})") from None
    except (OSError, pyarrow.ArrowException) as err:
        raise stop(path, f"not a readable parquet file ({str(err).splitlines()[0]}): cut short? download it "
                   "again") from None


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
        if not isinstance(row, dict):
            raise stop(source, f"row {i} is a JSON {type(row).__name__}, not an NQ-Swap row")
        missing = [key for key in NQSWAP_COLUMNS if key not in row]
        if missing:
            raise stop(source, f"row {i} lacks {missing}")
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


def confiqa_source(folder: Path, kind: str) -> Path:
    """Context-DPO's ConFiQA-`kind`.json in `folder`; a missing one stops the build, pointing at a zip to unpack."""
    source = folder / f"ConFiQA-{kind}.json"
    if not folder.is_dir():
        found = "a file, not a folder" if folder.exists() else "not found"
        raise stop(folder, f"{found} (--confiqa names Context-DPO's ConFiQA folder)")
    if not source.exists():
        zips = ", ".join(sorted(path.name for path in folder.glob("*.zip")))
        hint = f"it holds {zips}: unzip it there first" if zips else "--confiqa names Context-DPO's ConFiQA folder"
        raise stop(source, f"not found ({hint})")
    return source


def built(args: argparse.Namespace) -> dict[str, bytes]:
    """Every output the given sources make: file name → bytes."""
    files = {}
    if args.followrag:
        json_list(args.followrag, "--followrag", "FollowRAG's FollowRAG/followRAG/followRAG_ifnq.json")
        files["followrag-nq.json"] = args.followrag.read_bytes()
    if args.confiqa:
        for kind in ("QA", "MR", "MC"):
            source = confiqa_source(args.confiqa, kind)
            records = json_list(source, "--confiqa", f"Context-DPO's ConFiQA/ConFiQA-{kind}.json")
            files[f"ConFiQA-{kind}.dev25.json"] = confiqa_file(records, source)
    if args.nqswap:
        rows = nqswap_rows(args.nqswap)
        print(f"{args.nqswap}: {len(rows)} rows (the published dev set has 4,746)")
        items = nqswap_items(rows, args.nqswap)
        files["cnq-nqswap.dev500.json"] = json.dumps(items, ensure_ascii=False, indent=0).encode()
    return files


def write_checked(out: Path, name: str, content: bytes) -> str | None:
    """`content` written to a temporary name in `out`, its sha256 read back, then moved to `out/name` when it is
    the recorded one (None); else kept beside as NAME.differs, `out/name` left as it was, and the line saying so."""
    target, temporary, kept = out / name, out / f".{name}.tmp", out / f"{name}.differs"
    temporary.write_bytes(content)
    digest = hashlib.sha256(temporary.read_bytes()).hexdigest()
    if digest == RECORDED[name]:
        os.replace(temporary, target)
        print(f"{target}: sha256 {digest}: the recorded one")
        return None
    os.replace(temporary, kept)
    left = "left as it was" if target.exists() else "not written"
    return (f"error: {target}: the build's sha256 {digest} differs from the recorded {RECORDED[name]}; the build is "
            f"kept as {kept}, {target} {left}")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=ROOT / "runs" / "benchmarks", help="the folder to write")
    parser.add_argument("--followrag", type=Path, help="FollowRAG's FollowRAG/followRAG/followRAG_ifnq.json")
    parser.add_argument("--confiqa", type=Path, help="the folder of Context-DPO's ConFiQA-{QA,MR,MC}.json")
    parser.add_argument("--nqswap", type=Path, help="NQ-Swap's dev split: parquet, JSON or JSONL")
    args = parser.parse_args(argv)
    if not (args.followrag or args.confiqa or args.nqswap):
        parser.error("give at least one of --followrag, --confiqa, --nqswap")
    files = built(args)
    args.out.mkdir(parents=True, exist_ok=True)
    differ = [line for name, content in files.items() if (line := write_checked(args.out, name, content))]
    if differ:
        print("\n".join(differ), file=sys.stderr)
        raise SystemExit(1)


if __name__ == "__main__":
    main()
