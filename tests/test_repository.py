"""The repository as a whole: it stands alone, its top level is the design card, and its parts import each other
from the bottom up, without a cycle."""

from __future__ import annotations

import ast
import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# Pointers to the team's working notes that live outside the repository, written as they were.
OUTSIDE = re.compile(r"\.\./shared|shared/(SPEC|ENVIRONMENT|cases|seeds)|\bseed 0\d\d\b|SPEC section")


def tracked_files() -> list[Path]:
    names = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True).stdout.split()
    return [ROOT / name for name in names if (ROOT / name).is_file()]


def test_nothing_points_outside_the_repository():
    offenders = []
    for path in tracked_files():
        if path.suffix in {".png", ".json"} or path.name == Path(__file__).name:
            continue
        for number, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
            if OUTSIDE.search(line):
                offenders.append(f"{path.relative_to(ROOT)}:{number}: {line.strip()}")
    assert not offenders, "\n".join(offenders)


# The design card's files at the top; everything else in a package named for what it holds.
CARD = {"canoe", "config", "data", "grpo_loss", "rewards", "rollout", "variants"}
PACKAGES = ("grading", "plumbing", "evaluation", "synthetic", "training")
# What each part may import besides itself, from the bottom up: grading and plumbing stand alone, the card's files
# use them, evaluation and the data generator use the card, the driver's helpers use all of that, and the driver
# (canoe) anything.
MAY_IMPORT = {
    "grading": set(),
    "plumbing": set(),
    "card": {"grading", "plumbing"},
    "evaluation": {"card", "grading", "plumbing"},
    "synthetic": {"card", "grading", "plumbing"},
    "training": {"card", "grading", "plumbing", "evaluation"},
    "canoe": {"card", "grading", "plumbing", "evaluation", "synthetic", "training"},
}


def part(module: str) -> str:
    """The part of the layout a module ("plumbing.lora", "rewards") belongs to."""
    head = module.split(".")[0]
    return head if head in PACKAGES or head == "canoe" else "card"


def import_graph() -> dict[str, set[str]]:
    """Every module of the repository's code (card files and packages) → the repository modules it imports."""
    paths = {path.stem: path for path in ROOT.glob("*.py")}
    paths |= {f"{package}.{path.stem}": path for package in PACKAGES for path in (ROOT / package).glob("*.py")
              if path.stem != "__init__"}
    graph = {}
    for name, path in paths.items():
        imported = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                imported |= {alias.name for alias in node.names}
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                imported |= {node.module} | {f"{node.module}.{alias.name}" for alias in node.names}
        graph[name] = {module for module in imported if module in paths and module != name}
    return graph


def test_the_top_level_is_the_design_card():
    assert {path.stem for path in ROOT.glob("*.py")} == CARD
    for package in PACKAGES:
        assert (ROOT / package / "__init__.py").is_file(), package


def test_each_part_imports_only_what_lies_below_it():
    offenders = [f"{name} imports {module}" for name, imported in import_graph().items() for module in imported
                 if part(module) != part(name) and part(module) not in MAY_IMPORT[part(name)]]
    assert not offenders, "\n".join(offenders)


def test_no_import_cycle():
    graph = import_graph()

    def cycle_from(start: str, path: list[str]) -> list[str] | None:
        for nxt in sorted(graph[start]):
            if nxt in path:
                return path[path.index(nxt):] + [nxt]
            found = cycle_from(nxt, path + [nxt])
            if found:
                return found
        return None

    for name in graph:
        cycle = cycle_from(name, [name])
        assert cycle is None, " -> ".join(cycle)


# The line budget (raw lines, as `wc -l` counts them), as tinygrad keeps its own: the references a reader holds this
# code against do GRPO with vLLM and DeepSpeed in under 2,000 lines. A ratchet: lowered as code leaves, raised only
# on purpose. The goal outside tests/ and bench/ is 6,000 (docs/DESIGN.md, "Size").
BUDGET = {"Python outside tests/ and bench/": 6546, "the card's five files": 1800, "canoe.py": 450}
CARD_FILES = ("canoe.py", "rollout.py", "rewards.py", "grpo_loss.py", "data.py")
MAX_FUNCTION_LINES = 60
MAX_STEP_LINES = 45


def product_files() -> list[Path]:
    return [path for path in tracked_files() if path.suffix == ".py"
            and path.relative_to(ROOT).parts[0] not in {"tests", "bench"}]


def lines(path: Path) -> int:
    return len(path.read_text().splitlines())


def test_the_line_budget_holds():
    counted = {"Python outside tests/ and bench/": sum(map(lines, product_files())),
               "the card's five files": sum(lines(ROOT / name) for name in CARD_FILES),
               "canoe.py": lines(ROOT / "canoe.py")}
    over = {name: f"{counted[name]} lines > {limit}" for name, limit in BUDGET.items() if counted[name] > limit}
    assert not over, over


def test_no_function_outside_tests_and_bench_is_over_60_lines():
    long = [f"{path.relative_to(ROOT)}:{node.lineno} {node.name}: {node.end_lineno - node.lineno + 1} lines"
            for path in product_files() for node in ast.walk(ast.parse(path.read_text()))
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
            and node.end_lineno - node.lineno + 1 > MAX_FUNCTION_LINES]
    assert not long, "\n".join(long)


def test_the_training_step_reads_on_one_screen():
    """`train_step` is CANOE's six steps, each a call or two (the README's reading order follows them)."""
    source = (ROOT / "canoe.py").read_text()
    (step,) = [node for node in ast.parse(source).body if isinstance(node, ast.FunctionDef) and node.name == "train_step"]
    assert step.end_lineno - step.lineno + 1 <= MAX_STEP_LINES


# Imported but installed elsewhere: vLLM by the Makefile (its CPU or CUDA build), TRL in bench's own .venv-trl, and
# wandb only when a run asks for it.
NOT_PINNED = {"vllm", "trl", "wandb"}


def test_requirements_pin_every_package_the_code_imports():
    import importlib.metadata
    import sys

    local = {path.stem for path in ROOT.rglob("*.py")} | set(PACKAGES) | {"tests", "bench", "scripts"}
    imported = set()
    for path in tracked_files():
        if path.suffix == ".py":
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.Import):
                    imported |= {alias.name.split(".")[0] for alias in node.names}
                elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                    imported.add(node.module.split(".")[0])
    third_party = imported - set(sys.stdlib_module_names) - local - NOT_PINNED
    pinned = {re.split(r"[=\[]", line)[0].strip().lower().replace("_", "-")
              for line in (ROOT / "requirements.txt").read_text().splitlines()
              if "==" in line and not line.startswith("#")}
    distributions = importlib.metadata.packages_distributions()
    missing = {module: distributions.get(module) for module in third_party
               if not {d.lower().replace("_", "-") for d in distributions.get(module, [module])} & pinned}
    assert not missing, f"imported but not pinned in requirements.txt: {missing}"
