"""The repository as a whole: it stands alone, its top level is the design card, and its parts import each other
from the bottom up, without a cycle."""

from __future__ import annotations

import ast
import io
import math
import re
import subprocess
import tokenize
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


# The line budget, as tinygrad keeps its own: the references a reader holds this code against do GRPO with vLLM and
# DeepSpeed in under 2,000 lines. It counts lines of code: a blank line, a comment or a docstring costs nothing, so
# prose is written for its reader, never for the counter. A ratchet: lowered as code leaves, raised only on purpose.
BUDGET = {"Python outside tests/ and bench/": 4764, "the card's five files": 1056, "canoe.py": 302}
CARD_FILES = ("canoe.py", "rollout.py", "rewards.py", "grpo_loss.py", "data.py")
MAX_FUNCTION_LINES = 60
MAX_STEP_LINES = 45
# Tokens that are not code: comments, line ends, indentation and the file's bounds.
NOT_CODE = {tokenize.COMMENT, tokenize.NL, tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT, tokenize.ENCODING,
            tokenize.ENDMARKER}


def product_files() -> list[Path]:
    return [path for path in tracked_files() if path.suffix == ".py"
            and path.relative_to(ROOT).parts[0] not in {"tests", "bench"}]


def docstring_rows(tree: ast.Module) -> list[tuple[int, int]]:
    """The first and last line of every docstring: a string that is the first statement of the module, a class
    or a function."""
    rows = []
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) and isinstance(
                    first.value.value, str):
                rows.append((first.lineno, first.end_lineno))
    return rows


def code_lines(source: str) -> int:
    """The lines that hold a token of code: not blank, not only a comment, not part of a docstring. A string
    that is not a docstring (a message, a template) is code on every line it spans."""
    docstrings = docstring_rows(ast.parse(source))
    rows = set()
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type in NOT_CODE or (token.type == tokenize.STRING and any(
                first <= token.start[0] and token.end[0] <= last for first, last in docstrings)):
            continue
        rows.update(range(token.start[0], token.end[0] + 1))
    return len(rows)


def test_code_lines_leave_out_blanks_comments_and_docstrings():
    source = '''"""A module docstring,
over two lines."""

# a comment
X = """not a docstring,
so code on both of its lines"""  # a comment after code


def f(a,
      b):  # two lines of code
    """A docstring."""
    return a + b


class C:
    """One more,

    over three."""
    y = 1
'''
    # Code: X's two lines, `def f(a,` and `b):`, `return a + b`, `class C:`, `y = 1`.
    assert code_lines(source) == 2 + 2 + 1 + 1 + 1


def test_the_line_budget_holds():
    counted = {"Python outside tests/ and bench/": sum(code_lines(path.read_text()) for path in product_files()),
               "the card's five files": sum(code_lines((ROOT / name).read_text()) for name in CARD_FILES),
               "canoe.py": code_lines((ROOT / "canoe.py").read_text())}
    over = {name: f"{counted[name]} lines of code > {limit}" for name, limit in BUDGET.items()
            if counted[name] > limit}
    assert not over, over


def test_no_function_outside_tests_and_bench_is_over_60_lines():
    long = [f"{path.relative_to(ROOT)}:{node.lineno} {node.name}: {node.end_lineno - node.lineno + 1} lines"
            for path in product_files() for node in ast.walk(ast.parse(path.read_text()))
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
            and node.end_lineno - node.lineno + 1 > MAX_FUNCTION_LINES]
    assert not long, "\n".join(long)


def test_the_training_step_reads_on_one_screen():
    """`train_step` is CANOE's six steps, each a call or two (the reading map follows them: docs/reading-map.md)."""
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


# The reading map (docs/reading-map.md): in its table, each function a reader opens to check the step, as
# `module.function` (methods `module.Class.method`, a package's module `package/module`) with its depth below
# `train_step` in brackets; above it, the counts, which must be the ones computed here from the table.
READING_MAP = ROOT / "docs" / "reading-map.md"
MAP_ENTRY = re.compile(r"`([\w/]+(?:\.\w+)+)` \((\d+)\)")
MAP_COUNTS = re.compile(r"(\d+)\s+functions\s+in\s+(\d+)\s+files,\s+([\d,]+)\s+lines\b.*?"
                        r"at\s+most\s+(\d+)\s+calls\s+below", re.S)
# What a learner must open to check the step: the reading map's table stays within these (functions, lines from
# each `def` to its last line, calls below `train_step`). A ratchet, as the line budget is.
MAP_LIMITS = {"functions": 35, "lines": 450, "depth": 4}
# Calls from the mapped functions that the map leaves out: machinery a reader need not open, each with its contract
# (what it guarantees, which the map's Machinery section states too) and the test that holds it.
MACHINERY = {
    "variants.dynamic_sampling": (
        "DAPO's, off by default: each group whose advantages are all equal is replaced, in order, by a varied group "
        "of newly drawn prompts",
        "tests/test_dynamic_sampling.py::test_flat_groups_are_replaced_in_order_by_varied_groups_of_new_draws"),
    "plumbing/weight_sync.sleep_engine": (
        "vLLM's memory goes to the trainer until the push wakes the engine (CUDA sleep mode only)",
        "tests/test_sleep_order.py::test_the_engine_sleeps_while_the_trainer_trains"),
    "data.render_prompt": (
        "a problem as a prompt of the chat template, with the system prompt and example of stage 1's prompts",
        "tests/test_data.py::test_render_prompt_contains_system_and_user_and_ends_with_generation_prompt"),
    "rollout.request_seed": ("a stable seed from the run seed, stage, step and rank",
                             "tests/test_rollout.py::test_request_seed_is_stable_and_distinct"),
    "rollout.prompt_seed": ("each prompt's seed within a draw, which vLLM's int64 seeds hold",
                            "tests/test_rollout.py::test_prompt_seeds_fit_vllm_and_the_cpu_path_sends_none"),
    "rollout.seeds_per_request": (
        "the seed goes with each request on CUDA and into torch's generator on the CPU",
        "tests/test_rollout.py::test_on_cuda_every_request_carries_its_own_seed_so_ranks_differ_and_a_resume_redraws"),
    "plumbing/weight_sync.request_kwargs": (
        "every request names the LoRA adapter vLLM applies, where it applies one",
        "tests/test_push_check.py::"
        "test_the_adapter_push_lands_under_a_new_id_after_the_weights_wake_and_every_request_names_it"),
    "grading/tags.tag_content": ("the first `<tag>…</tag>` section's content, stripped; None without one",
                                 "tests/test_tags.py::test_tag_content_is_the_regex"),
    "grading/tags.replace_content": ("the text with that content replaced, literally; None without the section",
                                     "tests/test_tags.py::test_replace_content_is_the_regex"),
    "rewards._entries": ("the completions as a list; None, counted, when they are not one",
                         "tests/test_rewards.py::test_malformed_inputs_score_zero_and_are_counted"),
    "rewards._texts": ("each completion's text; None, counted, where it is not a list of chat messages",
                       "tests/test_rewards.py::test_malformed_inputs_score_zero_and_are_counted"),
    "rewards._completion_text": ("a completion's text; None where it is not a list of chat messages",
                                 "tests/test_rewards.py::test_hostile_inputs_give_zero_and_never_raise"),
    "rewards._column": ("a dataset column as one value per completion, padded with None and counted if short",
                        "tests/test_rewards.py::test_malformed_inputs_score_zero_and_are_counted"),
    "rewards._problem_text": ("the prompt's text: the string itself or the chat's user message",
                              "tests/test_rewards.py::test_length_extra"),
    "rewards._note": ("counts a malformed input in REWARD_ISSUES",
                      "tests/test_rewards.py::test_malformed_inputs_score_zero_and_are_counted"),
    "rewards._debug_log": ("DEBUG_MODE's log of each sample; never raises", "tests/test_rewards.py::test_debug_log"),
    "grading/grader.default_grader": ("the grader when none is given (the trainer gives one)",
                                      "tests/test_rewards.py::test_trainer_kwargs_are_accepted"),
    "training/metrics.timing": ("adds the phase's seconds to the step's `time/` metrics",
                                "tests/test_train.py::test_one_rank_zero2"),
    "training/packing.pack_micro_batch": (
        "the micro-batch in one row, each prompt once; `completion_mask` (M, C) is 1 exactly on each completion's "
        "tokens",
        "tests/test_packing.py::test_micro_batch_groups_consecutive_equal_prompts"),
    "plumbing/runtime.all_reduce_values": (
        "the element-wise sum (or the op's reduction) over every rank",
        "tests/test_collectives.py::test_counts_are_summed_and_rates_averaged_over_ranks"),
    "plumbing/lora.adapters_disabled": (
        "under LoRA the policy with its adapters off, π_ref; any other model as it is",
        "tests/test_lora.py::test_the_reference_is_the_base_model_with_the_adapters_disabled"),
    "grpo_loss.completion_logprobs": (
        "on a packed micro-batch, `plain_completion_logprobs` of each sequence alone, in values and gradients",
        "tests/test_plain_logprobs.py::test_the_packed_path_equals_the_plain_one_in_values_and_gradients"),
    "canoe.skip_or_stop_on_bad_step": (
        "counts an update DeepSpeed skipped, and stops the run after `max_bad_steps` in a row",
        "tests/test_nonfinite_skip.py::test_a_nonfinite_step_is_skipped_in_bfloat16_and_max_bad_steps_acts"),
    "grpo_loss._check_inputs": ("an error that names the argument of the wrong shape",
                                "tests/test_grpo_loss.py::test_grpo_loss_errors"),
}
# Machinery reached through what set-up built, which ast cannot resolve: the same contract and test.
MACHINERY_THROUGH_SET_UP = {
    "training/push.WeightPush.__call__": (
        "the trained weights are in vLLM: the probe's log-probabilities match the trainer's, or the run stops",
        "tests/test_sleep_order.py::test_the_step_pushes_only_into_an_awake_engine"),
    "grading/grader.MathGrader.equivalent_batch": (
        "True where the spans are equal strings or CANOE's math_equal proves them equal; False past the deadline",
        "tests/test_grader.py::test_equivalent_batch_table, "
        "tests/test_grader.py::test_timeout_falls_back_to_string_match"),
    "training/optimizer.deepspeed_config": (
        "AdamW with the config's rate, betas and weight decay (ε = 1e-8), gradients clipped at `max_grad_norm`",
        "tests/test_config.py::test_the_optimizer_is_torchs_fused_adamw_on_a_gpu_too"),
}


def reading_map() -> tuple[dict[str, int], str]:
    """The reading map as {function: depth}, and the text of its first section (above "Machinery")."""
    section = READING_MAP.read_text().split("\n## ", 1)[0]
    entries = {}
    for name, depth in MAP_ENTRY.findall("\n".join(line for line in section.splitlines() if line.startswith("|"))):
        assert name not in entries, f"{name} is listed twice"
        entries[name] = int(depth)
    return entries, section


def definitions(module: str) -> dict[str, ast.FunctionDef]:
    """The functions of a repository module ("grading/tags") by name, methods as "Class.method"."""
    body = ast.parse((ROOT / f"{module}.py").read_text()).body
    found = {node.name: node for node in body if isinstance(node, ast.FunctionDef)}
    for cls in (node for node in body if isinstance(node, ast.ClassDef)):
        found |= {f"{cls.name}.{node.name}": node for node in cls.body if isinstance(node, ast.FunctionDef)}
    return found


def mapped_function(name: str) -> ast.FunctionDef:
    module, function = name.split(".", 1)
    assert (ROOT / f"{module}.py").is_file(), f"{name}: there is no {module}.py"
    node = definitions(module).get(function)
    assert node is not None, f"{name}: {module}.py has no function {function}"
    return node


def repository_calls(name: str) -> list[tuple[str, bool]]:
    """The repository functions `name` calls by a name ast can resolve (its module's functions, its class's methods
    through `self`, functions imported from the repository, `module.function`), each with whether the call sits in
    a lambda or nested function, which runs later and from elsewhere."""
    module, function = name.split(".", 1)
    known, imported = definitions(module), {}  # imported: local name -> "package/module" or "module.function"
    for node in ast.walk(ast.parse((ROOT / f"{module}.py").read_text())):
        if isinstance(node, ast.Import):
            imported |= {alias.name: alias.name for alias in node.names if (ROOT / f"{alias.name}.py").is_file()}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            base = node.module.replace(".", "/")
            for alias in node.names:
                is_module = (ROOT / base / f"{alias.name}.py").is_file()
                imported[alias.asname or alias.name] = f"{base}/{alias.name}" if is_module else f"{base}.{alias.name}"

    def calls(node: ast.AST, nested: bool):
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.Call):
                yield child.func, nested
            yield from calls(child, nested or isinstance(child, (ast.Lambda, ast.FunctionDef)))

    found = []
    for called, nested in calls(mapped_function(name), False):
        if isinstance(called, ast.Name):
            target = f"{module}.{called.id}" if called.id in known else imported.get(called.id, "")
        elif isinstance(called, ast.Attribute) and isinstance(called.value, ast.Name):
            owner = function.split(".")[0] if called.value.id == "self" else called.value.id
            local = f"{owner}.{called.attr}" in known
            target = f"{module}.{owner}.{called.attr}" if local else f"{imported.get(owner, '')}.{called.attr}"
        else:
            continue
        target_module, _, target_function = target.partition(".")
        if (ROOT / f"{target_module}.py").is_file() and target_function in definitions(target_module):
            found.append((target, nested))
    return found


def test_the_reading_map_states_the_counts_of_its_table():
    """Each listed function exists, at a depth of 1 or more, and the sentence above the table gives the counts of
    the table: functions, files, lines (each function from its `def` line to its last) and the deepest depth."""
    entries, section = reading_map()
    nodes = {name: mapped_function(name) for name in entries}
    shallow = [name for name, depth in entries.items() if depth < 1]
    assert not shallow, f"depths below `train_step` start at 1: {shallow}"
    counts = MAP_COUNTS.search(section)
    assert counts, "the reading map states no 'N functions in M files, L lines ... at most D calls below'"
    stated = [int(value.replace(",", "")) for value in counts.groups()]
    computed = [len(entries), len({name.split(".")[0] for name in entries}),
                sum(node.end_lineno - node.lineno + 1 for node in nodes.values()), max(entries.values())]
    assert stated == computed, f"the reading map states {stated}, its table gives {computed}"


def test_the_reading_map_follows_every_call_it_can_resolve():
    """From `train_step` down, every repository function a listed function calls (as far as ast resolves the call)
    is listed or named above as machinery, and is at most one call deeper than its caller (a call in a lambda or
    nested function runs later, from elsewhere: no bound); what `train_step` calls itself is at depth 1."""
    entries, _ = reading_map()
    depths = {"canoe.train_step": 0, **entries}
    left_out, too_deep = [], []
    for caller, depth in depths.items():
        for callee, nested in repository_calls(caller):
            if callee not in entries and callee not in MACHINERY:
                left_out.append(f"{caller} calls {callee}")
            elif callee in entries and not nested and entries[callee] > depth + 1:
                too_deep.append(f"{caller} ({depth}) calls {callee} ({entries[callee]})")
    assert not left_out, "neither in the reading map nor machinery:\n" + "\n".join(left_out)
    assert not too_deep, "listed deeper than a call below its caller:\n" + "\n".join(too_deep)
    for name in MACHINERY | MACHINERY_THROUGH_SET_UP:
        assert name not in entries, f"{name} is both in the map and named as machinery"
        mapped_function(name)  # it exists


def test_the_reading_map_stays_within_its_limits():
    """What a learner opens to check the step: at most MAP_LIMITS' functions, lines and calls below `train_step`."""
    entries, _ = reading_map()
    lines = sum(node.end_lineno - node.lineno + 1 for node in map(mapped_function, entries))
    figures = {"functions": len(entries), "lines": lines, "depth": max(entries.values())}
    over = {name: f"{figures[name]} > {limit}" for name, limit in MAP_LIMITS.items() if figures[name] > limit}
    assert not over, over


def test_every_machinery_call_has_a_contract_and_a_test_that_holds_it():
    """Each machinery call is made from a mapped function (none is named for nothing), the map's Machinery section
    states its contract with the test that holds it, and that test exists."""
    entries, _ = reading_map()
    called = {callee for caller in ["canoe.train_step", *entries] for callee, _ in repository_calls(caller)}
    unused = [name for name in MACHINERY if name not in called]
    assert not unused, f"named as machinery but called from no mapped function: {unused}"
    machinery = " ".join(READING_MAP.read_text().split("\n## Machinery", 1)[1].split())
    for name, (contract, tests) in (MACHINERY | MACHINERY_THROUGH_SET_UP).items():
        stated = f"`{name}`: {contract} (" in machinery  # the whole contract, then the call or the test in brackets
        assert stated, f"the reading map does not state {name}'s contract: {contract}"
        for test in tests.split(", "):
            path, function = test.split("::")
            assert f"`{test}`" in machinery, f"the reading map does not name {test}, which holds {name}'s contract"
            defined = {node.name for node in ast.parse((ROOT / path).read_text()).body
                       if isinstance(node, ast.FunctionDef)}
            assert function in defined, f"{name}'s contract is held by {test}, which does not exist"


def scientific(x: float) -> str:
    """A number as the README writes it: 1e-4, 2.5e-5."""
    mantissa, exponent = f"{x:e}".split("e")
    return f"{float(mantissa):g}e{int(exponent)}"


def test_the_readme_states_the_defaults_constants():
    """The README's equations and walk give the constants config.toml and config.py set, and the warm-up's first
    rates as training/optimizer.py's schedule gives them."""
    import torch

    from config import load_config
    from training.optimizer import lr_schedule

    cfg = load_config(ROOT / "config.toml")
    readme = " ".join((ROOT / "README.md").read_text().split())
    optimizer = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=cfg.learning_rate)
    schedule = lr_schedule(cfg, optimizer, cfg.max_steps * cfg.num_iterations)
    rates = []
    for _ in range(3):
        rates.append(optimizer.param_groups[0]["lr"])
        optimizer.step()
        schedule.step()
    warmup = math.ceil(cfg.warmup_ratio * cfg.max_steps)
    assert cfg.num_iterations == 1 and cfg.advantage_std == "unbiased" and cfg.aggregation == "seq-mean-token-mean"
    assert rates == [0.0, cfg.learning_rate / warmup, cfg.learning_rate] and cfg.lr_scheduler == "constant"
    stated = [f"G = {cfg.num_generations}", f"τ = {cfg.temperature}", f"+ {scientific(cfg.advantage_eps)})",
              f"clip(ρ_{{i,t}}, 1 − {cfg.clip_eps_low}, 1 + {cfg.clip_eps_high})", f"β = {cfg.beta}",
              f"μ = {cfg.num_iterations}", f"⌈{cfg.warmup_ratio} × {cfg.max_steps}⌉ = {warmup} updates, at 0 and then "
              f"{scientific(rates[1])}", f"then a constant {scientific(rates[2])}"]
    missing = [text for text in stated if text not in readme]
    assert not missing, f"the README does not state: {missing}"
