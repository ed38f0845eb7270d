"""bench/compare.py: the verdict on made-up per-item hits, the checks made before any training, the runs' folders
and states, and the whole command on the smoke recipe (two seeds, a few items), run twice (the second trains and
scores nothing) and then planned with another candidate (whose run is not taken for the first one's)."""

from __future__ import annotations

import argparse
import dataclasses
import importlib.util
import json
import re
import subprocess
import sys
import time
import tomllib
from pathlib import Path

import numpy as np
import pytest
from conftest import SMOKE_MODEL

import config

ROOT = Path(__file__).resolve().parent.parent

spec = importlib.util.spec_from_file_location("compare", ROOT / "bench" / "compare.py")
compare = importlib.util.module_from_spec(spec)
sys.modules["compare"] = compare  # its dataclasses look their module up there
spec.loader.exec_module(compare)

from test_train import smoke_data, write_config  # noqa: E402,F401  (smoke_data: the fixture, shared)


def hits(right: list[int], n: int) -> np.ndarray:
    """0/1 per item, 1 on the items listed."""
    out = np.zeros(n)
    out[right] = 1.0
    return out


def side(policies: list[np.ndarray], plain: np.ndarray) -> dict[str, list[dict]]:
    """pool_seeds.read_hits' shape for one file, "synthetic", with the same hits for em and contains."""
    return {"synthetic": [{"policy": {"em": p, "contains": p}, "plain": {"em": plain, "contains": plain}}
                          for p in policies]}


N = 100
PLAIN = hits(list(range(50)), N)  # the plain base: right on items 0-49
BASELINE = hits(list(range(40)), N)  # the baseline's runs: right on items 0-39
NAMES = ("candidate", "default")
RULES = compare.Rules(("synthetic", "contains"))


def with_flips(wins: list[int], losses: list[int]) -> np.ndarray:
    """The baseline's hits with the `wins` (items 40-99) turned right and the `losses` (items 0-39) wrong."""
    out = BASELINE.copy()
    out[wins], out[losses] = 1.0, 0.0
    return out


def test_seeds_that_disagree_pool_to_an_interval_across_zero():
    # seed 42 wins 20 items, seed 7 loses 20: each seed's interval excludes 0, on opposite sides; pooled, the
    # difference is 0 and its interval holds both seeds' (a draw may take either seed twice)
    candidate = [with_flips(list(range(40, 60)), []), with_flips([], list(range(20)))]
    table = compare.compare_table(side(candidate, PLAIN), side([BASELINE, BASELINE], PLAIN), draws=2000)
    found = table["synthetic"]["contains"]["candidate - baseline"]
    (e1, lo1, hi1), (e2, lo2, hi2) = found["seeds"]
    assert (e1, e2) == (pytest.approx(0.2), pytest.approx(-0.2)) and lo1 > 0 and hi2 < 0
    assert found["pooled"][0] == pytest.approx(0.0) and found["pooled"][1] < -0.1 and found["pooled"][2] > 0.1
    adopted, line = compare.verdict(table, RULES, [42, 7], NAMES)
    assert not adopted and line.startswith("verdict (candidate − default): not adopted: synthetic contains 0.000 [")
    assert "worse beyond" not in line  # the pooled interval holds 0: no loss either
    # the other two columns: the baseline's own gain over the plain base, −0.10 on every seed; the candidate's
    # is the sum of the two
    assert table["synthetic"]["contains"]["baseline - plain"]["pooled"][0] == pytest.approx(-0.1)
    assert table["synthetic"]["contains"]["candidate - plain"]["seeds"][0][0] == pytest.approx(0.1)
    assert table["synthetic"]["contains"]["plain"] == 0.5 and table["synthetic"]["contains"]["n"] == N


def test_seeds_that_each_hold_zero_can_pool_above_it():
    # each of four seeds: 10 items won, 4 lost (+0.06), on items of its own; each seed's interval holds 0, the four
    # pooled do not (their lower end is near +0.015 on any of the bootstrap's seeds). The default rule adopts it,
    # --each-seed does not.
    seeds = [42, 7, 1234, 5]
    candidate = [with_flips(list(range(40 + 15 * s, 50 + 15 * s)), list(range(4 * s, 4 * s + 4))) for s in range(4)]
    table = compare.compare_table(side(candidate, PLAIN), side([BASELINE] * 4, PLAIN), draws=4000)
    found = table["synthetic"]["contains"]["candidate - baseline"]
    assert all(d[0] == pytest.approx(0.06) and d[1] < 0 < d[2] for d in found["seeds"])
    assert found["pooled"][0] == pytest.approx(0.06) and found["pooled"][1] > 0
    adopted, line = compare.verdict(table, RULES, seeds, NAMES)
    assert adopted, line
    assert line.startswith("verdict (candidate − default): adopted: synthetic contains +0.060 [")
    adopted, line = compare.verdict(table, dataclasses.replace(RULES, each_seed=True), seeds, NAMES)
    assert not adopted and "on seed 42 +0.060 [−" in line and "seed 5 +0.060 [−" in line
    # a margin above the pooled lower end fails it too
    assert not compare.verdict(table, dataclasses.replace(RULES, margin=0.05), seeds, NAMES)[0]


def test_a_loss_on_another_row_stops_a_winning_candidate():
    win = with_flips(list(range(40, 70)), [])
    synthetic = side([win, win], PLAIN)["synthetic"]
    worse = [{"policy": {"em": BASELINE, "contains": with_flips([], list(range(30)))}, "plain": entry["plain"]}
             for entry in synthetic]
    candidate = {"synthetic": synthetic, "heldout": worse}
    baseline = {name: side([BASELINE, BASELINE], PLAIN)["synthetic"] for name in ("synthetic", "heldout")}
    table = compare.compare_table(candidate, baseline, draws=2000)
    adopted, line = compare.verdict(table, RULES, [42, 7], NAMES)
    assert not adopted
    assert re.fullmatch(r"verdict \(candidate − default\): not adopted: worse beyond their intervals: heldout "
                        r"contains −0\.300 \[−0\.\d+, −0\.\d+\]", line), line
    assert "heldout em" not in line  # em equal on every item: 0, no loss
    assert compare.verdict(table, dataclasses.replace(RULES, allow_losses=True), [42, 7], NAMES)[0]


def test_numbers_are_written_as_the_readme_writes_them():
    assert compare.signed([-1e-12, -0.25, 0.25], percent=False) == "0.000 [−0.250, 0.250]"
    assert compare.signed([17.44, 12.8, 22.0], percent=True) == "+17.4 [12.8, 22.0]"
    assert compare.signed([-7.4, -11.6, -3.04], percent=True) == "−7.4 [−11.6, −3.0]"


def test_memory_winning_counts_as_worse_when_it_rises():
    assert compare.better("mr", [2.0, 1.0, 3.0]) == [-2.0, -3.0, -1.0]  # mr up: worse beyond its interval
    assert compare.better("org", [-1.0, -2.0, -0.5]) == [1.0, 0.5, 2.0]
    assert compare.better("em", [2.0, 1.0, 3.0]) == [2.0, 1.0, 3.0]


def test_the_markdown_table_has_a_row_per_file_and_metric_and_three_columns_per_seed_and_pooled():
    candidate = [with_flips(list(range(40, 60)), []), BASELINE]
    table = compare.compare_table(side(candidate, PLAIN), side([BASELINE, BASELINE], PLAIN), draws=200)
    head, rule, *rows = compare.markdown_table(table, [42, 7], NAMES)
    assert head.split(" | ")[2:5] == ["candidate − plain, seed 42", "candidate − plain, seed 7",
                                      "candidate − plain, pooled"]
    assert head.count("|") - 1 == rule.count("|") - 1 == 2 + 3 * 3 + 1
    assert [r.split(" | ")[0] for r in rows] == ["| synthetic (100): em", "| synthetic (100): contains"]
    assert rows[1].split(" | ")[1] == "0.500" and rows[1].split(" | ")[8].startswith("+0.200 [")
    # the last column: the half-width of the pooled candidate − default interval, what the run can detect
    assert head.endswith(" | ± of candidate − default, pooled |")
    _, lo, hi = table["synthetic"]["contains"]["candidate - baseline"]["pooled"]
    assert rows[1].split(" | ")[-1] == f"{(hi - lo) / 2:.3f} |" and hi - lo > 0.01


# ---------------------------------------------------------------------------------------- before any training


HELDOUT = ROOT / "data" / "heldout" / "faithfulness.jsonl"  # tracked: a data file every checkout has


def small_config(tmp_path: Path, text: str = "", train_file: Path = HELDOUT) -> list[str]:
    """compare's arguments for the smoke recipe on files every checkout has, its baseline the same config."""
    path = tmp_path / "idea.toml"
    path.write_text(f'base = "{ROOT / "recipes" / "smoke.toml"}"\ntrain_file = "{train_file}"\n{text}')
    return ["--config", str(path), "--baseline", str(path), "--synthetic", str(HELDOUT), "--heldout", str(HELDOUT),
            "--runs", str(tmp_path / "runs")]


def test_a_config_error_stops_it_with_the_trainers_message(tmp_path):
    args = small_config(tmp_path, "[rewards]\naccuracy = 1.0\nbrevity = 0.5\n")
    with pytest.raises(compare.ConfigError) as trainer:
        compare.load_config(args[1])
    with pytest.raises(SystemExit) as stopped:
        compare.main(args)
    assert str(stopped.value) == f"error: {trainer.value}" and "unknown ['brevity']" in str(stopped.value)
    assert not (tmp_path / "runs").exists()


@pytest.mark.skipif(not SMOKE_MODEL.exists(), reason="run `make setup` first (makes models/smoke-llama)")
def test_a_missing_benchmark_file_or_an_unknown_primary_metric_stops_it(tmp_path):
    args = small_config(tmp_path)
    with pytest.raises(SystemExit, match=r"error: confiqa-qa: .*ConFiQA-QA\.dev25\.json not found"):
        compare.main([*args, "--benchmarks", str(tmp_path)])
    with pytest.raises(SystemExit, match=r"--primary cnq500:em: not a row and metric of this decision set "
                                         r"\(synthetic:em, synthetic:contains, heldout:em, heldout:contains\)"):
        compare.main([*args, "--primary", "cnq500:em"])
    with pytest.raises(SystemExit, match=r"error: nowhere\.jsonl: data file not found"):
        compare.main(small_config(tmp_path, train_file=Path("nowhere.jsonl")))
    assert not (tmp_path / "runs").exists()


@pytest.mark.skipif(not SMOKE_MODEL.exists(), reason="run `make setup` first (makes models/smoke-llama)")
def test_a_screen_is_one_seed_on_cnq250_alone(tmp_path, capsys):
    args = small_config(tmp_path)
    with pytest.raises(SystemExit, match=r"error: --screen --seeds \[42, 7\]: a screen is one seed"):
        compare.main([*args, "--screen", "--seeds", "42", "7"])
    benchmarks = tmp_path / "benchmarks"  # NQ-Swap's file alone: a screen needs no other
    benchmarks.mkdir()
    (benchmarks / "cnq-nqswap.dev500.json").write_text("[]")
    mine = ["--benchmarks", str(benchmarks), "--unchecked-benchmarks"]  # "[]" is not the recorded file
    compare.main([*args, "--screen", *mine, "--dry-run"])
    tasks = [line.split(": ")[0] for line in capsys.readouterr().out.splitlines() if line.startswith("[")]
    assert tasks == ["[1/2] training idea seed 42", "[2/2] scoring idea seed 42"]  # the config against itself
    screen = compare.checked(compare.parse([*args, "--screen", *mine]))
    (target,), rules = screen[2], screen[3]  # cnq500's file, its first 250 items, the verdict read on them
    assert (target.name, target.path.name, target.suite, target.limit) == ("cnq250", "cnq-nqswap.dev500.json", "cnq",
                                                                           250)
    assert rules.primary == ("cnq250", "em")
    assert "cnq250" not in {t.name for t in compare.scoreboard.benchmark_targets(benchmarks)}  # not in the full set
    with pytest.raises(SystemExit, match=r"error: confiqa-qa: .*ConFiQA-QA\.dev25\.json not found"):
        compare.main([*args, "--benchmarks", str(benchmarks), "--dry-run"])  # the compare needs all five


@pytest.mark.skipif(not SMOKE_MODEL.exists(), reason="run `make setup` first (makes models/smoke-llama)")
def test_a_benchmark_file_not_the_recorded_one_stops_it_before_training_unless_unchecked(tmp_path, monkeypatch,
                                                                                        capsys):
    args = small_config(tmp_path)
    benchmarks = tmp_path / "benchmarks"
    benchmarks.mkdir()
    (benchmarks / "cnq-nqswap.dev500.json").write_text("[]")
    monkeypatch.setitem(compare.scoreboard.RECORDED, "cnq-nqswap.dev500.json", "0" * 64)
    with pytest.raises(SystemExit) as stopped:
        compare.main([*args, "--screen", "--benchmarks", str(benchmarks), "--dry-run"])
    assert str(stopped.value) == (
        f"error: cnq250: {benchmarks / 'cnq-nqswap.dev500.json'} has sha256 "
        f"4f53cda18c2baa0c0354bb5f9a3ecbe5ed12ab4d8e11ba873c2f11161202b945, not the recorded {'0' * 64}: not the "
        "file bench/RESULTS.md measured (`make benchmarks` builds it; --unchecked-benchmarks scores a file of your own)")
    assert not (tmp_path / "runs").exists()
    compare.main([*args, "--screen", "--benchmarks", str(benchmarks), "--unchecked-benchmarks", "--dry-run"])
    assert "dry run: " in capsys.readouterr().out


def test_the_flag_reaches_the_scoreboard(tmp_path, monkeypatch):
    run = compare.plan_run("default", compare.load_config(ROOT / "config.toml"), 7, "abc", "float32", tmp_path)
    (run.folder / "checkpoints" / "step-000001").mkdir(parents=True)
    (run.folder / "checkpoints" / "latest").write_text("step-000001")
    (run.folder / "checkpoints" / "step-000001" / "trainer_state.json").write_text("{}")
    commands = []
    monkeypatch.setattr(compare.subprocess, "run", lambda command, **_: commands.append(command) or
                        subprocess.CompletedProcess(command, 0))
    for flags in ([], ["--unchecked-benchmarks"]):
        args = compare.parse(["--config", str(ROOT / "config.toml"), "--benchmarks", str(tmp_path), *flags])
        compare.score(run, {"cnq500": "b"}, args)
    assert [command[command.index("--benchmarks"):] for command in commands] == [
        ["--benchmarks", str(tmp_path)], ["--benchmarks", str(tmp_path), "--unchecked-benchmarks"]]


def test_a_run_scored_on_more_files_is_scored_for_fewer(tmp_path):
    run = compare.plan_run("default", compare.load_config(ROOT / "config.toml"), 7, "abc", "float32", tmp_path)
    (run.folder / "checkpoints" / "step-000001").mkdir(parents=True)
    (run.folder / "checkpoints" / "latest").write_text("step-000001")
    (run.folder / "checkpoints" / "step-000001" / "trainer_state.json").write_text("{}")
    marker = run.folder / "checkpoints" / "step-000001" / compare.SCORED
    marker.write_text(json.dumps({"files": {"synthetic": "a", "cnq500": "b"}, "seconds": 1.0}))
    assert compare.scored(run, {"cnq500": "b"}) and compare.scored(run, {"synthetic": "a", "cnq500": "b"})
    assert not compare.scored(run, {"cnq500": "c"}) and not compare.scored(run, {"cnq500": "b", "nq300": "d"})


def test_a_runs_folder_follows_its_config_seed_code_and_dtype_and_nothing_else(tmp_path):
    cfg = compare.load_config(ROOT / "config.toml")
    run = compare.plan_run("default", cfg, 7, "abc", "bfloat16", tmp_path)
    assert run.cfg.seed == 7 and run.folder.parent == tmp_path and run.folder.name.startswith("s7-")
    moved = dataclasses.replace(cfg, output_dir="runs/elsewhere")
    assert compare.plan_run("candidate", moved, 7, "abc", "bfloat16", tmp_path).folder == run.folder
    others = [compare.plan_run("c", dataclasses.replace(cfg, learning_rate=1e-4), 7, "abc", "bfloat16", tmp_path),
              compare.plan_run("c", dataclasses.replace(cfg, rewards={**cfg.rewards, "length": 0.5}), 7, "abc",
                               "bfloat16", tmp_path),
              compare.plan_run("c", cfg, 42, "abc", "bfloat16", tmp_path),
              compare.plan_run("c", cfg, 7, "abd", "bfloat16", tmp_path),
              compare.plan_run("c", cfg, 7, "abc", "float32", tmp_path)]
    assert len({run.folder, *(o.folder for o in others)}) == 6
    # the config it trains with reads back as the resolved config (the prompt's newlines and quotes included)
    path = tmp_path / "run.toml"
    path.write_text(compare.toml_text(dataclasses.asdict(run.cfg)))
    assert compare.load_config(path) == run.cfg


def test_the_code_key_follows_the_training_code_and_not_documents_tests_or_benchmarks(tmp_path, monkeypatch):
    def git(*args: str) -> None:
        subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", *args], cwd=tmp_path, check=True,
                       capture_output=True)

    for name, text in {"rewards.py": "A = 1\n", "requirements.txt": "torch==1\n", "README.md": "r\n",
                       "tests/test_a.py": "t\n", "bench/b.py": "b\n", ".gitignore": "runs/\n"}.items():
        (tmp_path / name).parent.mkdir(exist_ok=True)
        (tmp_path / name).write_text(text)
    git("init", "-q")
    git("add", "-A")
    git("commit", "-qm", "one")
    monkeypatch.setattr(compare, "ROOT", tmp_path)
    first = compare.code_digest()
    for name in ("README.md", "tests/test_a.py", "bench/b.py"):  # edited and committed: the same code
        (tmp_path / name).write_text("changed\n")
    (tmp_path / "runs").mkdir()
    (tmp_path / "runs" / "x.py").write_text("ignored\n")
    git("commit", "-qam", "two")
    assert compare.code_digest() == first
    keys = set()
    for name, text in (("rewards.py", "A = 2\n"), ("requirements.txt", "torch==2\n"), ("new.py", "B = 1\n")):
        (tmp_path / name).write_text(text)  # uncommitted, and a file git does not know yet, count too
        keys.add(compare.code_digest())
    assert first not in keys and len(keys) == 3


def test_the_code_key_ignores_comments_and_docstrings_but_not_code(tmp_path, monkeypatch):
    monkeypatch.setattr(compare, "ROOT", tmp_path)  # no git checkout: every .py file outside tests/ and bench/
    reward = tmp_path / "rewards.py"
    reward.write_text('"""Rewards."""\n\n\ndef brevity(text):\n    """Short pays."""\n    return len(text) < 9\n')
    first = compare.code_digest()
    reward.write_text('"""Rewards, reworded."""\n\n\ndef brevity(text):\n    # the rule, and why\n'
                      '    """Short pays: a reader skims."""\n\n    return len(text) < 9  # nine\n')
    assert compare.code_digest() == first
    reward.write_text('"""Rewards."""\n\n\ndef brevity(text):\n    """Short pays."""\n    return len(text) < 8\n')
    assert compare.code_digest() != first
    reward.write_text('"""Rewards."""\n\n\ndef brevity(text):\n    """Short pays."""\n    return "not python" <\n')
    assert compare.code_digest() != first  # read as its bytes


def test_a_config_compared_with_itself_trains_and_scores_each_seed_once(tmp_path, capsys):
    cfg = compare.load_config(ROOT / "config.toml")
    runs = [compare.plan_run(side, cfg, seed, "code", "bfloat16", tmp_path)
            for seed in (42, 7) for side in ("default", "candidate")]
    assert runs[0].folder == runs[1].folder  # the same resolved config, seed, code and dtype: one folder
    runs[0].folder.mkdir(parents=True)
    (runs[0].folder / "metrics.jsonl").write_text("".join(json.dumps({"time/step": 10.0}) + "\n" for _ in range(24)))
    (runs[0].folder / compare.TRAINED).write_text(json.dumps({"checkpoint": "step-000024", "seconds": 300.0}))
    compare.run_tasks(runs, {}, argparse.Namespace(dry_run=True))
    lines = capsys.readouterr().out.splitlines()
    assert [line.split(":")[0] for line in lines] == [
        "[1/4] training default seed 42", "[2/4] training default seed 7", "[3/4] scoring default seed 42",
        "[4/4] scoring default seed 7", "dry run"]
    # two trainings of 24 steps of 10 s and 60 s of start-up (each side counted: 20 min); no scoreboard timed yet
    assert lines[-1] == "dry run: about 10 min of training left, then 2 scoreboards not timed yet"


def test_a_run_is_done_only_once_its_marker_names_its_last_checkpoint(tmp_path):
    run = compare.plan_run("default", compare.load_config(ROOT / "config.toml"), 7, "abc", "float32", tmp_path)
    assert compare.state(run) == "start"
    for step in (1, 2):
        (run.folder / "checkpoints" / f"step-00000{step}").mkdir(parents=True)
        (run.folder / "checkpoints" / f"step-00000{step}" / "trainer_state.json").write_text("{}")
    (run.folder / "checkpoints" / "latest").write_text("step-000001")
    (run.folder / "metrics.jsonl").write_text("")
    assert compare.state(run) == "resume"  # canoe.py never ended well here
    (run.folder / compare.TRAINED).write_text(json.dumps({"checkpoint": "step-000001", "seconds": 1.0}))
    assert compare.state(run) == "done"
    (run.folder / "checkpoints" / "latest").write_text("step-000002")  # a later run went on in this folder
    assert compare.state(run) == "resume"


def docs_blocks(kind: str) -> list[str]:
    """The `kind` code blocks of docs/reward-ideas.md's "Adding a reward", in order, as a user copies them."""
    section = (ROOT / "docs" / "reward-ideas.md").read_text().split("## Adding a reward", 1)[1].split("\n## ", 1)[0]
    return [block.split("```", 1)[0] for block in section.split(f"```{kind}\n")[1:]]


def test_the_docs_compare_config_is_the_default_with_brevity_added(isolated_registry):
    """docs/reward-ideas.md: its recipes/brevity.toml is the one shipped, and it loads as config.toml with the five
    rewards and the idea's file; its "Testing a reward idea" runs the compare on it."""
    (block,) = docs_blocks("toml")
    assert block.startswith("# recipes/brevity.toml\n")
    shipped = (ROOT / "recipes" / "brevity.toml").read_text()
    assert tomllib.loads(block) == tomllib.loads(shipped)
    cfg = compare.load_config(ROOT / "recipes" / "brevity.toml")
    default = compare.load_config(ROOT / "config.toml")
    assert cfg == dataclasses.replace(default, rewards={**default.rewards, "brevity": 0.5},
                                      reward_files=["ideas/brevity.py"])
    testing = (ROOT / "docs" / "reward-ideas.md").read_text().split("## Testing a reward idea", 1)[1]
    assert "make compare CONFIG=recipes/brevity.toml" in testing


def test_an_idea_in_its_own_file_leaves_the_defaults_runs_and_a_change_to_canoes_rewards_does_not(
        tmp_path, monkeypatch, capsys, isolated_registry):
    """In a git repository of the code, the docs' brevity idea added as they say (its file under ideas/, its config)
    leaves the default's run key as it was, so a dry run lists the default's seed as done and only the candidate to
    train; an edit to the idea's file trains the candidate again, never the default; an edit to one of CANOE's
    rewards (code the default runs) gives the default a new key."""
    fork = tmp_path / "fork"
    for name in subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True).stdout.split():
        if (name.endswith(".py") and not name.startswith(("tests/", "ideas/"))) or name in (
                "config.toml", "requirements.txt", ".gitignore"):
            (fork / name).parent.mkdir(parents=True, exist_ok=True)
            (fork / name).write_bytes((ROOT / name).read_bytes())
    (fork / "models" / "Qwen2.5-Coder-0.5B-Instruct").mkdir(parents=True)  # a dry run loads no model
    (fork / "data" / "synth").mkdir(parents=True)
    (fork / "data" / "synth" / "train.jsonl").write_text("")
    subprocess.run(["git", "init", "-q"], cwd=fork, check=True)
    subprocess.run(["git", "add", "-A"], cwd=fork, check=True)
    subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "code"], cwd=fork, check=True)
    monkeypatch.setattr(compare, "ROOT", fork)
    monkeypatch.setattr(compare, "DEFAULT", fork / "config.toml")
    monkeypatch.setattr(config, "REPOSITORY", fork)  # where reward_files are read from: the fork's root
    common = ["--seeds", "42", "--synthetic", str(HELDOUT), "--heldout", str(HELDOUT), "--runs", str(tmp_path / "runs"),
              "--dry-run"]

    def plan(config: str) -> dict[str, str]:
        """The dry run's line per task ("training default seed 42" → "to do, from the start (FOLDER)")."""
        compare.main(["--config", str(fork / config), *common])
        lines = [line for line in capsys.readouterr().out.splitlines() if line.startswith("[")]
        return dict(line.split("] ", 1)[1].split(": ", 1) for line in lines)

    first = plan("config.toml")["training default seed 42"]
    assert first.startswith("to do, from the start (")
    folder = Path(first.split("(", 1)[1].rstrip(")"))  # trained: its checkpoint, metrics and marker
    (folder / "checkpoints" / "step-000024").mkdir(parents=True)
    (folder / "checkpoints" / "step-000024" / "trainer_state.json").write_text("{}")
    (folder / "checkpoints" / "latest").write_text("step-000024")
    (folder / "metrics.jsonl").write_text(json.dumps({"time/step": 40.0}) + "\n")
    (folder / compare.TRAINED).write_text(json.dumps({"checkpoint": "step-000024", "seconds": 60.0}))

    (fork / "ideas").mkdir()
    (fork / "ideas" / "brevity.py").write_text(docs_blocks("python")[0])
    (fork / "recipes").mkdir()
    (fork / "recipes" / "brevity.toml").write_text(docs_blocks("toml")[0])
    tasks = plan("recipes/brevity.toml")
    assert tasks["training default seed 42"] == f"done before, reused ({folder})"
    assert tasks["training candidate seed 42"].startswith("to do, from the start (")
    idea = (fork / "ideas" / "brevity.py").read_text()
    (fork / "ideas" / "brevity.py").write_text(idea.replace("<= 5", "<= 3"))
    edited = plan("recipes/brevity.toml")
    assert edited["training default seed 42"] == f"done before, reused ({folder})"
    assert edited["training candidate seed 42"] not in (tasks["training candidate seed 42"], first)

    canoe_rewards = (fork / "rewards.py").read_text()
    assert canoe_rewards.count("0.2 * len(context)") == 1
    (fork / "rewards.py").write_text(canoe_rewards.replace("0.2 * len(context)", "0.25 * len(context)"))
    changed = plan("recipes/brevity.toml")["training default seed 42"]
    assert changed.startswith("to do, from the start (") and str(folder) not in changed


# ------------------------------------------------------------------------------------------------ end to end


@pytest.fixture(scope="module")
def compared(tmp_path_factory, smoke_data) -> dict:  # noqa: F811
    """The command on the smoke recipe, one step a run, seeds 42 and 7, on 4 synthetic and 4 held-out items,
    run twice; returns the folder, the command and both invocations' results and wall seconds."""
    folder = tmp_path_factory.mktemp("compare")
    configs = {}
    for name, overrides in (("baseline", {}), ("idea", {"rewards": {**compare.load_config(
            ROOT / "recipes" / "smoke.toml").rewards, "length": 0.5}})):
        (folder / name).mkdir()
        written = write_config(folder / name, smoke_data, max_steps=1, **overrides)
        configs[name] = written.rename(folder / f"{name}.toml")
    synthetic = folder / "eval.jsonl"
    synthetic.write_text("".join(smoke_data.read_text().splitlines(keepends=True)[:4]))
    heldout = folder / "heldout.jsonl"
    heldout.write_text("".join((ROOT / "data" / "heldout" / "faithfulness.jsonl").read_text().splitlines(True)[:4]))
    command = [sys.executable, str(ROOT / "bench" / "compare.py"), "--config", str(configs["idea"]), "--baseline",
               str(configs["baseline"]), "--seeds", "42", "7", "--synthetic", str(synthetic), "--heldout",
               str(heldout), "--runs", str(folder / "runs"), "--out", str(folder / "report"), "--cache",
               str(folder / "cache"), "--draws", "500", "--launcher", "python"]
    results = []
    for _ in range(2):
        start = time.perf_counter()
        result = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=1800)
        assert result.returncode == 0, result.stdout[-6000:] + result.stderr[-6000:]
        results.append((result, time.perf_counter() - start))
    return {"folder": folder, "command": command, "results": results}


needs_smoke = pytest.mark.skipif(not SMOKE_MODEL.exists(), reason="run `make setup` first (makes models/smoke-llama)")


@needs_smoke
def test_the_command_trains_scores_and_tabulates_both_configs_over_two_seeds(compared):
    (first, seconds), _ = compared["results"]
    print(f"first compare: {seconds:.0f} s")
    progress = [line for line in first.stdout.splitlines() if re.match(r"\[\d/8\] ", line)]
    assert [line.split(" …")[0] for line in progress] == [
        "[1/8] training baseline seed 42", "[2/8] training candidate seed 42", "[3/8] training baseline seed 7",
        "[4/8] training candidate seed 7", "[5/8] scoring baseline seed 42", "[6/8] scoring candidate seed 42",
        "[7/8] scoring baseline seed 7", "[8/8] scoring candidate seed 7"]
    # the time left: from the steps timed in the first run, then from the first scoreboard too
    assert progress[0].endswith("… the time left is known once a step is timed")
    assert re.search(r"… about \d+ min of training left, then 4 scoreboards not timed yet$", progress[1])
    assert re.search(r"… about \d+ min left$", progress[5])
    report = compared["folder"] / "report"
    markdown = (report / "compare.md").read_text()
    print(markdown)
    rows = [line.split(" | ")[0] for line in markdown.splitlines() if line.startswith("| synthetic")
            or line.startswith("| heldout")]
    assert rows == ["| synthetic (4): em", "| synthetic (4): contains", "| heldout (4): em", "| heldout (4): contains"]
    assert "| candidate | " in markdown and "| baseline | " in markdown  # the example's copies
    assert "commit " in markdown and "float32" in markdown and "bench/compare.py --config" in markdown
    assert markdown.splitlines()[-1].startswith("verdict (candidate − baseline): ")
    assert first.stdout.splitlines()[-1] == markdown.splitlines()[-1]
    assert (report / "rewards.png").stat().st_size > 0
    table = json.loads((report / "compare.json").read_text())["table"]
    for metrics in table.values():
        for r in metrics.values():
            # the columns' estimates agree: candidate − baseline = (candidate − plain) − (baseline − plain)
            for s in range(2):
                assert r["candidate - baseline"]["seeds"][s][0] == pytest.approx(
                    r["candidate - plain"]["seeds"][s][0] - r["baseline - plain"]["seeds"][s][0])
            for column in compare.COLUMNS:
                e, lo, hi = r[column]["pooled"]
                assert lo - 1e-9 <= e <= hi + 1e-9
                assert e == pytest.approx(np.mean([d[0] for d in r[column]["seeds"]]))
    runs = sorted(p.name for p in (compared["folder"] / "runs").iterdir())
    assert len(runs) == 4 and sum(name.startswith("s42-") for name in runs) == 2


@needs_smoke
def test_a_second_invocation_trains_and_scores_nothing(compared):
    (first, _), (again, seconds) = compared["results"]
    print(f"second compare: {seconds:.0f} s")
    lines = again.stdout.splitlines()
    assert sum(": done before, reused (" in line for line in lines) == 8
    assert not any(" … " in line for line in lines) and "training models/" not in again.stdout
    assert json.loads((compared["folder"] / "report" / "compare.json").read_text())["verdict"] == lines[-1]
    assert lines[-1] == first.stdout.splitlines()[-1]


@needs_smoke
def test_a_screen_of_the_same_configs_reuses_seed_42_and_says_it_is_a_screen(compared):
    folder, command = compared["folder"], compared["command"]
    seeds = command.index("--seeds")
    screen = [*command[:seeds], "--seeds", "42", *command[seeds + 3:], "--screen", "--out", str(folder / "screen")]
    result = subprocess.run(screen, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    lines = result.stdout.splitlines()
    assert sum(": done before, reused (" in line for line in lines) == 4  # both configs' seed 42, trained and scored
    markdown = (folder / "screen" / "compare.md").read_text()
    assert markdown.startswith("# A screen: idea.toml (candidate) against baseline.toml (baseline), seeds 42\n")
    assert re.fullmatch(r"screen verdict \(candidate − baseline\): .*\. A screen: seed 42 on synthetic, heldout "
                        r"only; the three-seed compare decides", lines[-1]), lines[-1]
    head = next(line for line in markdown.splitlines() if line.startswith("| file (items)"))
    assert "seed 7" not in head and head.endswith(" | ± of candidate − baseline, pooled |")
    assert json.loads((folder / "screen" / "compare.json").read_text())["screen"] is True


@needs_smoke
def test_a_run_with_another_config_is_not_reused(compared):
    folder = compared["folder"]
    other = folder / "other.toml"
    other.write_text(f'base = "{folder / "idea.toml"}"\nlearning_rate = 5e-4\n')
    command = compared["command"]
    command = [*command[:3], str(other), *command[4:6], "--seeds", "42", *command[9:], "--dry-run"]
    planned = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert planned.returncode == 0, planned.stderr[-3000:]
    lines = [line for line in planned.stdout.splitlines() if re.match(r"\[\d/4\] ", line)]
    assert lines[0].startswith("[1/4] training baseline seed 42: done before, reused (")
    assert lines[1].startswith("[2/4] training candidate seed 42: to do, from the start (")
    assert lines[3].startswith("[4/4] scoring candidate seed 42: to do (")
    assert len(list((folder / "runs").iterdir())) == 4  # planned, nothing made
