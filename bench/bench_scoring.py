"""How fast a scoreboard generates against this machine's bound, at the batch vLLM runs it.

    .venv/bin/python bench/bench_scoring.py --benchmarks DIR [--file cnq500] [--items 500] [--side plain]
        [--settings "kv 1" "kv 4" "kv 4, seqs 128"]

Each setting runs in a process of its own (a fresh engine, vLLM's counters from zero): the scoreboard's own
`generate` (greedy, each prompt with its token limit, the suites' 1,024) on the first `--items` items of one file of
the decision set, from one side (`plain`: the config's base model under recipes/plain-prompt.toml, as every
scoreboard generates it once; `policy`: `--model` under the config's prompt), with the KV cache (`kv`, GiB), the most
requests at once (`seqs`, vLLM's `max_num_seqs`, 256 by default on the CPU) and the most tokens per engine step
(`chunk`, `max_num_batched_tokens`, 4,096) of the setting. Printed per setting:
- seconds; prompt tokens computed (vLLM's count less its prefix-cache hits) and tokens generated;
- the batch it ran: generated tokens / engine steps (vLLM's per-step token histogram counts the steps), the KV
  cache's size in tokens and the preemptions (requests evicted for want of KV blocks);
- the bound: the work needs at least its flops at the machine's matmul rate (2 flops per parameter per token
  computed, prompt or generated, and 4·layers·width per token of context read by attention; the rate of a
  2,048-square product in the engine's dtype), and every engine step reads every weight once and each generated token
  its context's KV entries at the copy bandwidth. The larger of the two times is the bound, and its name says which
  binds;
- how many outputs equal the first setting's. The KV cache's size changes no output where it does not bind the
  batch; a batch of other requests can move a greedy output on the CPU, whose kernels round by the batch's shape.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))
sys.path.insert(0, str(ROOT))


ENGINE_KEYS = {"seqs": "max_num_seqs", "chunk": "max_num_batched_tokens"}


def parse_setting(text: str) -> dict[str, float]:
    """A setting as written, e.g. "kv 4, seqs 128", as {"kv": 4.0, "seqs": 128.0}."""
    pairs = [part.split() for part in text.split(",")]
    if any(len(p) != 2 or p[0] not in ("kv", *ENGINE_KEYS) for p in pairs):
        raise SystemExit(f"error: setting {text!r}: write it as 'kv GIB', 'seqs N', 'chunk N', joined by commas")
    return {name: float(value) for name, value in pairs}


def worker(args: argparse.Namespace, setting: dict[str, float]) -> dict:
    """One setting: the scoreboard's generate on the chosen items, timed and counted."""
    import scoreboard  # first: the thread count and vLLM's mode, before torch loads

    import rollout
    from config import load_config
    from transformers import AutoTokenizer
    from vllm import LLM

    cfg = load_config(args.config)
    cfg = dataclasses.replace(cfg, vllm_cpu_kv_cache_gib=setting.get("kv", cfg.vllm_cpu_kv_cache_gib))
    style = load_config(scoreboard.PLAIN if args.side == "plain" else args.config).prompt_style()
    model = Path(cfg.model if args.side == "plain" else args.model).resolve()
    target = next(t for t in scoreboard.decision_set(args.benchmarks, only=[args.file], checked=False))  # timed only
    _, problems = scoreboard.read_items(target)
    tokenizer = AutoTokenizer.from_pretrained(cfg.model)
    ids = scoreboard.prompt_ids(tokenizer, style, target, problems[: args.items])
    limit = cfg.max_completion_tokens if target.suite is None else cfg.suite_max_tokens
    engines, results, timed = [], [], []

    class Counted(LLM):  # the engine as make_engine builds it, with vLLM's statistics on and the setting's batch
        def __init__(self, *a, **kw):
            extra = {ENGINE_KEYS[k]: int(v) for k, v in setting.items() if k in ENGINE_KEYS}
            super().__init__(*a, **kw, disable_log_stats=False, **extra)
            engines.append(self)

        def generate(self, *a, **kw):
            start = time.perf_counter()
            done = super().generate(*a, **kw)
            timed.append(time.perf_counter() - start)
            results.extend(done)
            return done

    rollout.LLM = Counted
    dtype = str(scoreboard.runtime.resolve_dtype(cfg.dtype)).removeprefix("torch.")
    start = time.perf_counter()
    texts = scoreboard.generate(cfg, model, dtype, [(p, limit) for p in ids])
    seconds = timed[0]  # generation alone; the engine's start-up apart
    llm = engines[0]
    metrics = {m.name: m for m in llm.get_metrics()}
    cache = llm.llm_engine.vllm_config.cache_config
    out_lengths = [len(r.outputs[0].token_ids) for r in results]
    # mean context per generated token: a request of p prompt tokens writing n reads p + t entries at its t-th
    context = sum(n * len(p) + n * (n + 1) / 2 for p, n in zip(ids, out_lengths)) / sum(out_lengths)
    computed = metrics["vllm:prompt_tokens"].value - metrics["vllm:prompt_tokens_cached"].value
    return {"seconds": seconds, "start_up": time.perf_counter() - start - seconds, "tokens": sum(out_lengths),
            "steps": metrics["vllm:iteration_tokens_total"].count,
            "prompt_computed": computed, "prompt_context": sum(len(p) ** 2 / 2 for p in ids),
            "preemptions": metrics["vllm:num_preemptions"].value, "kv_tokens": cache.num_gpu_blocks * cache.block_size,
            "at_limit": sum(n >= limit for n in out_lengths), "context": context, "dtype": dtype,
            "model": str(model), "texts": texts}


def model_shape(model: Path) -> dict[str, int]:
    """Parameters (from the safetensors headers: a tied embedding once), layers, width and KV width."""
    from safetensors import safe_open

    config = json.loads((model / "config.json").read_text())
    numel = 0
    for path in model.glob("*.safetensors"):
        with safe_open(str(path), "pt") as f:
            numel += sum(math.prod(f.get_slice(name).get_shape()) for name in f.keys())
    heads = config["num_attention_heads"]
    head_dim = config.get("head_dim") or config["hidden_size"] // heads
    return {"params": numel, "layers": config["num_hidden_layers"], "width": config["hidden_size"],
            "kv_width": config.get("num_key_value_heads", heads) * head_dim}


def matmul_rate(dtype: str, size: int = 2048) -> float:
    """This machine's matmul rate in `dtype`, flops per second: a (size × size) @ (size × size) product, large enough
    to be compute-bound, median of 10 after a warm-up."""
    from plumbing import runtime  # noqa: F401  (the thread count as in training)
    import torch

    a, b = (torch.randn(size, size, dtype=getattr(torch, dtype)) for _ in range(2))
    a @ b
    times = []
    for _ in range(10):
        start = time.perf_counter()
        a @ b
        times.append(time.perf_counter() - start)
    return 2 * size**3 / statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--benchmarks", type=Path, help="the decision set's benchmark folder (else the synthetic file)")
    parser.add_argument("--file", default="cnq500", help="one file of the decision set")
    parser.add_argument("--items", type=int, default=500)
    parser.add_argument("--side", choices=("plain", "policy"), default="plain")
    parser.add_argument("--model", help="the policy folder, with --side policy")
    parser.add_argument("--config", default=str(ROOT / "config.toml"))
    parser.add_argument("--settings", nargs="+", default=["kv 1"], help="'kv GIB, seqs N' per setting")
    parser.add_argument("--out", type=Path, default=ROOT / "runs" / "bench" / "scoring.json")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        print("RESULT " + json.dumps(worker(args, json.loads(args.worker))), flush=True)
        return
    settings = [parse_setting(text) for text in args.settings]
    import bench_decode

    bandwidth = bench_decode.copy_bandwidth()
    print(f"memory copy bandwidth: {bandwidth / 1e9:.1f} GB/s (read + write, 1 GiB tensor copy)", flush=True)
    report, first = [], None
    for text, setting in zip(args.settings, settings):
        command = [sys.executable, __file__, *sys.argv[1:], "--worker", json.dumps(setting)]
        done = subprocess.run(command, capture_output=True, text=True, cwd=ROOT)
        lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
        if not lines:
            print(f"{text}: failed\n{done.stderr[-3000:]}", flush=True)
            continue
        r = json.loads(lines[-1].removeprefix("RESULT "))
        shape = model_shape(Path(r["model"]))
        b, itemsize = r["tokens"] / r["steps"], 2 if r["dtype"] == "bfloat16" else 4
        kv_entry = 2 * shape["layers"] * shape["kv_width"] * itemsize  # bytes of one token's K and V
        read = r["steps"] * shape["params"] * itemsize + r["tokens"] * r["context"] * kv_entry
        attention = 4 * shape["layers"] * shape["width"] * (r["tokens"] * r["context"] + r["prompt_context"])
        flops = 2 * shape["params"] * (r["prompt_computed"] + r["tokens"]) + attention
        rate = matmul_rate(r["dtype"])
        bound_s = max(read / bandwidth, flops / rate)
        binds = "bandwidth" if read / bandwidth >= flops / rate else "compute"
        first = first or r["texts"]
        same = sum(a == c for a, c in zip(first, r["texts"]))
        print(f"{text}: {r['seconds']:.0f} s (the engine's start-up {r['start_up']:.0f} s apart) for "
              f"{r['prompt_computed']:.0f} prompt tokens computed and {r['tokens']} generated ({r['at_limit']} outputs "
              f"at the limit); batch {b:.1f} (KV cache {r['kv_tokens']} tokens, "
              f"{r['preemptions']:.0f} preemptions, mean context {r['context']:.0f}); bound {bound_s:.0f} s, "
              f"{binds} ({flops / rate:.0f} s of matmul at {rate / 1e9:.0f} GFLOP/s, {read / bandwidth:.0f} s of "
              f"reads): {r['seconds'] / bound_s:.2f} × the bound; outputs equal to the first setting's: {same} of "
              f"{len(r['texts'])}", flush=True)
        report.append({"setting": text, **{k: v for k, v in r.items() if k != "texts"}, "batch": b,
                       "bound_s": bound_s, "matmul_rate": rate, "binds": binds, "same_as_first": same})
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"bandwidth": bandwidth, "settings": report}, indent=1))


if __name__ == "__main__":
    main()
