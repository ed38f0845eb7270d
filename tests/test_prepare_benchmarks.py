"""scripts/prepare_benchmarks.py on small files in each source's own format, written here: FollowRAG's JSON copied
byte for byte, Context-DPO's ConFiQA records cut to 25 items of nine fields, NQ-Swap's dev rows (parquet and
JSONL) selected by each rule; each output's sha256 against the recorded one."""

from __future__ import annotations

import hashlib
import importlib.util
import json
import random
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

ROOT = Path(__file__).resolve().parent.parent
spec = importlib.util.spec_from_file_location("prepare_benchmarks", ROOT / "scripts" / "prepare_benchmarks.py")
prepare = importlib.util.module_from_spec(spec)
spec.loader.exec_module(prepare)

FIELDS = ["orig_path_labeled", "cf_path_labeled", "orig_answer", "cf_answer", "orig_alias", "cf_alias", "question",
          "orig_context", "cf_context"]


def confiqa_record(kind: str, i: int) -> dict:
    """A Context-DPO record: the nine fields in another order and two more that the output leaves out."""
    return {"question": f"Who composed work {i} ({kind})?", "cf_context": f"Work {i} was composed by Zoë Ivers.",
            "orig_context": f"Work {i} was composed by Ann Lee.", "orig_answer": "Ann Lee", "cf_answer": "Zoë Ivers",
            "orig_alias": ["A. Lee"], "cf_alias": [], "orig_path_labeled": f"[('Work {i}', 'composer', 'Ann Lee')]",
            "cf_path_labeled": f"[('Work {i}', 'composer', 'Zoë Ivers')]", "orig_triples": [["w", "c", "a"]],
            "type": kind}


# NQ-Swap dev rows, each named for the rule that keeps or drops it.
NQSWAP_ROWS = [
    ("kept", "who sang hey jude", "<P> Hey Jude was sung by The Beatles. </P>", ["Paul McCartney"],
     "<P> Hey Jude was sung by The Beatles . </P>", ["the Beatles"]),  # articles and punctuation normalised away
    ("two sub answers", "q2", "c", ["a"], "<P> Alpha and Beta </P>", ["Alpha", "Beta"]),
    ("sub answer absent", "q3", "c", ["a"], "<P> nothing here </P>", ["Gamma"]),
    ("org answer present", "q4", "c", ["Delta"], "<P> Delta and Epsilon </P>", ["Epsilon"]),
    ("kept: an empty org answer counts for nothing", "q5", "c", ["", "Zeta"], "<P> Eta wins </P>", ["Eta"]),
    ("kept", "q6", "c", ["Theta"], "<P> Iota wins </P>", ["Iota"]),
    ("a question seen before", "q6", "c", ["Theta"], "<P> Kappa wins </P>", ["Kappa"]),
    ("kept", "q8", "c", ["Mu"], "<P> Nu, the river </P>", ["nu"]),
]
COLUMNS = ["question", "org_context", "org_answer", "sub_context", "sub_answer"]


def nqswap_expected() -> bytes:
    """The rules applied by hand: rows 0, 4, 5 and 7 are kept (see NQSWAP_ROWS), then shuffled as the rule says."""
    kept = [0, 4, 5, 7]
    assert [i for i, row in enumerate(NQSWAP_ROWS) if row[0].startswith("kept")] == kept
    random.Random(20261128).shuffle(kept)
    items = [{"uid": f"nqswap-{i}", "question": NQSWAP_ROWS[i][1], "context": NQSWAP_ROWS[i][4],
              "answer": NQSWAP_ROWS[i][5][0], "org_answer": NQSWAP_ROWS[i][3]} for i in kept]
    return json.dumps(items, ensure_ascii=False, indent=0).encode()


@pytest.fixture
def sources(tmp_path) -> dict[str, Path]:
    followrag = tmp_path / "followRAG_ifnq.json"
    followrag.write_text('[\n    {\n        "key": 0,\n        "type": "ifnq",\n        "question": "who is it",\n'
                         '        "answer_gold": "Ann / Lee"\n    }\n]')
    confiqa = tmp_path / "ConFiQA"
    confiqa.mkdir()
    for kind in ("QA", "MR", "MC"):
        (confiqa / f"ConFiQA-{kind}.json").write_text(json.dumps([confiqa_record(kind, i) for i in range(30)]))
    rows = [dict(zip(COLUMNS, row[1:])) for row in NQSWAP_ROWS]
    parquet = tmp_path / "dev-00000-of-00001.parquet"
    pq.write_table(pa.Table.from_pylist(rows), parquet)
    jsonl = tmp_path / "merged.jsonl"
    jsonl.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return {"followrag": followrag, "confiqa": confiqa, "parquet": parquet, "jsonl": jsonl}


def test_each_source_is_built_by_its_rule(tmp_path, sources, capsys):
    out = tmp_path / "out"
    with pytest.raises(SystemExit, match=r"followrag-nq\.json, ConFiQA-QA\.dev25\.json, .* differ from the files"):
        prepare.main(["--out", str(out), "--followrag", str(sources["followrag"]), "--confiqa",
                      str(sources["confiqa"]), "--nqswap", str(sources["parquet"])])
    assert (out / "followrag-nq.json").read_bytes() == sources["followrag"].read_bytes()
    for kind in ("QA", "MR", "MC"):
        text = (out / f"ConFiQA-{kind}.dev25.json").read_text()
        items = json.loads(text)
        assert [list(item) for item in items] == [FIELDS] * 25  # items 0-24, the nine fields in their order
        assert items == [{k: confiqa_record(kind, i)[k] for k in FIELDS} for i in range(25)]
        assert text.startswith('[\n {\n  "orig_path_labeled": ') and "Zoë" in text  # indent 1, not ASCII-escaped
    assert (out / "cnq-nqswap.dev500.json").read_bytes() == nqswap_expected()
    # a line per output with its sha256 and whether it is the recorded one (these small files are not)
    printed = capsys.readouterr().out
    digest = hashlib.sha256(nqswap_expected()).hexdigest()
    assert f"cnq-nqswap.dev500.json: sha256 {digest}: differs from the recorded {prepare.RECORDED['cnq-nqswap.dev500.json']}" in printed


def test_jsonl_rows_give_the_parquet_files_output_and_a_recorded_sha256_passes(tmp_path, sources, monkeypatch,
                                                                                 capsys):
    monkeypatch.setitem(prepare.RECORDED, "cnq-nqswap.dev500.json", hashlib.sha256(nqswap_expected()).hexdigest())
    prepare.main(["--out", str(tmp_path / "out"), "--nqswap", str(sources["jsonl"])])  # no SystemExit: it matches
    assert (tmp_path / "out" / "cnq-nqswap.dev500.json").read_bytes() == nqswap_expected()
    assert "sha256 " + prepare.RECORDED["cnq-nqswap.dev500.json"] + ": the recorded one" in capsys.readouterr().out


def test_a_source_missing_a_field_or_file_is_named(tmp_path, sources):
    (sources["confiqa"] / "ConFiQA-MR.json").write_text(json.dumps([{"question": "q"}] * 25))
    with pytest.raises(SystemExit, match=r"ConFiQA-MR\.json: item 0 lacks \['orig_path_labeled'"):
        prepare.main(["--out", str(tmp_path / "out"), "--confiqa", str(sources["confiqa"])])
    (sources["confiqa"] / "ConFiQA-MC.json").unlink()
    (sources["confiqa"] / "ConFiQA-MR.json").write_text(json.dumps([confiqa_record("MR", i) for i in range(25)]))
    with pytest.raises(SystemExit, match=r"ConFiQA-MC\.json not found"):
        prepare.main(["--out", str(tmp_path / "out"), "--confiqa", str(sources["confiqa"])])
