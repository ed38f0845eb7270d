"""bench/scoreboard.py: the bootstrap intervals, the cache key, the failure counts, the float32 merge of a LoRA
checkpoint, and one whole board on the smoke model (twice: the second reads every output from the cache)."""

from __future__ import annotations

import doctest
import hashlib
import importlib.util
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import SMOKE_MODEL, smoke_lora_checkpoint

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "bench" / "scoreboard.py"
FIXTURES = ROOT / "tests" / "suites"

spec = importlib.util.spec_from_file_location("scoreboard", SCRIPT)
sb = importlib.util.module_from_spec(spec)
sys.modules["scoreboard"] = sb  # its dataclasses look their module up there
spec.loader.exec_module(sb)


def hits(ones: int, n: int) -> np.ndarray:
    return np.array([1.0] * ones + [0.0] * (n - ones))


def test_a_binomial_share_gets_the_normal_approximations_interval():
    # 50 of 100: standard error sqrt(0.5 · 0.5 / 100) = 0.05, so the 95 % interval is 0.5 ± 1.96 · 0.05
    result = sb.bootstrap({"em": hits(50, 100)}, None, sb.mean_of("em", 1.0))
    estimate, lo, hi = result["policy"]
    assert estimate == 0.5 and result["n"] == 100
    assert lo == pytest.approx(0.402, abs=0.012) and hi == pytest.approx(0.598, abs=0.012)
    # in percent, as the suites print, the same interval ×100
    assert sb.bootstrap({"em": hits(50, 100)}, None, sb.mean_of("em", 100.0))["policy"] == pytest.approx(
        [100 * v for v in result["policy"]])


def test_sides_that_agree_item_for_item_differ_by_exactly_zero():
    same = {"em": hits(13, 25)}
    result = sb.bootstrap(same, {"em": same["em"].copy()}, sb.mean_of("em", 100.0))
    assert result["difference"] == [0.0, 0.0, 0.0]
    assert result["policy"][2] - result["policy"][1] > 30  # each side alone is as wide as 25 items make it


def test_the_paired_difference_is_narrower_than_the_two_intervals_suggest():
    # 10 of 100 items flip from wrong to right, the other 90 agree: a real gain of 10 points, which the two
    # unpaired intervals (each about ±10) overlap on, but the paired interval does not include 0
    base = hits(40, 100)
    policy = base.copy()
    policy[40:50] = 1.0
    result = sb.bootstrap({"em": policy}, {"em": base}, sb.mean_of("em", 100.0))
    assert result["difference"][0] == pytest.approx(10.0)
    assert result["policy"][1] < result["plain"][2]  # the unpaired intervals overlap
    assert 3.0 < result["difference"][1] < 10.0 < result["difference"][2] < 17.0


def test_mr_is_the_suites_own_ratio_on_every_draw():
    items = sb.suites.read_suite("confiqa", FIXTURES / "ConFiQA-QA-test.json")
    predictions = [item.others[0] if i % 3 == 0 else item.golds[0] for i, item in enumerate(items)]
    per_item = [sb.suites.item_hits("confiqa", item, p) for item, p in zip(items, predictions)]
    arrays = {k: np.array([float(h[k]) for h in per_item]) for k in ("em", "ps", "po")}
    official = sb.suites.score("confiqa", items, predictions)
    assert sb.memorization_ratio(arrays) == pytest.approx(official["mr"])
    assert sb.mean_of("ps", 100.0)(arrays) == pytest.approx(official["ps"])
    nothing = {"ps": np.zeros((3, 4)), "po": np.zeros((3, 4))}
    assert sb.memorization_ratio(nothing).tolist() == [0.0, 0.0, 0.0]  # no hit either way: 0, as suites.score


def test_the_cache_key_changes_with_each_part_and_nothing_else():
    parts = dict(model="m" * 64, style={"system_prompt": "S", "response_prefix": "<think>"}, file="f" * 64,
                 decoding={"dtype": "bfloat16", "max_tokens": 128, "temperature": 0.0, "suite": None, "items": 300})
    key = sb.cache_key(**parts)
    assert sb.cache_key(**{**parts, "decoding": dict(reversed(list(parts["decoding"].items())))}) == key
    changed = [dict(parts, model="n" * 64), dict(parts, file="g" * 64),
               dict(parts, style={**parts["style"], "response_prefix": ""}),
               dict(parts, style={**parts["style"], "system_prompt": "T"}),
               dict(parts, decoding={**parts["decoding"], "dtype": "float32"}),
               dict(parts, decoding={**parts["decoding"], "max_tokens": 1024}),
               dict(parts, decoding={**parts["decoding"], "items": 299})]
    assert len({key, *(sb.cache_key(**c) for c in changed)}) == 1 + len(changed)


def test_digests_follow_the_bytes(tmp_path):
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    a.write_text("[1]")
    b.write_text("[1]")
    assert sb.digest_files([a]) != sb.digest_files([b])  # the name counts
    first = sb.digest_files([a, b])
    assert sb.digest_files([b, a]) == first
    a.write_text("[2]")
    assert sb.digest_files([a, b]) != first


def test_the_defaults_example_and_the_failure_modes_are_recognised():
    names = sb.example_names(sb.load_config(ROOT / "config.toml").prompt_style())
    assert names == ["Osric Hallam", "Varnel Bridge"]
    # an example given as an earlier exchange: its reply names what could be copied, not the system prompt
    turn = ("<context>The Brell Tower stands in Oskar.</context>\n\nWhere is the Brell Tower?",
            "<think>x</think>\n<long_answer>It stands in Oskar Vale.</long_answer>\n<answer>Oskar</answer>")
    assert sb.example_names({"system_prompt": "<answer>Osric</answer>", "example": turn}) == ["Oskar", "Oskar Vale"]
    problem = "<context>The Tay Bridge was designed by Thomas Bouch.</context>\n\nWho designed the Tay Bridge?"
    assert sb.copies_example("<think>x</think><answer>Osric Hallam</answer>", problem, names)
    assert not sb.copies_example("<think>x</think><answer>Thomas Bouch</answer>", problem, names)
    # a passage that itself names the example's name: answering with it is no copy
    assert not sb.copies_example("<answer>Osric Hallam</answer>", "<context>Osric Hallam built it.</context>", names)
    assert sb.ends_after_think("<think>Bouch.</think>  \n")
    assert not sb.ends_after_think("<think>Bouch.</think><answer>Thomas Bouch</answer>")
    assert not sb.ends_after_think("Thomas Bouch")
    assert sb.example_names({"system_prompt": "You are a helpful assistant."}) == []
    # config.toml's format description without its example names the tags, and nothing an answer could copy
    described = sb.load_config(ROOT / "config.toml").system_prompt
    assert "<answer> and </answer>" in described and sb.example_names({"system_prompt": described}) == []
    # examples drawn per prompt: every one's names, in order
    drawn = sb.example_names(sb.load_config(ROOT / "recipes" / "examples-drawn.toml").prompt_style())
    assert drawn == ["Osric Hallam", "Varnel Bridge", "38 metres", "Corran Light", "Dunmere", "Hessel Lantern Fair",
                     "Green slate"]


@pytest.mark.skipif(not SMOKE_MODEL.exists(), reason="needs `make setup` (models/smoke-llama)")
def test_a_lora_checkpoint_is_merged_in_float32_exactly(tmp_path):
    from safetensors.torch import load_file

    policy, expected = smoke_lora_checkpoint(tmp_path)
    folder, digest, merged_from = sb.policy_folder(policy, tmp_path / "work")
    assert folder == tmp_path / "work" / "merged" and merged_from["adapter"] == str(policy.parent / "adapter")
    assert digest != sb.model_digest(SMOKE_MODEL)
    sb.evaluate.merge_in_float32(merged_from["base"], merged_from["adapter"], folder)
    merged = load_file(folder / "model.safetensors")
    assert expected and all(merged[k].dtype == torch.float32 for k in expected)
    for key, value in expected.items():
        torch.testing.assert_close(merged[key], value, rtol=0, atol=1e-6)
    # a model folder without an adapter beside it is evaluated as it is
    assert sb.policy_folder(SMOKE_MODEL, tmp_path / "w2") == (SMOKE_MODEL, sb.model_digest(SMOKE_MODEL), None)


def test_cnq_counts_the_gold_and_the_original_answer_inside_the_answer_span(tmp_path):
    path = tmp_path / "cnq.json"
    path.write_text(json.dumps([{"question": "who wrote it", "context": "Robin Cousins wrote it.",
                                 "answer": "Robin Cousins", "org_answer": ["William Bryan", "W. Bryan"]}] * 4))
    target = sb.Target("cnq500", path, "cnq")
    items, _ = sb.read_items(target)
    outputs = ["<answer>Robin Cousins</answer>",  # em, and so contains
               "<answer>It was Robin Cousins, not William Bryan</answer>",  # contains and org, no em
               "<answer>W. Bryan</answer>",  # the memorised answer alone
               "Robin Cousins wrote it."]  # no span: the whole output is the answer, as the official em reads it
    hit = sb.per_item_hits(target, items, outputs)
    assert hit["em"].tolist() == [1.0, 0.0, 0.0, 0.0]
    assert hit["contains"].tolist() == [1.0, 1.0, 0.0, 1.0]
    assert hit["org"].tolist() == [0.0, 1.0, 1.0, 0.0]
    # sentence: the gold in the <long_answer>, or in the whole output where it wrote none (a plain answer)
    sentences = ["<long_answer>The passage names Robin Cousins.</long_answer>\n<answer>William Bryan</answer>",
                 "<long_answer>It was written long ago.</long_answer>\n<answer>Robin Cousins</answer>",
                 "<answer>Robin Cousins</answer>", "It was Robin Cousins."]
    sentence = sb.per_item_hits(target, items, sentences)
    assert sentence["sentence"].tolist() == [1.0, 0.0, 1.0, 1.0]
    assert sentence["contains"].tolist() == [0.0, 1.0, 1.0, 1.0]
    # the file CANOE's code reads has no org_answer: nothing is counted as memorised
    path.write_text(json.dumps([{"question": "q", "context": "c", "answer": "Robin Cousins"}]))
    assert sb.per_item_hits(target, sb.read_items(target)[0], ["<answer>W. Bryan</answer>"])["org"].tolist() == [0.0]


def test_the_results_line_leads_with_cnq500():
    def row(policy, diff):
        return {"policy": policy, "plain": [0.0, 0.0, 0.0], "difference": diff, "n": 500}

    table = {"cnq500": {"em": row([41.2, 37.0, 45.6], [12.0, 8.2, 15.8]), "contains": row([60.4, 56.0, 64.8],
                                                                                           [-1.5, -4.0, 1.1]),
                        "sentence": row([55.0, 50.6, 59.4], [1.0, -3.0, 5.0])},
             "confiqa75": {"em": row([60.0, 49.3, 70.7], [4.0, -6.7, 14.7])},
             "nq300": {"em": row([16.0, 12.0, 20.3], [-1.0, -5.0, 2.7])},
             "synthetic": {"contains": row([0.7, 0.65, 0.75], [-0.007, -0.057, 0.043])}}
    copied = {"cnq500": 2, "synthetic": 1}
    assert sb.results_line(table, 7, "bfloat16", "config.toml", copied, 1215) == (
        "scoreboard (seed 7, bfloat16, config.toml): cnq500 em 41.2 [37.0, 45.6] vs plain 12.0 [8.2, 15.8], "
        "contains 60.4 vs plain -1.5 [-4.0, 1.1], sentence 55.0 vs plain 1.0 [-3.0, 5.0]; confiqa75 em 60.0 "
        "[49.3, 70.7] vs plain 4.0 [-6.7, 14.7]; nq300 em 16.0 [12.0, 20.3] vs plain -1.0 [-5.0, 2.7]; synthetic "
        "contains 0.700 [0.650, 0.750] vs plain -0.007 [-0.057, 0.043]; example copied 3 of 1215; cnq500 copied 2 "
        "of 500")
    against = sb.results_line(table, 7, "bfloat16", "config.toml", copied, 1215, "the base with config.toml's prompt")
    assert "cnq500 em 41.2 [37.0, 45.6] vs the base with config.toml's prompt 12.0 [8.2, 15.8]" in against
    assert " vs plain " not in against


@pytest.mark.skipif(not SMOKE_MODEL.exists(), reason="needs `make setup` (models/smoke-llama)")
def test_a_whole_board_on_the_smoke_model_and_then_from_the_cache(tmp_path):
    policy, _ = smoke_lora_checkpoint(tmp_path)
    benchmarks = tmp_path / "benchmarks"
    benchmarks.mkdir()
    for kind in ("QA", "MR", "MC"):
        shutil.copy(FIXTURES / "ConFiQA-QA-test.json", benchmarks / f"ConFiQA-{kind}.dev25.json")
    shutil.copy(FIXTURES / "hq.json", benchmarks / "followrag-nq.json")
    cnq = json.loads((FIXTURES / "conflict_dev_filtered.json").read_text())
    (benchmarks / "cnq-nqswap.dev500.json").write_text(json.dumps([{**r, "org_answer": ["Douglass"]} for r in cnq]))
    synthetic = tmp_path / "eval.jsonl"
    synthetic.write_text("".join(json.dumps({"id": f"e{i}", "task": "counterfactual",
                                             "problem": f"<context>{c} is mentioned here.</context>\n\nWhich city? ({i})",
                                             "solution": f"<answer>{c}</answer>"}) + "\n"
                                 for i, c in enumerate(["Paris", "Lyon", "Rome", "Oslo", "Turin", "Bern"])))
    config = tmp_path / "config.toml"
    config.write_text(f'base = "{ROOT / "recipes" / "smoke.toml"}"\nmodel = "{SMOKE_MODEL}"\n'
                      'suite_max_tokens = 24\nmax_completion_tokens = 24\n')
    command = [sys.executable, str(SCRIPT), "--model", str(policy), "--config", str(config), "--dtype", "float32",
               "--benchmarks", str(benchmarks), "--unchecked-benchmarks", "--synthetic", str(synthetic), "--cache",
               str(tmp_path / "cache"), "--draws", "500"]  # the fixtures are not the recorded files
    first = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert first.returncode == 0, first.stdout[-3000:] + first.stderr[-3000:]
    assert "merging" in first.stdout and "from the cache" not in first.stdout
    report = json.loads((policy.parent / "scoreboard.json").read_text())
    assert {name: f["n"] for name, f in report["files"].items()} == {
        "synthetic": 6, "heldout": 40, "confiqa-qa": 8, "confiqa-mr": 8, "confiqa-mc": 8, "nq300": 4, "cnq500": 4}
    assert set(report["table"]) == {"synthetic", "heldout", "confiqa-qa", "confiqa-mr", "confiqa-mc", "confiqa75",
                                    "nq300", "cnq500"}
    assert report["table"]["confiqa75"]["em"]["n"] == 24 and set(report["table"]["confiqa75"]) == {"em", "ps", "mr"}
    assert set(report["table"]["cnq500"]) == {"em", "contains", "sentence", "org"}
    assert report["items"] == 78 and report["eval_dtype"] == "float32" and report["benchmarks_checked"] is False
    for metrics in report["table"].values():
        for r in metrics.values():
            for side in ("policy", "plain", "difference"):
                e, lo, hi = r[side]
                assert lo <= e <= hi or np.isclose(e, lo) or np.isclose(e, hi)
    line = first.stdout.strip().splitlines()[-1]
    interval = r"-?[\d.]+ \[-?[\d.]+, -?[\d.]+\]"
    assert re.fullmatch(rf"scoreboard \(seed \d+, float32, config\.toml\): cnq500 em {interval} vs plain "
                        rf"{interval}, contains -?[\d.]+ vs plain {interval}, sentence -?[\d.]+ vs plain {interval}; "
                        rf"confiqa75 em {interval} vs plain {interval}; nq300 em {interval} vs plain {interval}; "
                        rf"synthetic contains {interval} vs plain {interval}; example copied \d+ of 78; cnq500 copied "
                        rf"\d+ of 4", line), line
    assert report["results_line"] == line
    assert (policy.parent / "scoreboard.png").stat().st_size > 0
    predictions = (policy.parent / "scoreboard.predictions.jsonl").read_text().splitlines()
    assert len(predictions) == 78

    again = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert again.returncode == 0, again.stderr[-3000:]
    assert "merging" not in again.stdout and again.stdout.count("from the cache") == 14  # 7 files × 2 sides
    assert json.loads((policy.parent / "scoreboard.json").read_text())["table"] == report["table"]


HELDOUT = ROOT / "data" / "heldout" / "faithfulness.jsonl"  # tracked: every checkout has it


@pytest.fixture
def recorded_benchmarks(tmp_path, monkeypatch) -> Path:
    """Five small benchmark files, each recorded as the real one, then cnq-nqswap.dev500.json changed after."""
    folder = tmp_path / "benchmarks"
    folder.mkdir()
    for kind in ("QA", "MR", "MC"):
        shutil.copy(FIXTURES / "ConFiQA-QA-test.json", folder / f"ConFiQA-{kind}.dev25.json")
    shutil.copy(FIXTURES / "hq.json", folder / "followrag-nq.json")
    (folder / "cnq-nqswap.dev500.json").write_text("[]")
    for path in folder.iterdir():
        monkeypatch.setitem(sb.RECORDED, path.name, hashlib.sha256(path.read_bytes()).hexdigest())
    (folder / "cnq-nqswap.dev500.json").write_bytes(MINE)
    return folder


MINE = b'[{"uid": "mine"}]'  # cnq-nqswap.dev500.json once recorded as "[]"


def not_recorded(name: str, folder: Path) -> str:
    """The scoreboard's line for cnq-nqswap.dev500.json changed after it was recorded, under the file name `name`."""
    return (f"error: {name}: {folder / 'cnq-nqswap.dev500.json'} has sha256 {hashlib.sha256(MINE).hexdigest()}, not "
            f"the recorded {hashlib.sha256(b'[]').hexdigest()}: not the file bench/RESULTS.md measured (`make "
            "benchmarks` builds it; --unchecked-benchmarks scores a file of your own)")


def test_a_benchmark_file_not_the_recorded_one_stops_the_decision_set(recorded_benchmarks):
    for only, name in ((None, "cnq500"), (["cnq250"], "cnq250")):
        with pytest.raises(SystemExit) as stopped:
            sb.decision_set(recorded_benchmarks, HELDOUT, HELDOUT, only)
        assert str(stopped.value) == not_recorded(name, recorded_benchmarks)
    # the files recorded pass; unchecked, the changed one too
    assert [t.name for t in sb.decision_set(recorded_benchmarks, HELDOUT, HELDOUT, ["confiqa-qa", "nq300"])] == [
        "confiqa-qa", "nq300"]
    assert [t.name for t in sb.decision_set(recorded_benchmarks, HELDOUT, HELDOUT, checked=False)] == [
        "synthetic", "heldout", "confiqa-qa", "confiqa-mr", "confiqa-mc", "nq300", "cnq500"]


def test_the_scoreboard_stops_on_it_before_any_model_and_the_flag_lets_it_through(tmp_path, recorded_benchmarks,
                                                                                    monkeypatch, capsys):
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text("{}")
    args = ["--model", str(model), "--dtype", "float32", "--benchmarks", str(recorded_benchmarks), "--synthetic",
            str(HELDOUT), "--heldout", str(HELDOUT), "--out", str(tmp_path / "out")]

    def reached(*_):
        raise RuntimeError("the policy's model is read: the files were accepted")

    monkeypatch.setattr(sb, "policy_folder", reached)
    with pytest.raises(SystemExit) as stopped:
        sb.main(args)
    assert str(stopped.value) == not_recorded("cnq500", recorded_benchmarks)
    with pytest.raises(RuntimeError, match="the files were accepted"):
        sb.main([*args, "--unchecked-benchmarks"])
    with pytest.raises(SystemExit):
        sb.main(["--help"])
    assert ("--unchecked-benchmarks score --benchmarks files whose sha256 is not the recorded one (your own files; "
            "by default such a file stops the run)") in " ".join(capsys.readouterr().out.split())


def test_the_pooled_difference_widens_with_the_spread_between_seeds():
    """bench/pool_seeds.py: seeds that disagree (one policy right on every item, one wrong on every item, against a
    base right on half) pool to a difference of 0 whose interval holds both seeds' ±50 points, since draws that
    take one seed twice are as likely as draws that take both; seeds that agree pool to their own interval."""
    spec = importlib.util.spec_from_file_location("pool_seeds", ROOT / "bench" / "pool_seeds.py")
    pool = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(pool)
    result = doctest.testmod(pool)
    assert result.attempted > 0 and result.failed == 0
    base = {"em": hits(100, 200)}
    em = sb.mean_of("em", 100.0)
    estimate, lo, hi = pool.pooled_bootstrap([{"em": hits(200, 200)}, {"em": hits(0, 200)}], base, em, draws=2000)
    assert estimate == 0.0 and lo <= -45 and hi >= 45
    agree = [{"em": hits(150, 200)}] * 3
    pooled = pool.pooled_bootstrap(agree, base, em, draws=2000)
    single = sb.bootstrap(agree[0], base, em, draws=2000)["difference"]
    assert pooled[0] == single[0] == 25.0 and abs(pooled[1] - single[1]) < 2 and abs(pooled[2] - single[2]) < 2
