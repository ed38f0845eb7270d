"""Which ops the project computes on device tensors, and whether CUDA has a kernel for each, checked on a CPU.

    python tests/cuda_kernels.py MODEL_DIR DTYPE plain    # the full and the merged LoRA push, one training step
    python tests/cuda_kernels.py MODEL_DIR DTYPE adapter  # the LoRA adapter push (an engine with LoRA support)

`DeviceOps` is a TorchDispatchMode that records every aten op with the dtypes of its tensor inputs, where the
Python code that called it is the project's own (the first frame outside torch and the standard library lies in
this repository, outside .venv): vLLM's, PEFT's and transformers' internals run on CUDA as their authors built
them, what this project computes is ours to check. A backward pass counts as called where `backward()` was.

`missing_kernels` reads torch's OpInfo table (`op.supported_dtypes("cuda")`): an op whose inputs have a dtype that
CUDA does not list for it would raise "not implemented for ..." on a GPU, as `int64 @ int64` (aten::dot) does.
Ops the table does not cover are listed in NOT_IN_TABLE with why CUDA has them for every dtype we use.

The script runs one push of each kind with the trainer's own `WeightPush` (training/push.py) and one training
step's loss and backward (training/packing.py, grpo_loss.py) under `DeviceOps`, and prints one JSON line: every
recorded (op, dtypes) with the place that called it, and those CUDA lacks.
"""

from __future__ import annotations

import functools
import json
import os
import sys
import sysconfig
import tempfile
from pathlib import Path

os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")  # a fixed KV cache, as training sets it

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from plumbing import runtime  # noqa: E402,I001  (first: thread count and vLLM's in-process mode)
import torch  # noqa: E402
from torch.utils._python_dispatch import TorchDispatchMode  # noqa: E402
from torch.utils._pytree import tree_flatten  # noqa: E402

TORCH = str(Path(torch.__file__).parent)
STDLIB = sysconfig.get_paths()["stdlib"]
HERE = str(Path(__file__).resolve())
VENV = str(ROOT / ".venv")

# Ops the OpInfo table has no entry for, and why CUDA runs them for every dtype this project gives them.
NOT_IN_TABLE = {
    # views and aliases: no kernel of their own, they change the shape or strides of a tensor
    "_unsafe_view", "alias", "as_strided", "detach", "expand", "lift_fresh", "slice", "split_with_sizes",
    "unbind", "view", "unsqueeze", "squeeze", "t", "transpose", "select", "permute", "split",
    # copies, casts and allocations: defined for every dtype on CUDA (the copy kernel casts between any two)
    "_to_copy", "copy", "clone", "empty", "empty_like", "empty_strided", "new_empty", "new_empty_strided",
    "new_zeros", "new_ones", "new_full", "zeros", "ones", "full", "fill", "zero", "scalar_tensor", "lift",
    "_local_scalar_dense", "resize",
    # no tensor at all: a dtype computed from two dtypes
    "promote_types",
    # backward kernels of forward ops that the table lists for these dtypes (each derivative is registered beside
    # its forward for the same dtypes, tools/autograd/derivatives.yaml)
    "embedding_dense_backward", "masked_scatter_backward", "select_backward", "silu_backward", "slice_backward",
    # CPU attention: on CUDA the same scaled_dot_product_attention call runs CUDA's kernels for these dtypes
    "_scaled_dot_product_flash_attention_for_cpu", "_scaled_dot_product_flash_attention_for_cpu_backward",
}

# bfloat16 for these is listed for CUDA only where torch sees a device of compute capability 5.3 or newer
# (common_methods_invocations: `*[torch.bfloat16] if SM53OrLater`); a CPU-only torch sees none. Every GPU the
# recipes name (A100, H100) is 8.0 or newer.
BFLOAT16_ON_CAPABLE_GPUS = {"matmul", "bmm", "baddbmm", "addbmm", "mm", "addmm", "addmv", "mv", "dot", "linear",
                            "nn.functional.linear"}


def first_caller(skip: int = 2) -> str | None:
    """"file:line" of the innermost frame outside torch, the standard library and the recorder, where it is the
    project's own code (this script's training step stands in for the trainer's call of backward); None where it
    is a library's."""
    frame = sys._getframe(skip)
    while frame is not None:
        path = frame.f_code.co_filename
        recorder = path == HERE and frame.f_code.co_name == "__torch_dispatch__"
        if not (path.startswith(TORCH) or path.startswith(STDLIB) or recorder or path.startswith("<")):
            break
        frame = frame.f_back
    if frame is None:
        return None
    path = frame.f_code.co_filename
    if not path.startswith(str(ROOT)) or path.startswith(VENV):
        return None
    return f"{os.path.relpath(path, ROOT)}:{frame.f_lineno}"


class DeviceOps(TorchDispatchMode):
    """Record (aten op, sorted dtypes of its tensor inputs) → the first place in the project that called it."""

    def __init__(self):
        super().__init__()
        self.seen: dict[tuple[str, tuple[str, ...]], str] = {}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        where = first_caller()
        if where is not None:
            tensors = [x for x in tree_flatten((args, kwargs))[0] if isinstance(x, torch.Tensor)]
            dtypes = tuple(sorted({str(t.dtype).removeprefix("torch.") for t in tensors}))
            self.seen.setdefault((func.overloadpacket.__name__, dtypes), where)
        return func(*args, **kwargs)


@functools.cache
def _table() -> dict[str, set[torch.dtype]]:
    """op name → the dtypes CUDA has for it, from torch's OpInfo table (its default variant where it has one)."""
    from torch.testing._internal.common_methods_invocations import op_db

    variants: dict[str, list] = {}
    for op in op_db:
        for name in {op.name, op.aten_name, *(alias.name for alias in op.aliases)}:
            if name:
                variants.setdefault(name, []).append(op)
    table = {}
    for name, ops in variants.items():
        default = [op for op in ops if not op.variant_test_name] or ops
        table[name] = set().union(*(op.supported_dtypes("cuda") for op in default))
    return table


# aten ops that the table lists under another name: Python's operators and indexing
TABLE_NAMES = {"__rshift__": "bitwise_right_shift", "__lshift__": "bitwise_left_shift", "index": "__getitem__"}


def cuda_dtypes(op: str) -> set[torch.dtype] | None:
    """The dtypes CUDA has for the aten op `op` (its overload packet's name), None where the table lacks it. An
    in-place op ("add_") is its op's; a private one ("_log_softmax") the public one's."""
    table = _table()
    op = TABLE_NAMES.get(op, op)
    for name in (op, op.rstrip("_"), op.lstrip("_"), op.strip("_")):
        if name in table:
            return table[name]
    return None


def missing_kernels(seen: dict[tuple[str, tuple[str, ...]], str]) -> list[str]:
    """The recorded (op, dtypes) that CUDA has no kernel for, each with where it was called; and ops that are
    neither in the table nor in NOT_IN_TABLE (a new op must be looked at before it is trusted)."""
    missing = []
    for (op, dtypes), where in sorted(seen.items()):
        allowed = cuda_dtypes(op)
        if allowed is None:
            if op.strip("_") not in NOT_IN_TABLE and op.rstrip("_") not in NOT_IN_TABLE:
                missing.append(f"{op} {list(dtypes)} at {where}: not in torch's OpInfo table nor in NOT_IN_TABLE")
            continue
        if op.strip("_") in BFLOAT16_ON_CAPABLE_GPUS:
            allowed = allowed | {torch.bfloat16}
        lacking = [d for d in dtypes if getattr(torch, d) not in allowed]
        if lacking:
            missing.append(f"{op} {lacking} at {where}: CUDA has no kernel for it")
    return missing


# ----------------------------------------------------------------------------------------------------- the script


def perturbed_lora(model_dir: str, dtype: torch.dtype, rank: int = 8):
    """The model with LoRA adapters whose B moved (B starts at 0), in `dtype` with float32 adapters, as trained."""
    from transformers import AutoModelForCausalLM

    from config import LORA_TARGETS
    from plumbing import lora

    model = lora.wrap(AutoModelForCausalLM.from_pretrained(model_dir, dtype=dtype), rank=rank, alpha=16.0,
                      dropout=0.0, target_modules=LORA_TARGETS)
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "lora_B" in name:
                param.copy_(0.05 * torch.randn(param.shape, generator=generator))
    return model


def training_step(model, vocab: int, recorder: DeviceOps) -> None:
    """One micro-batch's loss and backward as canoe.update computes them, with π_ref, the truncated
    importance weight (variants.py), several passes' clip and the metrics' reductions switched on."""
    import grpo_loss
    import variants
    import grpo_loss
    from training import packing

    prompts = [[(5 * i + 1) % vocab for i in range(12)]] * 2
    completions = [[(7 * i + 3) % vocab for i in range(6)], [(3 * i + 2) % vocab for i in range(4)]]
    with recorder:
        packed = packing.pack_micro_batch(prompts, completions, torch.device("cpu"))
        logprobs = grpo_loss.completion_logprobs(model, packed)  # (M, C)
        with torch.no_grad():
            reference = grpo_loss.completion_logprobs(model, packed) - 0.01
        advantages = grpo_loss.group_advantages(torch.tensor([1.0, 0.0]), 2)  # (M,)
        loss, metrics = grpo_loss.grpo_loss(logprobs, logprobs.detach() + 0.05, reference, advantages,
                                            packed.completion_mask, vllm_logprobs=logprobs.detach() - 0.1,
                                            importance_cap=2.0, clip_eps_high=0.28, total_sequences=2.0,
                                            surrogate_weight=variants.SURROGATE_WEIGHTS["truncated_importance"])
        loss.backward()
        grpo_loss.summarize_metrics(grpo_loss.merge_metrics([metrics, metrics]))


def main(model_dir: str, dtype_name: str, kind: str) -> None:
    from transformers import AutoModelForCausalLM

    import rollout
    from config import Config
    from training.push import WeightPush

    runtime.single_process_defaults()
    dtype = getattr(torch, dtype_name)
    llm = rollout.make_engine(model_dir, dtype=dtype_name, seed=0, max_model_len=256, gpu_memory_utilization=0.5,
                              enable_sleep_mode=False, lora_rank=8 if kind == "adapter" else 0)
    vocab = AutoModelForCausalLM.from_pretrained(model_dir).config.vocab_size
    probe = ([(7 * i + 3) % vocab for i in range(24)], [(11 * i + 5) % vocab for i in range(16)])

    def pusher(lora_rank: int, adapter: bool = False) -> WeightPush:  # the trainer's own choice of way, for dtype
        return WeightPush.create(Config(dtype=dtype_name, lora_rank=lora_rank), llm, probe, dtype, adapter=adapter,
                                 sleep=False, folder=Path(tempfile.mkdtemp()))

    recorder, pushed = DeviceOps(), {}
    if kind == "adapter":
        with recorder:
            pushed["adapter"] = pusher(8, adapter=True)(perturbed_lora(model_dir, dtype))
    else:
        full = AutoModelForCausalLM.from_pretrained(model_dir, dtype=dtype)
        with recorder:
            pushed["full"] = pusher(0)(full)
            pushed["merged"] = pusher(8)(perturbed_lora(model_dir, dtype))
        training_step(full.train(), vocab, recorder)
    seen = {f"{op} {','.join(dtypes)}": where for (op, dtypes), where in sorted(recorder.seen.items())}
    print("RESULT " + json.dumps({"pushed": pushed, "seen": seen, "missing": missing_kernels(recorder.seen)}),
          flush=True)


if __name__ == "__main__":
    main(*sys.argv[1:4])
