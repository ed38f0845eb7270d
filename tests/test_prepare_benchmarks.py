"""scripts/prepare_benchmarks.py on small files in each source's own format, written here: FollowRAG's JSON copied
byte for byte, Context-DPO's ConFiQA records cut to 25 items of nine fields, NQ-Swap's dev rows (parquet and
JSONL) selected by each rule; each output's sha256 against the recorded one, a build that differs kept beside the
good file and never over it; each bad source stopped in one line naming it, with no traceback; and `make
benchmarks`, which needs no model, and pyarrow only for NQ-Swap's parquet."""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import random
import shutil
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "scripts" / "prepare_benchmarks.py"
spec = importlib.util.spec_from_file_location("prepare_benchmarks", SCRIPT)
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


def confiqa_expected(kind: str) -> bytes:
    items = [{k: confiqa_record(kind, i)[k] for k in FIELDS} for i in range(25)]
    return json.dumps(items, ensure_ascii=False, indent=1).encode()


def sha256(content: bytes) -> str:
    return hashlib.sha256(content).hexdigest()


def test_each_source_is_built_by_its_rule(tmp_path, sources, monkeypatch, capsys):
    # these small files recorded as the real ones: each is moved into place and said to be the recorded one
    expected = {"followrag-nq.json": sources["followrag"].read_bytes(),
                **{f"ConFiQA-{kind}.dev25.json": confiqa_expected(kind) for kind in ("QA", "MR", "MC")},
                "cnq-nqswap.dev500.json": nqswap_expected()}
    for name, content in expected.items():
        monkeypatch.setitem(prepare.RECORDED, name, sha256(content))
    out = tmp_path / "out"
    prepare.main(["--out", str(out), "--followrag", str(sources["followrag"]), "--confiqa", str(sources["confiqa"]),
                  "--nqswap", str(sources["parquet"])])  # no SystemExit: every one matches
    assert sorted(path.name for path in out.iterdir()) == sorted(expected)  # nothing else: no temporary file left
    assert (out / "followrag-nq.json").read_bytes() == sources["followrag"].read_bytes()
    for kind in ("QA", "MR", "MC"):
        text = (out / f"ConFiQA-{kind}.dev25.json").read_text()
        items = json.loads(text)
        assert [list(item) for item in items] == [FIELDS] * 25  # items 0-24, the nine fields in their order
        assert items == [{k: confiqa_record(kind, i)[k] for k in FIELDS} for i in range(25)]
        assert text.startswith('[\n {\n  "orig_path_labeled": ') and "Zoë" in text  # indent 1, not ASCII-escaped
    assert (out / "cnq-nqswap.dev500.json").read_bytes() == nqswap_expected()
    printed = capsys.readouterr()
    assert printed.out.splitlines() == [f"{sources['parquet']}: 8 rows (the published dev set has 4,746)"] + [
        f"{out / name}: sha256 {sha256(content)}: the recorded one" for name, content in expected.items()]
    assert printed.err == ""


def test_jsonl_and_json_rows_give_the_parquet_files_output(tmp_path, sources, monkeypatch):
    monkeypatch.setitem(prepare.RECORDED, "cnq-nqswap.dev500.json", sha256(nqswap_expected()))
    as_json = tmp_path / "rows.json"
    as_json.write_text(json.dumps([dict(zip(COLUMNS, row[1:])) for row in NQSWAP_ROWS]))
    for source in (sources["jsonl"], as_json):
        prepare.main(["--out", str(tmp_path / source.stem), "--nqswap", str(source)])
        assert (tmp_path / source.stem / "cnq-nqswap.dev500.json").read_bytes() == nqswap_expected()


def test_a_build_that_differs_leaves_the_good_file_and_is_kept_beside_it(tmp_path, sources, monkeypatch, capsys):
    out = tmp_path / "out"
    out.mkdir()
    good = out / "followrag-nq.json"
    good.write_bytes(b'[{"the": "good copy"}]')
    monkeypatch.setitem(prepare.RECORDED, "followrag-nq.json", sha256(good.read_bytes()))
    built = sha256(sources["followrag"].read_bytes())
    with pytest.raises(SystemExit) as stopped:
        prepare.main(["--out", str(out), "--followrag", str(sources["followrag"]), "--confiqa",
                      str(sources["confiqa"])])
    assert stopped.value.code == 1
    assert good.read_bytes() == b'[{"the": "good copy"}]'  # untouched
    assert (out / "followrag-nq.json.differs").read_bytes() == sources["followrag"].read_bytes()
    printed = capsys.readouterr()
    assert printed.err.splitlines() == [  # one line per file: the file, both digests, what became of each
        f"error: {good}: the build's sha256 {built} differs from the recorded {sha256(good.read_bytes())}; the build "
        f"is kept as {out / 'followrag-nq.json.differs'}, {good} left as it was",
        *(f"error: {out / f'ConFiQA-{kind}.dev25.json'}: the build's sha256 {sha256(confiqa_expected(kind))} differs "
          f"from the recorded {prepare.RECORDED[f'ConFiQA-{kind}.dev25.json']}; the build is kept as "
          f"{out / f'ConFiQA-{kind}.dev25.json.differs'}, {out / f'ConFiQA-{kind}.dev25.json'} not written"
          for kind in ("QA", "MR", "MC"))]
    assert sorted(path.name for path in out.iterdir()) == sorted(
        ["followrag-nq.json", "followrag-nq.json.differs"] + [f"ConFiQA-{k}.dev25.json.differs" for k in ("QA", "MR", "MC")])
    # the same build once recorded: it replaces the file of that name
    monkeypatch.setitem(prepare.RECORDED, "followrag-nq.json", built)
    prepare.main(["--out", str(out), "--followrag", str(sources["followrag"])])
    assert good.read_bytes() == sources["followrag"].read_bytes()


def run_script(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), "--out", "out", *args], cwd=cwd, capture_output=True,
                          text=True, timeout=120)


def assert_stopped(done: subprocess.CompletedProcess, line: str, cwd: Path) -> None:
    """The command ended with status 1 on exactly this line, no traceback, and wrote nothing."""
    assert (done.returncode, done.stderr, done.stdout) == (1, line + "\n", ""), done.stderr
    assert not (cwd / "out").exists()


def test_a_truncated_or_jsonl_confiqa_file_is_named_in_one_line(sources):
    tmp = sources["confiqa"].parent
    qa = sources["confiqa"] / "ConFiQA-QA.json"
    whole = qa.read_text()
    qa.write_text(whole[:300])  # cut inside a string
    assert_stopped(run_script("--confiqa", "ConFiQA", cwd=tmp), "error: ConFiQA/ConFiQA-QA.json: the JSON ends early "
                   "(line 1 column 271: Unterminated string starting at): the file is cut short; download it again", tmp)
    qa.write_text(whole[:whole.index('"cf_context"', 100)])  # cut between two fields
    assert_stopped(run_script("--confiqa", "ConFiQA", cwd=tmp), "error: ConFiQA/ConFiQA-QA.json: the JSON ends early "
                   "(line 1 column 467: Expecting property name enclosed in double quotes): the file is cut short; "
                   "download it again", tmp)
    qa.write_text(whole)
    (sources["confiqa"] / "ConFiQA-MR.json").write_text(
        "".join(json.dumps(confiqa_record("MR", i)) + "\n" for i in range(30)))
    assert_stopped(run_script("--confiqa", "ConFiQA", cwd=tmp), "error: ConFiQA/ConFiQA-MR.json: JSON Lines (one value "
                   "per line; line 2 column 1: Extra data), not the JSON list --confiqa needs: Context-DPO's "
                   "ConFiQA/ConFiQA-MR.json", tmp)


def test_a_truncated_nqswap_file_is_named_in_one_line(sources):
    tmp = sources["jsonl"].parent
    text = sources["jsonl"].read_text()
    sources["jsonl"].write_text(text[:-40])
    assert_stopped(run_script("--nqswap", "merged.jsonl", cwd=tmp), "error: merged.jsonl: line 8 is not valid JSON "
                   "(column 77: Unterminated string starting at); the file is cut short: download it again", tmp)
    parquet = sources["parquet"].read_bytes()
    sources["parquet"].write_bytes(parquet[: len(parquet) // 2])
    done = run_script("--nqswap", sources["parquet"].name, cwd=tmp)
    assert done.returncode == 1 and done.stdout == "" and len(done.stderr.splitlines()) == 1, done.stderr
    assert done.stderr.startswith("error: dev-00000-of-00001.parquet: not a readable parquet file (")
    assert done.stderr.endswith("): cut short? download it again\n") and "Traceback" not in done.stderr


def test_a_missing_source_or_a_zipped_confiqa_folder_is_named_in_one_line(sources):
    tmp = sources["confiqa"].parent
    assert_stopped(run_script("--followrag", "FollowRAG/followRAG/followRAG_ifnq.json", cwd=tmp),
                   "error: FollowRAG/followRAG/followRAG_ifnq.json: not found (--followrag names FollowRAG's "
                   "FollowRAG/followRAG/followRAG_ifnq.json)", tmp)
    assert_stopped(run_script("--nqswap", "dev.parquet", cwd=tmp), "error: dev.parquet: not found (--nqswap names "
                   "NQ-Swap's dev split: the hub's parquet file, or JSON / JSONL rows)", tmp)
    zipped = tmp / "zipped"
    zipped.mkdir()
    shutil.make_archive(str(zipped / "ConFiQA"), "zip", sources["confiqa"])
    assert_stopped(run_script("--confiqa", "zipped", cwd=tmp), "error: zipped/ConFiQA-QA.json: not found (it holds "
                   "ConFiQA.zip: unzip it there first)", tmp)
    assert_stopped(run_script("--confiqa", "nowhere", cwd=tmp), "error: nowhere: not found (--confiqa names "
                   "Context-DPO's ConFiQA folder)", tmp)


def test_a_source_missing_a_field_or_file_is_named(tmp_path, sources):
    (sources["confiqa"] / "ConFiQA-MR.json").write_text(json.dumps([{"question": "q"}] * 25))
    with pytest.raises(SystemExit, match=r"ConFiQA-MR\.json: item 0 lacks \['orig_path_labeled'"):
        prepare.main(["--out", str(tmp_path / "out"), "--confiqa", str(sources["confiqa"])])
    (sources["confiqa"] / "ConFiQA-MC.json").unlink()
    (sources["confiqa"] / "ConFiQA-MR.json").write_text(json.dumps([confiqa_record("MR", i) for i in range(25)]))
    with pytest.raises(SystemExit) as stopped:
        prepare.main(["--out", str(tmp_path / "out"), "--confiqa", str(sources["confiqa"])])
    assert str(stopped.value) == (f"error: {sources['confiqa'] / 'ConFiQA-MC.json'}: not found (--confiqa names "
                                  "Context-DPO's ConFiQA folder)")
    assert not (tmp_path / "out").exists()  # every source is read before anything is written


IMPORTED = ("import runpy, sys\nsys.argv = sys.argv[1:]\ntry:\n    runpy.run_path(sys.argv[0], run_name='__main__')\n"
            "except SystemExit:\n    pass\n"
            "print(sorted(m for m in ('datasets', 'pyarrow', 'numpy', 'torch') if m in sys.modules))\n")


def test_followrag_and_confiqa_need_only_the_standard_library(sources):
    tmp = sources["confiqa"].parent
    common = [sys.executable, "-c", IMPORTED, str(SCRIPT), "--out", "out"]
    done = subprocess.run([*common, "--followrag", "followRAG_ifnq.json", "--confiqa", "ConFiQA"], cwd=tmp,
                          capture_output=True, text=True, timeout=120)
    assert done.stdout.splitlines()[-1] == "[]", done.stdout + done.stderr
    done = subprocess.run([*common, "--nqswap", sources["parquet"].name], cwd=tmp, capture_output=True, text=True,
                          timeout=120)
    assert done.stdout.splitlines()[-1] == "['numpy', 'pyarrow']", done.stdout + done.stderr  # no datasets, torch


def test_make_benchmarks_needs_no_model(tmp_path):
    """`make -n` in a copy of the Makefile with no .venv: FollowRAG and ConFiQA run the script with python3 and make
    nothing first; NQ-Swap builds the environment (for pyarrow) but no model."""
    for name in ("Makefile", "requirements.txt"):
        shutil.copy(ROOT / name, tmp_path / name)
    # Under `make test` the outer make's level would have this one print "Entering directory" lines.
    env = {key: value for key, value in os.environ.items() if key not in ("MAKELEVEL", "MAKEFLAGS", "MFLAGS")}
    plain = subprocess.run(["make", "-n", "benchmarks", "FOLLOWRAG=f.json", "CONFIQA=ConFiQA"], cwd=tmp_path,
                           capture_output=True, text=True, timeout=60, env=env)
    assert plain.returncode == 0, plain.stderr
    assert [" ".join(line.split()) for line in plain.stdout.replace("\\\n", " ").splitlines()] == [
        "python3 scripts/prepare_benchmarks.py --out runs/benchmarks --followrag f.json --confiqa ConFiQA"]
    nqswap = subprocess.run(["make", "-n", "benchmarks", "NQSWAP=dev.parquet"], cwd=tmp_path, capture_output=True,
                            text=True, timeout=60, env=env)
    assert nqswap.returncode == 0, nqswap.stderr
    commands = nqswap.stdout.splitlines()
    assert any("pip install -q -r requirements.txt" in line for line in commands)  # the environment, for pyarrow
    assert ".venv/bin/python scripts/prepare_models.py" not in commands and "--nqswap dev.parquet" in nqswap.stdout
