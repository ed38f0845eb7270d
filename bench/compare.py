"""Test a reward idea: a candidate config against the default (or any baseline) on several seeds, every run scored
on the scoreboard's decision set, with paired differences, their 95 % intervals and a verdict.

    make compare CONFIG=recipes/my-idea.toml [SEEDS="42 7 1234"] [BASELINE=config.toml] [BENCHMARKS=DIR]
    make screen CONFIG=recipes/my-idea.toml [BENCHMARKS=DIR]      # one seed, cnq250 alone: the cheap look first
    .venv/bin/python bench/compare.py --config recipes/my-idea.toml --seeds 42 7 1234 [--benchmarks DIR] [--dry-run]

For each seed both configs are trained (canoe.py in a subprocess, as `make train` runs it) and each run's final
policy is scored against the base model prompted plainly (bench/scoreboard.py in a subprocess). Then, for each
file and metric of the scoreboard's table: candidate − plain, baseline − plain and candidate − baseline, each per
seed (paired over items) and pooled over the seeds (bench/pool_seeds.py: seeds and items resampled together).
Written to runs/compare/NAME/ and printed: compare.md (the table, the example's copies, the machine, dtype, commit,
the command, the verdict), compare.json and rewards.png (both configs' per-step rewards).

Nothing is done twice. A run's folder, under runs/compare/runs/, is named by a hash of its resolved config (its seed
in, its output folder out), of the code training runs (the .py files outside tests/, bench/ and ideas/ and
requirements.txt, as they stand, committed or not, and the config's own `reward_files`) and of the dtype it resolves
to here. A reward idea kept in a file of its own under ideas/ is in its candidate's key only, so the default's key
stays as it was. A finished run (its marker, final checkpoint and metrics.jsonl) serves every compare that needs it,
so the default's seeds are trained once; an interrupted one
resumes from its last checkpoint (canoe.py --resume), or starts again when it saved none; a run already scored on
the same files is not scored again, and the scoreboard's cache holds the plain base's outputs. Before any training
both configs are loaded as the trainer loads them (a config error, a reward not in REWARD_FUNCS: the trainer's
message) and the training data and the decision set's files must exist, each benchmark file with its recorded
sha256 (the scoreboard's check; --unchecked-benchmarks passes files of your own to it).

The verdict (`Rules`), read on the pooled candidate − baseline column: by default the candidate is adopted when the
primary metric's interval lies above 0 (cnq500 em with --benchmarks, else synthetic contains) and no row's interval
lies wholly on the worse side of 0 (below it; above it for mr and org, which count memory winning). --primary,
--margin, --each-seed and --allow-losses change the rules. The table's last column is the pooled candidate − baseline
interval's half-width: what the run can detect.

A screen (--screen) is one seed (42 unless --seeds names another), the candidate against the baseline's run of that
seed (cached, as every run), scored on cnq250 alone with --benchmarks (cnq500's first 250 items, its verdict read on
cnq250 em; else the 340 synthetic and held-out items); its report goes to runs/compare/NAME-screen/ and its verdict
line says it is a screen. The three-seed compare decides.
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import hashlib
import importlib.util
import json
import os
import shlex
import shutil
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

_spec = importlib.util.spec_from_file_location("pool_seeds", ROOT / "bench" / "pool_seeds.py")
pool_seeds = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(pool_seeds)
scoreboard = pool_seeds.scoreboard  # loaded once by pool_seeds; it sets the thread count before torch loads

from config import Config, ConfigError, load_config  # noqa: E402
from plumbing import checkpoint, runtime  # noqa: E402
from training.plot import read_metrics  # noqa: E402

RUNS = ROOT / "runs" / "compare"  # the runs under RUNS/runs, each compare's report under RUNS/NAME
DEFAULT = ROOT / "config.toml"
SEEDS = (42, 7, 1234)
# No code that every run trains with; ideas/ holds reward files, which only the configs naming them load.
SKIPPED = {"tests", "bench", "ideas", ".venv", ".git", "runs", "models", "data"}
TRAINED = "compare-trained.json"  # in a run's folder once canoe.py ended well: its final checkpoint, its seconds
SCORED = "compare-scored.json"  # beside scoreboard.predictions.jsonl: the files' digests, the seconds
LOWER_IS_BETTER = {"mr", "org"}  # ConFiQA's memorisation ratio and cnq500's original answer count memory winning
COLUMNS = ("candidate - plain", "baseline - plain", "candidate - baseline")
SCREEN = [scoreboard.SCREEN]  # a screen's decision set with --benchmarks: 250 of the compare's 1,215 items


# ------------------------------------------------------------------------------------------------ the verdict


@dataclass(frozen=True)
class Rules:
    """When the candidate is adopted, read on the pooled candidate − baseline differences."""

    primary: tuple[str, str]  # (row, metric) of scoreboard.ROWS
    margin: float = 0.0  # the primary's interval must lie above this (in the metric's unit)
    each_seed: bool = False  # and each seed's interval too
    allow_losses: bool = False  # else no row's interval may lie wholly on the worse side of 0


def better(metric: str, triple: list[float]) -> list[float]:
    """[estimate, lo, hi] turned so that above 0 is better: less is better for mr and org."""
    e, lo, hi = triple
    return [-e, -hi, -lo] if metric in LOWER_IS_BETTER else [e, lo, hi]


def verdict(table: dict, rules: Rules, seeds: list[int], names: tuple[str, str]) -> tuple[bool, str]:
    """Whether the candidate is adopted under `rules`, and the line that says why."""
    row, metric = rules.primary
    found = table[row][metric]["candidate - baseline"]
    percent = is_percent(row)
    head = f"{row} {metric} {signed(found['pooled'], percent)} pooled over {len(seeds)} seed{'s' * (len(seeds) > 1)}"
    failures = []
    if not better(metric, found["pooled"])[1] > rules.margin:
        failures.append(f"{head}: not better than {rules.margin:g} beyond its interval")
    if rules.each_seed:
        short = [f"seed {s} {signed(d, percent)}" for s, d in zip(seeds, found["seeds"])
                 if not better(metric, d)[1] > rules.margin]
        if short:
            failures.append(f"{row} {metric} not better than {rules.margin:g} beyond its interval on "
                            + ", ".join(short))
    if not rules.allow_losses:
        lost = [f"{r} {m} {signed(c['candidate - baseline']['pooled'], is_percent(r))}" for r, metrics in table.items()
                for m, c in metrics.items() if better(m, c["candidate - baseline"]["pooled"])[2] < 0]
        if lost:
            failures.append("worse beyond their intervals: " + ", ".join(lost))
    against = f"{names[0]} − {names[1]}"
    if failures:
        return False, f"verdict ({against}): not adopted: " + "; ".join(failures)
    rest = "" if rules.allow_losses else "; no row worse beyond its interval"
    return True, f"verdict ({against}): adopted: {head}, better than {rules.margin:g} beyond its interval{rest}"


# -------------------------------------------------------------------------------------------------- the table


def is_percent(row: str) -> bool:
    """The suites' rows are in percent, the synthetic format's (synthetic, heldout) in fractions."""
    return not row.startswith(("synthetic", "heldout"))


def compare_table(candidate: dict[str, list[dict]], baseline: dict[str, list[dict]], draws: int) -> dict:
    """Each row of scoreboard.ROWS that both sides scored, each metric: n, the plain base's value and the three
    paired differences (pool_seeds.differences, per seed and pooled). `candidate` and `baseline` are
    pool_seeds.read_hits of each config's runs, seed by seed in the same order; each difference against the plain
    base takes its own config's (the same outputs unless the config changes the base model or the token limit)."""
    table = {}
    for row, files, metrics in scoreboard.ROWS:
        if not all(f in candidate and f in baseline for f in files):
            continue
        cand, cand_plain = (pool_seeds.row_hits(candidate, files, side) for side in ("policy", "plain"))
        base, base_plain = (pool_seeds.row_hits(baseline, files, side) for side in ("policy", "plain"))
        table[row] = {}
        for metric in metrics:
            stat = scoreboard.statistic(metric, is_percent(row))
            table[row][metric] = {"n": len(next(iter(cand[0].values()))), "plain": float(stat(base_plain[0])),
                                  "candidate - plain": pool_seeds.differences(cand, cand_plain, stat, draws),
                                  "baseline - plain": pool_seeds.differences(base, base_plain, stat, draws),
                                  "candidate - baseline": pool_seeds.differences(cand, base, stat, draws)}
    return table


def signed(triple: list[float], percent: bool) -> str:
    """"+1.2 [−0.4, 2.8]" (points) or "+0.012 [−0.004, 0.028]" (fractions) as the README writes them: the minus
    sign, and no sign on a zero."""
    digits = 1 if percent else 3
    e, lo, hi = (round(x, digits) or 0.0 for x in triple)  # `or`: −0.0 is written 0.0
    return f"{'+' if e > 0 else ''}{e:.{digits}f} [{lo:.{digits}f}, {hi:.{digits}f}]".replace("-", "−")


def markdown_table(table: dict, seeds: list[int], names: tuple[str, str]) -> list[str]:
    """The table in the README's shape: a row per file and metric, the plain base, then each column of COLUMNS per
    seed and pooled, and the half-width of the pooled candidate − baseline interval."""
    titles = [c.replace("candidate", names[0]).replace("baseline", names[1]).replace(" - ", " − ") for c in COLUMNS]
    head = ["file (items): metric", "plain base"] + [f"{t}, {s}" for t in titles
                                                     for s in [*(f"seed {x}" for x in seeds), "pooled"]] + [
        f"± of {titles[2]}, pooled"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for row, metrics in table.items():
        percent = is_percent(row)
        for metric, r in metrics.items():
            cells = [f"{row} ({r['n']}): {metric}", f"{r['plain']:.{1 if percent else 3}f}"]
            for column in COLUMNS:
                cells += [signed(d, percent) for d in r[column]["seeds"]] + [signed(r[column]["pooled"], percent)]
            _, lo, hi = r["candidate - baseline"]["pooled"]
            cells.append(f"{(hi - lo) / 2:.{1 if percent else 3}f}")
            lines.append("| " + " | ".join(cells) + " |")
    return lines


def copies_table(groups: dict[str, list[dict]], seeds: list[int], files: list[str]) -> list[str]:
    """The policies' answers that copy the prompt's example (scoreboard.copies_example) over the decision set's
    `files`, from each run's scoreboard.json (which may hold more files: a run scored for a compare, reused by a
    screen)."""
    lines = ["| example copied, all files | " + " | ".join(f"seed {s}" for s in seeds) + " | all seeds |",
             "|" + "---|" * (len(seeds) + 2)]
    for name, reports in groups.items():
        counts = [(sum(r["example_copied"][f] for f in files), sum(r["files"][f]["n"] for f in files))
                  for r in reports]
        cells = [f"{c} of {n}" for c, n in counts] + [f"{sum(c for c, _ in counts)} of {sum(n for _, n in counts)}"]
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return lines


def draw_rewards(groups: dict[str, list[Path]], rewards: list[str], path: Path) -> None:
    """One panel per reward of either config and one for the total (each config's own weights): each seed's
    per-step mean as a thin line, the mean over the seeds as a thick one, one colour per config."""
    import matplotlib.pyplot as plt  # training.plot chose the file-only backend

    names = [*rewards, "total"]
    fig, axes = plt.subplots(1, len(names), figsize=(3.2 * len(names), 3.4), squeeze=False)
    for (label, folders), color in zip(groups.items(), ("tab:orange", "tab:blue")):
        runs = [read_metrics(folder) for folder in folders]
        for ax, name in zip(axes[0], names):
            series = [[row[f"reward/{name}"] for row in rows] for rows in runs if f"reward/{name}" in rows[0]]
            if not series:
                continue
            for values in series:
                ax.plot(range(1, len(values) + 1), values, color=color, alpha=0.3, linewidth=0.8)
            steps = min(map(len, series))
            ax.plot(range(1, steps + 1), np.mean([v[:steps] for v in series], axis=0), color=color, linewidth=2,
                    marker="o", markersize=3, label=label)  # a marker: a run of one step is a point, not a line
            ax.set_title(name, fontsize=9)
            ax.xaxis.get_major_locator().set_params(integer=True)
            ax.grid(alpha=0.3)
    axes[0][0].legend(fontsize=8)
    fig.supxlabel("step (thin: each seed; thick: their mean)", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


# ------------------------------------------------------------------------------------------------------ the runs


@dataclass(frozen=True)
class Run:
    """One training run of a compare: whose (the candidate or the baseline's name), its seed, its resolved config
    (that seed, output_dir its folder)."""

    side: str
    seed: int
    cfg: Config

    @property
    def folder(self) -> Path:
        return Path(self.cfg.output_dir)


def code_version() -> str:
    """The commit, with a digest of the uncommitted changes to the .py files that training runs (tests/ and bench/
    left out), so that an edited reward is not taken for the committed one; "unknown" outside a git checkout."""
    def git(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True)

    head = git("rev-parse", "HEAD")
    if head.returncode:
        return "unknown"
    diff = git("diff", "HEAD", "--", "*.py", ":!tests", ":!bench").stdout
    commit = head.stdout.strip()[:12]
    return f"{commit}+{hashlib.sha256(diff.encode()).hexdigest()[:8]}" if diff else commit


def code_digest() -> str:
    """A digest of the code that every training run runs as it stands in the working tree: every .py file git knows
    or would add, tests/, bench/ and ideas/ left out, as `code_text` reads it, and requirements.txt. A commit that
    touches only documents, tests, benchmarks, reward ideas, comments or docstrings keeps it, so the default's seeds
    are not trained again (a run's own reward files are in its key: `plan_run`)."""
    listed = subprocess.run(["git", "ls-files", "-co", "--exclude-standard", "--", "*.py", ":!tests", ":!bench",
                             ":!ideas"], cwd=ROOT, capture_output=True, text=True)
    paths = sorted(listed.stdout.split()) if not listed.returncode else sorted(
        str(p.relative_to(ROOT)) for p in ROOT.rglob("*.py") if p.relative_to(ROOT).parts[0] not in SKIPPED)
    digest = hashlib.sha256()
    for path in [*paths, "requirements.txt"]:
        if (ROOT / path).is_file():
            digest.update(path.encode() + b"\0" + code_text(ROOT / path) + b"\0")
    return digest.hexdigest()[:16]


def code_text(path: Path) -> bytes:
    """A .py file's syntax tree without its docstrings (comments are not in it), so that wording never moves the
    key; another file, or one that does not parse, as its bytes."""
    source = path.read_bytes()
    try:
        tree = ast.parse(source) if path.suffix == ".py" else None
    except SyntaxError:
        tree = None
    if tree is None:
        return source
    for node in ast.walk(tree):
        if (isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
                and ast.get_docstring(node, clean=False) is not None):
            node.body = node.body[1:] or [ast.Pass()]
    return ast.dump(tree).encode()


def resolved_dtypes(names: list[str]) -> list[str]:
    """What each `dtype` setting resolves to here (runtime.resolve_dtype). On a GPU a child process asks: the
    question initialises CUDA, and this process stays clear of the device while the runs train on it."""
    import torch

    if not torch.cuda.is_available():
        return [str(runtime.resolve_dtype(name)).removeprefix("torch.") for name in names]
    code = "import sys; from plumbing.runtime import resolve_dtype; print(*(resolve_dtype(n) for n in sys.argv[1:]))"
    asked = subprocess.run([sys.executable, "-c", code, *names], cwd=ROOT, capture_output=True, text=True, check=True)
    return [name.removeprefix("torch.") for name in asked.stdout.split()]


def plan_run(side: str, cfg: Config, seed: int, code: str, dtype: str, runs: Path) -> Run:
    """The run of `cfg` with `seed`, in the folder its hash names: the same config, code (`code_digest` and the
    config's reward files, each as `code_text` reads it) and dtype, the same run."""
    settings = dataclasses.asdict(dataclasses.replace(cfg, seed=seed, output_dir=""))
    own = [hashlib.sha256(code_text(ROOT / name)).hexdigest()[:16] for name in cfg.reward_files]
    key = json.dumps({"config": settings, "code": code, **({"reward_files": own} if own else {}), "dtype": dtype},
                     sort_keys=True)
    folder = runs / f"s{seed}-{hashlib.sha256(key.encode()).hexdigest()[:12]}"
    return Run(side, seed, dataclasses.replace(cfg, seed=seed, output_dir=str(folder)))


def state(run: Run) -> str:
    """"done" (canoe.py ended well: the marker, the checkpoint it names and metrics.jsonl are there), "resume" (a
    complete checkpoint to continue from) or "start"."""
    latest = checkpoint.latest_checkpoint(run.folder)
    marker = run.folder / TRAINED
    if (latest is not None and marker.exists() and (run.folder / "metrics.jsonl").exists()
            and json.loads(marker.read_text())["checkpoint"] == latest.name):
        return "done"
    return "resume" if latest is not None else "start"


def toml_text(settings: dict) -> str:
    """`settings` as TOML: every value is a str, number, bool, list or (last) a table; JSON writes each of them as
    TOML reads it back."""
    plain = [f"{key} = {json.dumps(value, ensure_ascii=False)}" for key, value in settings.items()
             if not isinstance(value, dict)]
    tables = [f"\n[{key}]\n" + "".join(f"{json.dumps(k)} = {json.dumps(v)}\n" for k, v in value.items())
              for key, value in settings.items() if isinstance(value, dict)]
    return "\n".join(plain) + "\n" + "".join(tables)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def train(run: Run, launcher: str) -> None:
    """canoe.py on the run's config (written as run.toml in its folder), resumed where a checkpoint allows; a run
    stopped before its first checkpoint starts again in an emptied folder (its logs would be appended to)."""
    resume = state(run) == "resume"
    if not resume and run.folder.exists():
        shutil.rmtree(run.folder)
    run.folder.mkdir(parents=True, exist_ok=True)
    config = run.folder / "run.toml"
    config.write_text(toml_text(dataclasses.asdict(run.cfg)))
    if load_config(config) != run.cfg:
        raise SystemExit(f"error: {config} does not read back as the config it was written from")
    port = free_port()
    launch = ([str(Path(sys.executable).parent / "deepspeed"), "--master_port", str(port)] if launcher == "deepspeed"
              else [sys.executable])
    start = time.perf_counter()
    done = subprocess.run([*launch, "canoe.py", "--config", str(config), *(["--resume"] if resume else [])],
                          cwd=ROOT, env={**os.environ, "MASTER_PORT": str(port)})
    if done.returncode:
        raise SystemExit(f"error: training {run.side} seed {run.seed} stopped (exit {done.returncode}); "
                         f"{run.folder} is kept and the next compare resumes it")
    marker = {"checkpoint": checkpoint.latest_checkpoint(run.folder).name, "seconds": time.perf_counter() - start}
    (run.folder / TRAINED).write_text(json.dumps(marker))


def policy(run: Run) -> Path:
    return checkpoint.latest_checkpoint(run.folder) / "policy"


def scored(run: Run, digests: dict[str, str]) -> bool:
    """The run's policy was scored on these very files (by name and digest), and perhaps on more."""
    marker = policy(run).parent / SCORED
    return marker.exists() and digests.items() <= json.loads(marker.read_text())["files"].items()


def score(run: Run, digests: dict[str, str], args: argparse.Namespace) -> None:
    """bench/scoreboard.py on the run's final policy, with the run's config; its outputs go beside the checkpoint."""
    start = time.perf_counter()
    command = [sys.executable, str(ROOT / "bench" / "scoreboard.py"), "--model", str(policy(run)),
               "--config", str(run.folder / "run.toml"), "--synthetic", str(args.synthetic),
               "--heldout", str(args.heldout), "--cache", str(args.cache), "--draws", str(args.draws), "--only", *digests,
               *(["--benchmarks", str(args.benchmarks)] if args.benchmarks else []),
               *(["--unchecked-benchmarks"] if args.unchecked_benchmarks else [])]
    if subprocess.run(command, cwd=ROOT).returncode:
        raise SystemExit(f"error: the scoreboard of {run.side} seed {run.seed} failed; the next compare retries it")
    marker = {"files": digests, "seconds": time.perf_counter() - start}
    (policy(run).parent / SCORED).write_text(json.dumps(marker))


def time_left(pending: list[tuple[str, Run]], runs: list[Run]) -> str:
    """The time the pending tasks should take, from what these runs already timed: their steps left at the mean
    seconds per step of the metrics.jsonl files, each training's start-up (a finished run's seconds beyond its
    steps' own) and their scoreboards at the mean of the scoreboards timed."""
    logs = {run.folder: run.folder / "metrics.jsonl" for run in runs}
    timed = {folder: [json.loads(line)["time/step"] for line in log.read_text().splitlines()]
             for folder, log in logs.items() if log.exists()}
    if not any(timed.values()):
        return "the time left is known once a step is timed"
    step_s = np.mean([t for times in timed.values() for t in times])
    start_s = np.mean([max(json.loads((folder / TRAINED).read_text())["seconds"] - sum(times), 0.0)
                       for folder, times in timed.items() if (folder / TRAINED).exists()] or [0.0])
    score_s = [json.loads(path.read_text())["seconds"] for run in runs
               for path in run.folder.glob(f"checkpoints/*/{SCORED}")]
    training = 0.0
    for kind, run in pending:
        if kind == "train":
            latest = checkpoint.latest_checkpoint(run.folder)
            training += start_s + step_s * max(run.cfg.max_steps - (int(latest.name[5:]) if latest else 0), 0)
    scores = sum(kind == "score" for kind, _ in pending)
    if scores and not score_s:
        return f"about {training / 60:.0f} min of training left, then {scores} scoreboards not timed yet"
    return f"about {(training + scores * np.mean(score_s or [0.0])) / 60:.0f} min left"


# ---------------------------------------------------------------------------------------------------- the steps


def parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", type=Path, required=True, help="the candidate config")
    parser.add_argument("--baseline", type=Path, default=DEFAULT, help="what it is held against (config.toml)")
    parser.add_argument("--seeds", type=int, nargs="+", help="default 42 7 1234; a screen's: 42")
    parser.add_argument("--benchmarks", type=Path, help="the scoreboard's benchmark folder (its --benchmarks)")
    parser.add_argument("--unchecked-benchmarks", action="store_true", help="score --benchmarks files whose sha256 "
                        "is not the recorded one (your own files; by default such a file stops it before training)")
    parser.add_argument("--synthetic", type=Path, default=scoreboard.SYNTHETIC, help="the synthetic eval file")
    parser.add_argument("--heldout", type=Path, default=scoreboard.HELDOUT, help="the hand-written held-out file")
    parser.add_argument("--primary", help="ROW:METRIC of the verdict (default cnq500:em with --benchmarks, a "
                        "screen's cnq250:em, else synthetic:contains)")
    parser.add_argument("--margin", type=float, default=0.0, help="the primary's interval must lie above this")
    parser.add_argument("--each-seed", action="store_true", help="the primary must also win on each seed")
    parser.add_argument("--allow-losses", action="store_true", help="rows worse beyond their intervals do not count")
    parser.add_argument("--screen", action="store_true", help="one seed, scored on cnq250 alone with --benchmarks "
                        "(else the synthetic and held-out items): a verdict labelled a screen")
    parser.add_argument("--dry-run", action="store_true", help="say what would be trained and scored, then stop")
    parser.add_argument("--launcher", choices=("deepspeed", "python"), default="deepspeed",
                        help="how canoe.py is started: the deepspeed launcher (make train's) or python (one rank)")
    parser.add_argument("--runs", type=Path, default=RUNS / "runs", help="where the runs live")
    parser.add_argument("--out", type=Path, help="where the report goes (default runs/compare/NAME)")
    parser.add_argument("--cache", type=Path, default=scoreboard.CACHE, help="the scoreboard's output cache")
    parser.add_argument("--draws", type=int, default=scoreboard.DRAWS)
    args = parser.parse_args(argv)
    args.seeds = args.seeds or ([SEEDS[0]] if args.screen else list(SEEDS))
    for key in ("synthetic", "heldout", "benchmarks", "runs", "cache"):  # the subprocesses run in the repository
        setattr(args, key, getattr(args, key) and getattr(args, key).resolve())
    return args


def load(path: Path) -> Config:
    """The config as the trainer loads it (a mistake stops it with the trainer's message), its data and model
    present."""
    try:
        cfg = load_config(path)
    except ConfigError as error:
        raise SystemExit(f"error: {error}") from None
    if not (ROOT / cfg.train_file).exists():
        raise SystemExit(f"error: {cfg.train_file}: data file not found")
    if not (ROOT / cfg.model).is_dir():
        raise SystemExit(f"error: {path}: model = {cfg.model!r}: no such model folder")
    return cfg


def checked(args: argparse.Namespace) -> tuple[Config, Config, list, Rules]:
    """Everything that can be wrong before training: both configs, the decision set's files, the verdict's metric."""
    candidate, baseline = load(args.config), load(args.baseline)
    screen = SCREEN if args.screen and args.benchmarks else None
    targets = scoreboard.decision_set(args.benchmarks, args.synthetic, args.heldout, screen,
                                      not args.unchecked_benchmarks)
    if len(set(args.seeds)) != len(args.seeds):
        raise SystemExit(f"error: --seeds {args.seeds}: each seed once")
    if args.screen and len(args.seeds) != 1:
        raise SystemExit(f"error: --screen --seeds {args.seeds}: a screen is one seed")
    cnq = scoreboard.SCREEN if args.screen else "cnq500"
    primary = args.primary or (f"{cnq}:em" if args.benchmarks else "synthetic:contains")
    rows = {row: metrics for row, files, metrics in scoreboard.ROWS if all(f in {t.name for t in targets}
                                                                           for f in files)}
    row, _, metric = primary.partition(":")
    if metric not in rows.get(row, ()):
        raise SystemExit(f"error: --primary {primary}: not a row and metric of this decision set "
                         f"({', '.join(f'{r}:{m}' for r, ms in rows.items() for m in ms)})")
    return candidate, baseline, targets, Rules((row, metric), args.margin, args.each_seed, args.allow_losses)


def machine_kind() -> str:
    """The GPU's name, or the CPU kind that decides speed and dtype here (bench/RESULTS.md's machine kinds)."""
    import torch

    if torch.cuda.is_available():
        return torch.cuda.get_device_name()
    flags = runtime.cpu_flags()
    kinds = (("amx_bf16", "AMX"), ("avx512_bf16", "AVX-512 BF16"), ("avx512f", "AVX-512"), ("avx2", "AVX2 only"))
    return next((kind for flag, kind in kinds if flag in flags), "a CPU without AVX2")


def run_tasks(runs: list[Run], digests: dict[str, str], args: argparse.Namespace) -> None:
    """Train every run, then score every run, each unless done before, with a progress line per task; with
    --dry-run, only say which. A run both sides share (a config compared with itself) is one task of each kind."""
    runs = [run for k, run in enumerate(runs) if run.folder not in {r.folder for r in runs[:k]}]
    tasks = [("train", run) for run in runs] + [("score", run) for run in runs]

    def done(kind: str, run: Run) -> bool:
        return state(run) == "done" and (kind == "train" or scored(run, digests))

    for k, (kind, run) in enumerate(tasks, 1):
        what = f"[{k}/{len(tasks)}] {'training' if kind == 'train' else 'scoring'} {run.side} seed {run.seed}"
        if done(kind, run):
            print(f"{what}: done before, reused ({run.folder})", flush=True)
        elif args.dry_run:
            how = {"start": ", from the start", "resume": ", resumed from its last checkpoint"}.get(state(run), "")
            print(f"{what}: to do{how if kind == 'train' else ''} ({run.folder})", flush=True)
        else:
            print(f"{what} … {time_left([t for t in tasks[k - 1:] if not done(*t)], runs)}", flush=True)
            if kind == "train":
                train(run, args.launcher)
            else:
                score(run, digests, args)
    if args.dry_run:
        print(f"dry run: {time_left([t for t in tasks if not done(*t)], runs)}")


def report(args: argparse.Namespace, argv: list[str], runs: dict[str, list[Run]], targets: list, rules: Rules,
           seeds: list[int], code: str) -> str:
    """compare.md, compare.json and rewards.png in the report folder; returns the Markdown (its last line the
    verdict)."""
    names = tuple(runs)
    predictions = {name: [pool_seeds.read_predictions(policy(r).parent / "scoreboard.predictions.jsonl")
                          for r in side] for name, side in runs.items()}
    hits = {name: pool_seeds.read_hits(targets, each) for name, each in predictions.items()}
    table = compare_table(hits[names[0]], hits[names[1]], args.draws)
    adopted, line = verdict(table, rules, seeds, names)
    if args.screen:  # not a decision: one seed, a part of the decision set
        line = (f"screen {line}. A screen: seed {seeds[0]} on {', '.join(t.name for t in targets)} only; "
                "the three-seed compare decides")
    boards = {name: [json.loads((policy(r).parent / "scoreboard.json").read_text()) for r in side]
              for name, side in runs.items()}
    out = args.out or RUNS / (args.config.stem + ("" if args.baseline.resolve() == DEFAULT else
                                                  f"-vs-{args.baseline.stem}") + ("-screen" if args.screen else ""))
    out.mkdir(parents=True, exist_ok=True)
    rewards = list(dict.fromkeys(n for side in runs.values() for n in side[0].cfg.rewards))
    draw_rewards({name: [r.folder for r in side] for name, side in runs.items()}, rewards, out / "rewards.png")
    dtypes = " / ".join(dict.fromkeys(json.loads((r.folder / "run_config.json").read_text())["dtype"]
                                      for side in runs.values() for r in side))
    command = shlex.join([".venv/bin/python", "bench/compare.py", *argv])
    lines = [f"# {'A screen: ' if args.screen else ''}{args.config.name} ({names[0]}) against {args.baseline.name} "
             f"({names[1]}), seeds {', '.join(map(str, seeds))}", "",
             f"{machine_kind()}, {os.cpu_count()} cores; {dtypes}; commit {code}; {time.strftime('%Y-%m-%d')}. "
             f"Reproduce from the repository's root: `{command}`", "",
             "Paired differences with their 95 % bootstrap intervals (per seed: over items; pooled: seeds and items "
             "resampled together). Synthetic and held-out rows in fractions, the benchmarks in percent.", "",
             *markdown_table(table, seeds, names), "", *copies_table(boards, seeds, [t.name for t in targets]), "",
             "![per-step rewards of both configs](rewards.png)", "",
             *(f"- {r.side} seed {r.seed}: `{r.folder}`" for side in runs.values() for r in side), "", line]
    markdown = "\n".join(lines) + "\n"
    (out / "compare.md").write_text(markdown)
    (out / "compare.json").write_text(json.dumps({"candidate": str(args.config), "baseline": str(args.baseline),
                                                  "seeds": seeds, "code": code, "table": table, "adopted": adopted, "screen": args.screen,
                                                  "verdict": line, "runs": {n: [str(r.folder) for r in side]
                                                                            for n, side in runs.items()}}, indent=1))
    return markdown


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    args = parse(argv)
    candidate, baseline, targets, rules = checked(args)
    code = code_version()
    default = args.baseline.resolve() == DEFAULT
    names = ("candidate", "default" if default else args.baseline.stem.replace("candidate", "baseline"))
    dtypes = resolved_dtypes([candidate.dtype, baseline.dtype])
    key = code_digest()
    runs = {name: [plan_run(name, cfg, seed, key, dtype, args.runs) for seed in args.seeds]
            for name, cfg, dtype in zip(names, (candidate, baseline), dtypes)}
    digests = {t.name: scoreboard.digest_files([t.path]) for t in targets}
    in_order = [run for pair in zip(runs[names[1]], runs[names[0]]) for run in pair]  # per seed, the baseline first
    try:
        run_tasks(in_order, digests, args)
    except KeyboardInterrupt:
        raise SystemExit("interrupted: the same command resumes where this one stopped") from None
    if args.dry_run:
        return
    markdown = report(args, argv, runs, targets, rules, args.seeds, code)
    print("\n" + markdown, end="")  # its last line is the verdict


if __name__ == "__main__":
    main()
