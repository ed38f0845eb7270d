"""The scoreboard: a trained policy against its base model prompted plainly, with 95 % intervals, on one decision set.

    .venv/bin/python bench/scoreboard.py --model runs/default/checkpoints/step-000024/policy --benchmarks DIR
    make scoreboard MODEL=runs/default/checkpoints/step-000024/policy BENCHMARKS=DIR

The decision set (`decision_set`): the synthetic eval split (data/synth/eval.jsonl, 300 items) and the hand-written
held-out items (data/heldout/faithfulness.jsonl, 40), scored as `--eval` scores them (em and contains, fractions);
and, from `--benchmarks DIR` (the user's own copies; left out when not given), ConFiQA-QA/MR/MC.dev25.json under the
`confiqa` suite (em, ps, mr in percent, pooled as confiqa75), items 0-299 of followrag-nq.json under `followrag`
(em) and items 0-499 of cnq-nqswap.dev500.json (NQ-Swap in CANOE's CNQ format) under `cnq` (em; contains,
sentence and org, `per_item_hits`), scored by the official rules (suites.py). Every item is answered: no prompt is
dropped for its length. Each benchmark file must have the sha256 docs/evaluation.md records (`recorded`): another
stops the run before anything is scored, unless --unchecked-benchmarks (a file of your own).

The two sides:
- the policy, under `--config`'s prompt (the one it was trained with). A LoRA checkpoint (a `policy/` folder with
  `adapter/` beside it) runs as `--eval` runs it, as training's rollout engine ran it (evaluate.adapter_rank, by
  the `lora_push` and dtype in the run_config.json of the run that wrote it): its base with the adapter applied by
  vLLM where training pushed the adapter (by default on a GPU outside float32), else the adapter merged in float32
  (exact) into its base, as stored, loaded by vLLM like any model (`policy_folder`);
- the base model of `--config` under `--plain`'s prompt (recipes/plain-prompt.toml: a plain system prompt, no
  response prefix), the baseline a user would pick.
Both decode greedily in one vLLM engine each, in `--dtype` (default: the checkpoint's run's dtype, else what the
config's dtype resolves to here).
Outputs are cached by (model digest, prompt, file digest, decoding) under runs/scoreboard/cache, so a second policy
costs one evaluation: the base's outputs are reused.

Intervals are percentile bootstraps over items (`bootstrap`); the difference against the plain base is a paired
bootstrap: each draw resamples the same items on both sides, so what both sides got right or wrong alike adds
no width. Beside the table the policy's outputs are counted for the two failure modes seen on real passages: an
answer that names the system prompt's own example (`example_names`), and an output that ends right after
`</think>`. Written next to the checkpoint (or to --out): scoreboard.json, scoreboard.png (each file's paired
difference with its interval) and scoreboard.predictions.jsonl; the last line printed is the RESULTS line.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.util
import json
import re
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Callable

import numpy as np
import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from plumbing import runtime  # noqa: E402,I001  (first: thread count and vLLM's in-process mode)

import data  # noqa: E402
from evaluation import evaluate  # noqa: E402
from evaluation import suites  # noqa: E402
from config import load_config  # noqa: E402

_spec = importlib.util.spec_from_file_location("prepare_benchmarks", ROOT / "scripts" / "prepare_benchmarks.py")
prepare_benchmarks = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(prepare_benchmarks)
RECORDED = prepare_benchmarks.RECORDED  # each benchmark file's sha256, as docs/evaluation.md records it

DRAWS = 10_000  # bootstrap resamples: the interval's ends move by well under a point between seeds
CACHE = ROOT / "runs" / "scoreboard" / "cache"  # both sides' outputs, by cache_key
PLAIN = ROOT / "recipes" / "plain-prompt.toml"  # the baseline's prompt unless --plain names another


# ----------------------------------------------------------------------------------------------------- the set


@dataclass(frozen=True)
class Target:
    """One file of the decision set: `suite` None means the synthetic format (scored as `--eval` scores it)."""

    name: str
    path: Path
    suite: str | None = None
    limit: int = 0


SYNTHETIC = ROOT / "data" / "synth" / "eval.jsonl"  # `make data` writes it
HELDOUT = ROOT / "data" / "heldout" / "faithfulness.jsonl"


def benchmark_targets(benchmarks: Path) -> list[Target]:
    """The decision set's files from the user's benchmark folder."""
    return [*(Target(f"confiqa-{kind.lower()}", benchmarks / f"ConFiQA-{kind}.dev25.json", "confiqa")
              for kind in ("QA", "MR", "MC")),
            Target("nq300", benchmarks / "followrag-nq.json", "followrag", limit=300),
            Target("cnq500", benchmarks / "cnq-nqswap.dev500.json", "cnq", limit=500)]


# A screen's file: cnq500's first 250 items, so that scoring a policy costs about half of one training (the whole
# cnq500 costs 0.85-1.0 of one: bench/RESULTS.md, "The signal check and the screen"). Scored only where named.
SCREEN = "cnq250"


def decision_set(benchmarks: Path | None, synthetic: Path = SYNTHETIC, heldout: Path = HELDOUT,
                 only: list[str] | None = None, checked: bool = True) -> list[Target]:
    """The files every policy is scored on; the benchmark files only where `benchmarks` is given; with `only`, those
    of them by name (a screen's cnq250 alone), so that the others need not exist. Each benchmark file must be the
    one recorded (`recorded`) unless `checked` is False (--unchecked-benchmarks: a file of the user's own)."""
    targets = [Target("synthetic", synthetic), Target("heldout", heldout)]
    if benchmarks is not None:
        targets += benchmark_targets(benchmarks)
        if SCREEN in (only or ()):  # cnq500's file and suite, its first 250 items
            targets.append(replace(next(t for t in targets if t.name == "cnq500"), name=SCREEN, limit=250))
    unknown = sorted(set(only or ()) - {t.name for t in targets})
    if unknown:
        raise SystemExit(f"error: {unknown}: not files of this decision set ({', '.join(t.name for t in targets)})")
    chosen = present([t for t in targets if only is None or t.name in only])
    return recorded(chosen) if checked else chosen


def present(targets: list[Target]) -> list[Target]:
    """`targets`, each file checked to exist: a missing one stops the run with its name and path."""
    for target in targets:
        if not target.path.exists():
            raise SystemExit(f"error: {target.name}: {target.path} not found")
    return targets


def recorded(targets: list[Target]) -> list[Target]:
    """`targets`, each benchmark file checked against its recorded sha256 (RECORDED, what `make benchmarks` checks):
    another file stops the run in one line with its name, its path and both digests."""
    for target in targets:
        expected = RECORDED.get(target.path.name) if target.suite else None
        digest = expected and hashlib.sha256(target.path.read_bytes()).hexdigest()
        if digest != expected:
            raise SystemExit(f"error: {target.name}: {target.path} has sha256 {digest}, not the recorded {expected}: "
                             "not the file bench/RESULTS.md measured (`make benchmarks` builds it; "
                             "--unchecked-benchmarks scores a file of your own)")
    return targets


# The rows of the table: (row, files pooled into it, metric names). ConFiQA and FollowRAG in percent as the suites
# print them, the synthetic format's em and contains as fractions.
ROWS = (("synthetic", ("synthetic",), ("em", "contains")), ("heldout", ("heldout",), ("em", "contains")),
        ("confiqa-qa", ("confiqa-qa",), ("em", "ps", "mr")), ("confiqa-mr", ("confiqa-mr",), ("em", "ps", "mr")),
        ("confiqa-mc", ("confiqa-mc",), ("em", "ps", "mr")),
        ("confiqa75", ("confiqa-qa", "confiqa-mr", "confiqa-mc"), ("em", "ps", "mr")), ("nq300", ("nq300",), ("em",)),
        ("cnq500", ("cnq500",), ("em", "contains", "sentence", "org")),
        (SCREEN, (SCREEN,), ("em", "contains", "sentence", "org")))


# ------------------------------------------------------------------------------------------------ the intervals


def mean_of(hit: str, scale: float) -> Callable[[dict[str, np.ndarray]], np.ndarray]:
    """scale × the share of items with `hit` (over the last axis)."""
    return lambda hits: scale * hits[hit].mean(axis=-1)


def memorization_ratio(hits: dict[str, np.ndarray]) -> np.ndarray:
    """ConFiQA's MR = po / (ps + po) × 100 (suites.score), 0 where neither was hit."""
    ps, po = hits["ps"].sum(axis=-1), hits["po"].sum(axis=-1)
    return np.where(ps + po > 0, 100.0 * po / np.maximum(ps + po, 1), 0.0)


def statistic(metric: str, percent: bool) -> Callable[[dict[str, np.ndarray]], np.ndarray]:
    return memorization_ratio if metric == "mr" else mean_of(metric, 100.0 if percent else 1.0)


def bootstrap(policy: dict[str, np.ndarray], base: dict[str, np.ndarray] | None,
              stat: Callable[[dict[str, np.ndarray]], np.ndarray], *, draws: int = DRAWS, seed: int = 0) -> dict:
    """`stat` on the policy's per-item hits (each array (n,)) with its 95 % percentile interval over `draws`
    resamples of the n items; with `base` (the same n items), the base's too and the paired difference policy −
    base, every draw taking the same items on both sides.

    >>> hits = {"em": np.array([1.0, 0.0, 1.0, 1.0])}
    >>> bootstrap(hits, hits, mean_of("em", 1.0), draws=200)["difference"]
    [0.0, 0.0, 0.0]
    """
    n = len(next(iter(policy.values())))
    index = np.random.default_rng(seed).integers(0, n, size=(draws, n))  # (draws, n)

    def summary(hits: dict[str, np.ndarray], values: np.ndarray) -> list[float]:
        lo, hi = np.percentile(values, [2.5, 97.5])
        return [float(stat(hits)), float(lo), float(hi)]

    drawn = stat({k: v[index] for k, v in policy.items()})  # (draws,)
    result = {"n": n, "policy": summary(policy, drawn)}
    if base is not None:
        drawn_base = stat({k: v[index] for k, v in base.items()})
        result["plain"] = summary(base, drawn_base)
        estimate = result["policy"][0] - result["plain"][0]
        lo, hi = np.percentile(drawn - drawn_base, [2.5, 97.5])
        result["difference"] = [float(estimate), float(lo), float(hi)]
    return result


# --------------------------------------------------------------------------------------------------- the cache


def digest_files(paths: list[Path]) -> str:
    """sha256 over the files' names and bytes, in name order."""
    h = hashlib.sha256()
    for path in sorted(paths, key=lambda p: p.name):
        h.update(path.name.encode() + b"\0")
        with open(path, "rb") as f:
            for block in iter(lambda: f.read(1 << 22), b""):
                h.update(block)
    return h.hexdigest()


def model_digest(folder: Path) -> str:
    """The digest of a model folder's config, weights and tokenizer (what the outputs depend on)."""
    return digest_files([p for p in folder.iterdir() if p.is_file() and (p.suffix in (".json", ".safetensors", ".txt")
                                                                          or p.name.startswith("tokenizer"))])


def cache_key(model: str, style: dict[str, str], file: str, decoding: dict) -> str:
    """The key of one side's outputs on one file: the model's digest, the prompt (system prompt, response prefix),
    the file's digest and the decoding (dtype, token limits, greedy, suite, items)."""
    fields = {"model": model, "prompt": style, "file": file, "decoding": decoding}
    return hashlib.sha256(json.dumps(fields, sort_keys=True).encode()).hexdigest()[:32]


# ----------------------------------------------------------------------------------------------- the two sides


@dataclass
class Side:
    """One side of the board: who answers (a model folder), with which prompt."""

    name: str
    model: Path
    digest: str
    style: dict[str, str]
    merged_from: dict | None = None  # base and adapter of a LoRA checkpoint merged in float32
    adapter: tuple[str, int] | None = None  # a LoRA checkpoint's adapter folder and rank, applied by vLLM


def policy_folder(model: Path, work: Path) -> tuple[Path, str, dict | None]:
    """The folder vLLM loads for `model`, its digest, and what it was merged from: a LoRA checkpoint is evaluated
    as `--eval` evaluates it, its adapter merged into its base in float32 (evaluate.lora_checkpoint), into
    `work/merged`. The merge is skipped when the outputs are cached (the digest is the adapter's and the base's,
    known before merging)."""
    source = evaluate.lora_checkpoint(str(model))
    if source is None:
        return model, model_digest(model), None
    base, adapter = Path(source[0]), Path(source[1])
    digest = hashlib.sha256((model_digest(base) + digest_files(list(adapter.iterdir()))).encode()).hexdigest()
    return work / "merged", digest, {"base": str(base), "adapter": str(adapter)}


def read_items(target: Target) -> tuple[list, list[str]]:
    """The items of `target` (rows of the synthetic format, or suites.Item) and their problems (the user turns)."""
    if target.suite is None:
        items = data.load_dataset(target.path)[: target.limit or None]
        return items, [row["problem"] for row in items]
    items = suites.read_suite(target.suite, target.path)[: target.limit or None]
    return items, [item.problem for item in items]


def prompt_ids(tokenizer, style: dict[str, str], target: Target, problems: list[str]) -> list[list[int]]:
    """The problems' prompt ids under `style`; a suite's system prompt indented as the official scripts do."""
    if target.suite is not None:
        style = {**style, "system_prompt": suites.indent_system_prompt(style["system_prompt"])}
    rows, _ = data.prepare_prompts(tokenizer, [{"problem": p} for p in problems], 10**9, **style)
    return [r["prompt_ids"] for r in rows]


def answer(side: Side, targets: list[Target], problems: dict[str, list[str]], tokenizer, cfg, dtype: str,
           cache: Path) -> dict[str, list[str]]:
    """Every target's outputs from `side` (response prefix included), from the cache where it holds them; the rest
    in one greedy vLLM generate call, each prompt with its own token limit (a suite's is the official 1024)."""
    outputs, todo = {}, []
    for target in targets:
        max_tokens = cfg.max_completion_tokens if target.suite is None else cfg.suite_max_tokens
        decoding = {"dtype": dtype, "max_tokens": max_tokens, "temperature": 0.0, "suite": target.suite,
                    "items": len(problems[target.name]), **({"adapter_applied": True} if side.adapter else {})}
        key = cache_key(side.digest, side.style, digest_files([target.path]), decoding)
        path = cache / f"{key}.json"
        if path.exists():
            outputs[target.name] = json.loads(path.read_text())["outputs"]
            print(f"{side.name}: {target.name}: {len(outputs[target.name])} outputs from the cache ({path.name})")
        else:
            todo.append((target, prompt_ids(tokenizer, side.style, target, problems[target.name]), max_tokens, path))
    if not todo:
        return outputs
    if side.merged_from is not None and not side.model.exists():
        print(f"{side.name}: merging {side.merged_from['adapter']} into its base in float32")
        evaluate.merge_in_float32(side.merged_from["base"], side.merged_from["adapter"], side.model)
    start_time = time.perf_counter()
    texts = generate(cfg, side.model, dtype, [(ids, max_tokens) for _, all_ids, max_tokens, _ in todo
                                              for ids in all_ids], side.adapter)
    print(f"{side.name}: {len(texts)} outputs in {time.perf_counter() - start_time:.0f} s")
    cache.mkdir(parents=True, exist_ok=True)
    start = 0
    for target, ids, _, path in todo:
        outputs[target.name] = [side.style["response_prefix"] + t for t in texts[start:start + len(ids)]]
        start += len(ids)
        path.write_text(json.dumps({"model": str(side.model), "file": str(target.path), "outputs": outputs[target.name]}))
    return outputs


def generate(cfg, model: Path, dtype: str, requests: list[tuple[list[int], int]],
             adapter: tuple[str, int] | None = None) -> list[str]:
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt
    from vllm.lora.request import LoRARequest

    import rollout

    runtime.single_process_defaults()
    llm = rollout.make_engine(str(model), dtype=dtype, seed=cfg.seed,
                              max_model_len=max(len(ids) + n for ids, n in requests),
                              gpu_memory_utilization=cfg.vllm_gpu_memory_utilization, enable_sleep_mode=False,
                              cpu_kv_cache_gib=cfg.vllm_cpu_kv_cache_gib, lora_rank=adapter[1] if adapter else 0)
    params = [SamplingParams(n=1, max_tokens=n, temperature=0.0, seed=cfg.seed) for _, n in requests]
    results = llm.generate([TokensPrompt(prompt_token_ids=ids) for ids, _ in requests], params, use_tqdm=True,
                           lora_request=LoRARequest("policy", 1, adapter[0]) if adapter else None)
    return [r.outputs[0].text for r in results]


# ----------------------------------------------------------------------------------------------------- scoring


def per_item_hits(target: Target, items: list, outputs: list[str]) -> dict[str, np.ndarray]:
    """0/1 per item for each counted hit: em and contains (synthetic format); em, ps, po (ConFiQA); em (FollowRAG);
    em, contains, sentence and org (CNQ). CNQ's contains is the gold inside the answer and org the original answer
    inside it (as ConFiQA's ps and po read them, without the negation guard that CNQ's em lacks too): em rewards
    the short format as much as the reading, contains reads the passage apart from the format, org counts memory
    winning. sentence is the gold inside the `<long_answer>`, or inside the whole output where there is none (the
    plain base's answer), so that a sentence is held against a sentence rather than a short answer."""
    if target.suite is None:
        rows = evaluate.item_scores(items, outputs)
        names = ("em", "contains")
    else:
        answers = [suites.extract(text)["answer"] for text in outputs]
        rows = [suites.item_hits(target.suite, item, answer) for item, answer in zip(items, answers)]
        if target.suite == "cnq":
            sentences = [suites.extract(text)["long_answer"] for text in outputs]
            rows = [{**row, "contains": suites.recall(answer, item.golds, negation_guard=False),
                     "sentence": suites.recall(sentence, item.golds, negation_guard=False),
                     "org": suites.recall(answer, item.others, negation_guard=False)}
                    for row, item, answer, sentence in zip(rows, items, answers, sentences)]
        names = tuple(rows[0])
    return {name: np.array([float(row[name]) for row in rows]) for name in names}


def example_names(style: dict) -> list[str]:
    """The names of the prompt's worked examples that an answer could copy (every example's, where one is drawn
    per prompt), from each example turn's response where there is one, else from the system prompt: the content of
    its last `<answer>` (the example's; a description of the format may name the tags before it) and the multi-word
    capitalised names of its last `<long_answer>` ("Osric Hallam", "Varnel Bridge" in config.toml). A span that
    opens in lower case is the format's description naming its tags ("written within <answer> and </answer>"), not
    an example's answer, so a prompt with no example has no names."""
    texts = ([response for _, response in style["examples"]] if style.get("examples") else
             [style["example"][1] if style.get("example") else style["system_prompt"]])
    found = []
    for text in texts:
        answers = re.findall(r"<answer>(.*?)</answer>", text, re.S)
        long_answers = re.findall(r"<long_answer>(.*?)</long_answer>", text, re.S)
        answer = answers[-1].strip() if answers else ""
        found += [answer] if answer and not answer[0].islower() else []
        if long_answers:
            found += re.findall(r"[A-Z][a-z]+(?: [A-Z][a-z]+)+", long_answers[-1])
    return list(dict.fromkeys(found))


def copies_example(output: str, problem: str, names: list[str]) -> bool:
    """The output's answer span names one of the example's names that the item itself does not."""
    span = data.answer_span(output).lower()
    return any(name.lower() in span and name.lower() not in problem.lower() for name in names)


def ends_after_think(output: str) -> bool:
    """The output closes `</think>` and writes nothing after it."""
    return "</think>" in output and not output.rsplit("</think>", 1)[1].strip()


def board(targets: list[Target], items: dict[str, list], policy: dict[str, list[str]], plain: dict[str, list[str]],
          draws: int = DRAWS) -> dict:
    """Each row of ROWS whose files were scored: per metric, the policy, the plain base and the paired difference,
    each as [estimate, lo, hi]."""
    by_name = {t.name: t for t in targets}
    hits = {side: {t.name: per_item_hits(t, items[t.name], outputs[t.name]) for t in targets}
            for side, outputs in (("policy", policy), ("plain", plain))}
    table = {}
    for row, files, metrics in ROWS:
        if not all(f in by_name for f in files):
            continue
        pooled = {side: {k: np.concatenate([hits[side][f][k] for f in files]) for k in hits[side][files[0]]}
                  for side in hits}
        percent = by_name[files[0]].suite is not None
        table[row] = {m: bootstrap(pooled["policy"], pooled["plain"], statistic(m, percent), draws=draws)
                      for m in metrics}
    return table


# ------------------------------------------------------------------------------------------------------ output


def fmt(triple: list[float], percent: bool) -> str:
    e, lo, hi = triple
    return f"{e:.1f} [{lo:.1f}, {hi:.1f}]" if percent else f"{e:.3f} [{lo:.3f}, {hi:.3f}]"


def print_table(table: dict) -> None:
    print(f"\n{'file':<12}{'n':>5}  {'metric':<9}{'policy':>22}{'plain':>22}{'policy - plain':>24}")
    for row, metrics in table.items():
        percent = not row.startswith(("synthetic", "heldout"))
        for m, r in metrics.items():
            d = r["difference"]
            mark = " *" if d[1] > 0 or d[2] < 0 else ""  # the interval excludes 0
            print(f"{row:<12}{r['n']:>5}  {m:<9}{fmt(r['policy'], percent):>22}{fmt(r['plain'], percent):>22}"
                  f"{fmt(d, percent):>24}{mark}")
    print("(95 % bootstrap intervals over items; the difference is paired; * where its interval excludes 0)")


def results_line(table: dict, seed, dtype: str, recipe: str, copied: dict[str, int], total: int,
                 against: str = "plain") -> str:
    """The RESULTS line: cnq500 (a screen's cnq250) em, contains and sentence, confiqa75 em, nq300 em, synthetic
    contains, each against the baseline, `against` (the plain base unless --plain names another prompt; cnq's
    contains and sentence without their own interval, to keep the line short), then the example's copies in all and
    in cnq500 (cnq250)."""
    parts = []
    cnq = next((name for name in ("cnq500", SCREEN) if name in table), None)
    if cnq:
        em, contains, sentence = (table[cnq][m] for m in ("em", "contains", "sentence"))
        parts.append(f"{cnq} em {fmt(em['policy'], True)} vs {against} {fmt(em['difference'], True)}, "
                     f"contains {contains['policy'][0]:.1f} vs {against} {fmt(contains['difference'], True)}, "
                     f"sentence {sentence['policy'][0]:.1f} vs {against} {fmt(sentence['difference'], True)}")
    for row, metric, percent in (("confiqa75", "em", True), ("nq300", "em", True), ("synthetic", "contains", False)):
        if row in table:
            r = table[row][metric]
            parts.append(f"{row} {metric} {fmt(r['policy'], percent)} vs {against} {fmt(r['difference'], percent)}")
    parts.append(f"example copied {sum(copied.values())} of {total}")
    if cnq:
        parts.append(f"{cnq} copied {copied.get(cnq, 0)} of {table[cnq]['em']['n']}")
    return f"scoreboard (seed {seed}, {dtype}, {recipe}): " + "; ".join(parts)


def draw(table: dict, path: Path, title: str) -> None:
    """One row per file: the paired difference policy − plain with its 95 % interval, zero marked. The synthetic
    rows (fractions) are drawn ×100, in points like the rest."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [(f"{row} {m}", r["difference"], 1.0 if not row.startswith(("synthetic", "heldout")) else 100.0)
            for row, metrics in table.items() for m, r in metrics.items() if m in ("em", "contains")]
    fig, ax = plt.subplots(figsize=(7, 0.45 * len(rows) + 1.2))
    for y, (label, (e, lo, hi), scale) in enumerate(reversed(rows)):
        color = "tab:green" if lo * scale > 0 else "tab:red" if hi * scale < 0 else "tab:gray"
        ax.errorbar(e * scale, y, xerr=[[(e - lo) * scale], [(hi - e) * scale]], fmt="o", color=color, capsize=3)
    ax.axvline(0, color="black", linewidth=0.8)
    ax.set_yticks(range(len(rows)), [label for label, _, _ in reversed(rows)])
    ax.set_xlabel("policy − plain base, points (95 % paired bootstrap interval)")
    ax.set_title(title, fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", required=True, help="the policy: a checkpoint's policy/ folder or a model folder")
    parser.add_argument("--config", default=str(ROOT / "config.toml"), help="the policy's config (prompt, base model)")
    parser.add_argument("--plain", default=str(PLAIN), help="the baseline's prompt")
    parser.add_argument("--benchmarks", type=Path, help="a folder with ConFiQA-{QA,MR,MC}.dev25.json, followrag-nq.json, "
                        "cnq-nqswap.dev500.json")
    parser.add_argument("--dtype", choices=("auto", "float32", "bfloat16"), default=None,
                        help="the engines' dtype (default: the config's, resolved on this machine)")
    parser.add_argument("--synthetic", type=Path, default=SYNTHETIC, help="the synthetic eval file")
    parser.add_argument("--heldout", type=Path, default=HELDOUT, help="the hand-written held-out file")
    parser.add_argument("--only", nargs="+", help="score only these files of the decision set (e.g. cnq500)")
    parser.add_argument("--unchecked-benchmarks", action="store_true", help="score --benchmarks files whose sha256 is "
                        "not the recorded one (your own files; by default such a file stops the run)")
    parser.add_argument("--out", type=Path, help="where the JSON and the picture go (default: beside the checkpoint)")
    parser.add_argument("--cache", type=Path, default=CACHE, help="where outputs are cached")
    parser.add_argument("--draws", type=int, default=DRAWS)
    args = parser.parse_args(argv)
    from transformers import AutoTokenizer

    cfg, plain_cfg = load_config(args.config), load_config(args.plain)
    model = Path(args.model).resolve()
    if not (model / "config.json").exists():
        raise SystemExit(f"error: --model {args.model!r} is not a model folder (no config.json)")
    info = evaluate.run_config(model)  # the run that wrote the checkpoint; {} for any other model folder
    dtype = args.dtype or info.get("dtype")  # the checkpoint's own, as `--eval` takes it
    dtype = str(runtime.resolve_dtype(dtype or cfg.dtype)).removeprefix("torch.")
    targets = decision_set(args.benchmarks, args.synthetic, args.heldout, args.only, not args.unchecked_benchmarks)
    out = args.out or (model.parent if model.name == "policy" else ROOT / "runs" / "scoreboard" / model.name)
    out.mkdir(parents=True, exist_ok=True)

    runtime.exit_on_sigterm()  # the float32 merge (2.4 GB for the default's model) is removed on SIGTERM too
    with tempfile.TemporaryDirectory(dir=out) as work:
        folder, digest, merged_from = policy_folder(model, Path(work))
        policy = Side("policy", folder, digest, cfg.prompt_style(), merged_from)
        rank = merged_from and evaluate.adapter_rank(cfg, merged_from["adapter"], getattr(torch, dtype),
                                                     cuda=torch.cuda.is_available())
        if rank:  # as training's rollout engine ran it: the base with the adapter applied, nothing merged
            policy = Side("policy", Path(merged_from["base"]), digest, cfg.prompt_style(),
                          adapter=(merged_from["adapter"], rank))
            merged_from = None
        base = Path(cfg.model).resolve() if not Path(cfg.model).is_absolute() else Path(cfg.model)
        plain = Side("plain", base, model_digest(base), plain_cfg.prompt_style())
        read = {t.name: read_items(t) for t in targets}
        items, problems = {k: v[0] for k, v in read.items()}, {k: v[1] for k, v in read.items()}
        tokenizer = AutoTokenizer.from_pretrained(cfg.model)  # the policy's too: it is the base with an adapter
        texts = {side.name: answer(side, targets, problems, tokenizer, cfg, dtype, args.cache)
                 for side in (plain, policy)}
        shutil.rmtree(Path(work) / "merged", ignore_errors=True)

    table = board(targets, items, texts["policy"], texts["plain"], args.draws)
    names = example_names(cfg.prompt_style())
    copied = {t.name: sum(copies_example(o, p, names) for o, p in zip(texts["policy"][t.name], problems[t.name]))
              for t in targets}
    stopped = {t.name: sum(map(ends_after_think, texts["policy"][t.name])) for t in targets}
    total = sum(len(items[t.name]) for t in targets)
    seed = info.get("config", {}).get("seed", cfg.seed)
    run_dtype = info.get("dtype", dtype)
    recipe = Path(args.config).name

    print_table(table)
    print(f"\nexample names {names}: copied into the answer {sum(copied.values())} of {total} "
          f"({', '.join(f'{k} {v}' for k, v in copied.items())})")
    print(f"ends right after </think>: {sum(stopped.values())} of {total} "
          f"({', '.join(f'{k} {v}' for k, v in stopped.items())})")
    report = {"model": str(model), "merged_in_float32_from": merged_from, "adapter_applied": policy.adapter,
              "config": args.config, "plain": args.plain, "benchmarks_checked": not args.unchecked_benchmarks,
              "base": str(base), "eval_dtype": dtype, "run_dtype": run_dtype, "seed": seed, "draws": args.draws,
              "files": {t.name: {"path": str(t.path), "suite": t.suite, "n": len(items[t.name])} for t in targets},
              "table": table, "example_names": names, "example_copied": copied, "ends_after_think": stopped,
              "items": total}
    (out / "scoreboard.json").write_text(json.dumps(report, indent=1))
    with open(out / "scoreboard.predictions.jsonl", "w") as f:
        for t in targets:
            for i, (p, b) in enumerate(zip(texts["policy"][t.name], texts["plain"][t.name])):
                f.write(json.dumps({"file": t.name, "index": i, "policy": p, "plain": b}) + "\n")
    plain = Path(args.plain)
    baseline = None if plain.resolve() == PLAIN.resolve() else f"the base with {plain.name}'s prompt"
    draw(table, out / "scoreboard.png", f"{model.parent.name if model.name == 'policy' else model.name} "
         f"(seed {seed}, {run_dtype}) against {baseline or 'the plainly prompted base'}")
    print(f"written to {out / 'scoreboard.json'} and scoreboard.png")
    against = baseline or "plain"
    line = results_line(table, seed, run_dtype, recipe, copied, total, against)
    report["results_line"] = line
    (out / "scoreboard.json").write_text(json.dumps(report, indent=1))
    print(line)


if __name__ == "__main__":
    main()
