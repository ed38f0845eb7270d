"""The memory plan: what each GPU holds when vLLM is colocated with the trainer, predicted from the config alone.

    python canoe.py --config recipes/llama3.1-8b.toml --plan-memory [--gpu-gib 80] [--world-size 8]

vLLM starts only if the device's free memory is at least total × `gpu_memory_utilization`, and the engine is
created after the trainer has allocated (canoe.setup), so its share must fit in what the trainer leaves free; each
recipe's `vllm_gpu_memory_utilization` comes from this plan. Each part is held all step ("resident"), while
training or while sampling ("rollout"); with sleep mode vLLM sleeps while the trainer trains, so the peak is the
larger of the two phases, without it both add up. With LoRA (`lora_rank = r > 0`) gradients and optimizer state
exist only for the adapter parameters (`lora_parameters`), float32 like the adapters, and there is no reference
model. The architecture comes from the model folder's config.json, else from `KNOWN_ARCHITECTURES` by name.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

GIB = 2**30
DTYPE_BYTES = {"bfloat16": 2, "float16": 2, "float32": 4}
ADAM_BYTES = 12  # float32 master weights, first and second moment, per parameter
FP32_GRAD_BYTES = 4  # the float32 gradient partition the optimizer steps on
# DeepSpeed's reduce_bucket_size and stage3_max_live_parameters defaults.
REDUCE_BUCKET = 5 * 10**8
MAX_LIVE_PARAMETERS = 10**9
CUDA_RESERVE = 2 * GIB  # CUDA context, NCCL buffers and allocator fragmentation, per GPU (an allowance)
# What a sleeping vLLM keeps outside its sleep pool (input buffers, an attention workspace): an allowance.
VLLM_ASLEEP = 1 * GIB
LOGPROB_CHUNK = 512  # positions token_logprobs upcasts at a time (its chunk_size)
# vLLM's working memory: its profile run at max_num_batched_tokens (16384 for the LLM class on a GPU of 70 GiB or
# more) keeps one layer's gate/up/act output, its sampler warm-up float32 logits for max_num_seqs (1024) sequences,
# forward and softmax; CUDA graphs get an allowance.
VLLM_BATCHED_TOKENS = 16384
VLLM_MAX_SEQS = 1024
CUDA_GRAPHS = 1 * GIB


class ArchitectureError(ValueError):
    """The plan cannot know the model's architecture."""


@dataclass(frozen=True)
class Architecture:
    """The facts of a Llama/Qwen2-style decoder that set its memory (names as in a Hugging Face config.json)."""

    hidden: int
    layers: int
    intermediate: int
    vocab: int
    heads: int
    kv_heads: int
    head_dim: int
    qkv_bias: bool = False
    tied_embeddings: bool = False

    @property
    def kv_dim(self) -> int:
        return self.kv_heads * self.head_dim

    @property
    def num_parameters(self) -> int:
        """Embeddings (and an untied output head), per layer q/k/v/o, the gated MLP and two norms, a final norm.

        >>> KNOWN_ARCHITECTURES["Llama-3.1-8B-Instruct"].num_parameters
        8030261248
        """
        h, q, kv = self.hidden, self.heads * self.head_dim, self.kv_dim
        attention = h * q + 2 * h * kv + q * h + ((q + 2 * kv) if self.qkv_bias else 0)
        layer = attention + 3 * h * self.intermediate + 2 * h
        embeddings = self.vocab * h * (1 if self.tied_embeddings else 2)
        return embeddings + self.layers * layer + h


# Used when the model folder is not there (a plan made before the download). From the models' config.json files.
KNOWN_ARCHITECTURES = {
    "Llama-3.1-8B-Instruct": Architecture(hidden=4096, layers=32, intermediate=14336, vocab=128256, heads=32,
                                          kv_heads=8, head_dim=128),
    "Qwen2.5-7B-Instruct": Architecture(hidden=3584, layers=28, intermediate=18944, vocab=152064, heads=28,
                                        kv_heads=4, head_dim=128, qkv_bias=True),
    "Qwen2.5-14B-Instruct": Architecture(hidden=5120, layers=48, intermediate=13824, vocab=152064, heads=40,
                                         kv_heads=8, head_dim=128, qkv_bias=True),
}


def lora_parameters(arch: Architecture, rank: int, targets: list[str]) -> int:
    """T: the adapter parameters of LoRA of rank `rank` on the modules named in `targets`, r · (in + out) each.

    >>> lora_parameters(KNOWN_ARCHITECTURES["Llama-3.1-8B-Instruct"], 16, ["q_proj", "v_proj"])
    6815744
    """
    h, q, kv, inter, n = arch.hidden, arch.heads * arch.head_dim, arch.kv_dim, arch.intermediate, arch.layers
    shapes = {"q_proj": (h, q, n), "k_proj": (h, kv, n), "v_proj": (h, kv, n), "o_proj": (q, h, n),  # (in, out, count)
              "gate_proj": (h, inter, n), "up_proj": (h, inter, n), "down_proj": (inter, h, n),
              "lm_head": (h, arch.vocab, 1), "embed_tokens": (arch.vocab, h, 1)}
    unknown = [t for t in targets if t not in shapes]
    if unknown:
        raise ArchitectureError(f"lora_target_modules {unknown}: the plan knows {sorted(shapes)}")
    return sum(rank * (fan_in + fan_out) * count for fan_in, fan_out, count in map(shapes.get, dict.fromkeys(targets)))


def architecture(model: str) -> Architecture:
    """The architecture of `model`: its folder's config.json, else KNOWN_ARCHITECTURES by the folder's name."""
    config = Path(model) / "config.json"
    if config.exists():
        raw = json.loads(config.read_text())
        heads = raw["num_attention_heads"]
        return Architecture(
            hidden=raw["hidden_size"], layers=raw["num_hidden_layers"], intermediate=raw["intermediate_size"],
            vocab=raw["vocab_size"], heads=heads, kv_heads=raw.get("num_key_value_heads", heads),
            head_dim=raw.get("head_dim") or raw["hidden_size"] // heads,
            qkv_bias=raw.get("model_type") == "qwen2" or bool(raw.get("attention_bias", False)),
            tied_embeddings=bool(raw.get("tie_word_embeddings", False)))
    name = Path(model).name
    if name in KNOWN_ARCHITECTURES:
        return KNOWN_ARCHITECTURES[name]
    raise ArchitectureError(f"no {config} and {name!r} is not one of the known architectures "
                            f"{sorted(KNOWN_ARCHITECTURES)}; put the model there first")


@dataclass(frozen=True)
class Plan:
    """Bytes per GPU, by part; `parts` maps a name to (bytes, phase), phase "resident", "training" or "rollout"."""

    parts: dict[str, tuple[float, str]]
    total: float  # the GPU's memory
    share: float  # vLLM's gpu_memory_utilization
    sleep: bool  # vLLM sleeps while the trainer trains
    kv_cache: float  # what the share leaves vLLM for its KV cache
    kv_per_token: float
    sequence_tokens: int  # the longest sequence the engine must hold (prompt + two completions)

    def phase(self, name: str) -> float:
        return sum(size for size, phase in self.parts.values() if phase == name)

    @property
    def training_peak(self) -> float:
        return self.phase("resident") + self.phase("training") + (0.0 if self.sleep else self.phase("rollout"))

    @property
    def rollout_peak(self) -> float:
        return self.phase("resident") + self.phase("rollout") + (0.0 if self.sleep else self.phase("training"))

    @property
    def free_at_engine_start(self) -> float:
        """What the trainer leaves free when the engine is created (after the trainer's set-up, before any step)."""
        return self.total - self.phase("resident")

    @property
    def fitting_share(self) -> float:
        """The largest share, in hundredths, that vLLM can start with beside the trainer and still leave room
        for the training activations when it does not sleep."""
        room = self.free_at_engine_start - (0.0 if self.sleep else self.phase("training"))
        return math.floor(100 * room / self.total) / 100

    def problems(self) -> list[str]:
        """Why this plan cannot run; empty when it can."""
        found = []
        if self.share * self.total > self.free_at_engine_start:
            found.append(f"vLLM cannot start: it needs {self.share} × {self.total / GIB:.1f} GiB free, the trainer "
                         f"leaves {self.free_at_engine_start / GIB:.1f} GiB (largest share that fits: "
                         f"{self.fitting_share})")
        if self.kv_cache < self.sequence_tokens * self.kv_per_token:
            sequence = self.sequence_tokens * self.kv_per_token
            found.append(f"the share leaves {self.kv_cache / GIB:.1f} GiB of KV cache, less than one "
                         f"{self.sequence_tokens}-token sequence ({sequence / GIB:.2f} GiB)")
        for name, peak in (("training", self.training_peak), ("rollout", self.rollout_peak)):
            if peak > self.total:
                found.append(f"the {name} phase needs {peak / GIB:.1f} GiB of {self.total / GIB:.1f} GiB")
        return found

    def table(self) -> str:
        lines = [f"{'part':<44}{'GiB':>8}  phase"]
        lines += [f"{name:<44}{size / GIB:>8.2f}  {phase}" for name, (size, phase) in self.parts.items()]
        sequences = self.kv_cache / (self.kv_per_token * self.sequence_tokens)
        lines += [
            f"  (the KV cache holds {sequences:.1f} sequences of {self.sequence_tokens} tokens)",
            f"{'peak while training' + (' (vLLM asleep)' if self.sleep else ''):<44}{self.training_peak / GIB:>8.2f}",
            f"{'peak while sampling':<44}{self.rollout_peak / GIB:>8.2f}",
            f"{'free when vLLM starts (it asks share × total)':<44}{self.free_at_engine_start / GIB:>8.2f}",
            f"{'GPU':<44}{self.total / GIB:>8.2f}",
            f"vLLM share {self.share} (largest that fits: {self.fitting_share})",
        ]
        problems = self.problems()
        lines.append("does not fit: " + "; ".join(problems) if problems else "fits")
        return "\n".join(lines)


def layer_activation_bytes(arch: Architecture, L: int, width: int, rank: int = 0, targets: tuple | list = ()) -> int:
    """The bytes one decoder layer keeps for backward over `L` packed tokens in bfloat16 (`width` 2), as autograd
    saves them (tests/test_memory_plan.py). Per token: each RMSNorm its float32 input and 1/rms (4h + 4, twice);
    attention q, k, v repeated to every head and its output (4q, q = heads · head_dim) and a float32 log-sum-exp
    per head; the MLP gate, up, act(gate) (3I). The trained weights' inputs: without LoRA each norm's normed input
    and output and act(gate)·up (4h + I); with LoRA of `rank` on `targets`, the float32 copy PEFT makes of each
    adapted projection's input for its float32 adapters (4 · fan-in each, none shared) and its output (4 · rank)."""
    h, q, I = arch.hidden, arch.heads * arch.head_dim, arch.intermediate
    kept = 2 * (4 * h + 4) + 4 * q * width + 4 * arch.heads + 3 * I * width
    if not rank:
        return L * (kept + (4 * h + I) * width)
    fan_in = {"q_proj": h, "k_proj": h, "v_proj": h, "o_proj": q, "gate_proj": h, "up_proj": h, "down_proj": I}
    return L * (kept + sum(4 * (fan_in[t] + rank) for t in dict.fromkeys(targets) if t in fan_in))


def activation_bytes(cfg, arch: Architecture, width: int) -> dict[str, float]:
    """The training activations of one micro-batch, worst case (every completion at max_completion_tokens), packed
    into one row of L tokens, T of them predicted: every layer's (`layer_activation_bytes`); the head's, the logits
    and their gradient, token_logprobs' float32 chunks and (5L + T)·h around them; the attention mask. Gradient
    checkpointing keeps each layer's input and the larger of the head and one recomputed layer.
    """
    L = cfg.prompts_per_device * (cfg.max_prompt_tokens + cfg.num_generations * cfg.max_completion_tokens)
    T = cfg.prompts_per_device * cfg.num_generations * cfg.max_completion_tokens
    h, V = arch.hidden, arch.vocab
    layer = layer_activation_bytes(arch, L, width, cfg.lora_rank, cfg.lora_target_modules)
    head = 2 * T * V * width + 3 * min(LOGPROB_CHUNK, T) * V * 4 + (5 * L + T) * h * width
    row = -(-L // 8) * 8  # packing.MASK_ALIGNMENT
    mask = {"activations: attention mask": L * row * width + L * L}
    if cfg.gradient_checkpointing:
        return {"activations: layer inputs (checkpointed)": arch.layers * L * h * width,
                "activations: head or one recomputed layer": max(layer, head)} | mask
    return {"activations: layers": arch.layers * layer, "activations: the output head": head} | mask


def plan_memory(cfg, arch: Architecture, *, world_size: int, total_bytes: float, sleep: bool = True) -> Plan:
    """The per-GPU plan of `cfg` (a config.Config) on `world_size` GPUs of `total_bytes` each."""
    width = DTYPE_BYTES["bfloat16" if cfg.dtype == "auto" else cfg.dtype]
    P, W, zero3 = arch.num_parameters, world_size, cfg.zero_stage == 3
    T = lora_parameters(arch, cfg.lora_rank, cfg.lora_target_modules) if cfg.lora_rank else P  # trained parameters
    weights = width * P / W if zero3 else width * P
    trained = 4 if cfg.lora_rank else width  # PEFT's adapters are float32 (DeepSpeed's bf16 mode is off with LoRA)
    bucket = min(REDUCE_BUCKET, T) * trained * (2 if zero3 else 1)  # overlap_comm is on by default only for ZeRO-3
    gradients = bucket if cfg.offload_optimizer else (trained + FP32_GRAD_BYTES) * T / W + bucket
    frozen = " (frozen base)" if cfg.lora_rank else ""
    resident = {f"policy weights (ZeRO-{cfg.zero_stage}, {W} ranks){frozen}": weights}
    if cfg.lora_rank:
        adapters = f"LoRA adapters (rank {cfg.lora_rank}, {T / 1e6:.1f} M parameters)"
        resident[adapters] = trained * T / W if zero3 else trained * T
    resident["gradients"] = gradients
    optimizer = "optimizer state" + (" (offloaded to the host)" if cfg.offload_optimizer else "")
    resident[optimizer] = 0.0 if cfg.offload_optimizer else ADAM_BYTES * T / W
    if zero3:
        resident["ZeRO-3 gathered parameters"] = min(P, MAX_LIVE_PARAMETERS) * width
    # With LoRA, π_ref is the policy with its adapters disabled: no copy.
    resident["reference model"] = weights if cfg.beta > 0 and not cfg.lora_rank else 0.0
    resident["CUDA context and fragmentation"] = CUDA_RESERVE
    training = {"vLLM asleep: buffers outside its sleep pool": VLLM_ASLEEP} if sleep else {}
    training |= activation_bytes(cfg, arch, width)
    share = cfg.vllm_gpu_memory_utilization
    working = VLLM_BATCHED_TOKENS * 3 * arch.intermediate * width + 2 * VLLM_MAX_SEQS * arch.vocab * 4 + CUDA_GRAPHS
    kv_cache = max(0.0, share * total_bytes - width * P - working)  # vLLM's KV cache is the rest of its share
    rollout = {"vLLM: weights": width * P, "vLLM: working memory": working,
               "vLLM: KV cache (the rest of its share)": kv_cache}
    parts = {name: (size, phase) for phase, sizes in (("resident", resident), ("training", training),
                                                      ("rollout", rollout)) for name, size in sizes.items()}
    return Plan(parts, total_bytes, share, sleep, kv_cache, kv_per_token=2 * arch.layers * arch.kv_dim * width,
                sequence_tokens=cfg.max_prompt_tokens + 2 * cfg.max_completion_tokens)
