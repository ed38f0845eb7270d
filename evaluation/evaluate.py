"""`canoe.py --eval`: a model's answers (or answers already written) on an evaluation set, scored and written out.

    python canoe.py --config config.toml --eval [--model runs/default/checkpoints/step-000060/policy] [--limit N]
    python canoe.py --eval --suite confiqa --eval-file ConFiQA-QA-test.json [--predictions P]   # P: no model loaded

Without `--suite` (any file `loaders.load_eval_rows` reads) every item gets training's system prompt and response
prefix, and `score` gives per task type data.exact_match on the `<answer>` span, its `contains` variant and the
share of outputs that rewards.format_reward accepts. With `--suite NAME` (suites.py) the file is read, prompted and
scored by the official rules, with the config's system prompt indented four spaces as in the official scripts
(`--no-indent-system-prompt` turns that off), and no item dropped for its length; `--predictions FILE` re-scores
this mode's `.predictions.jsonl` or an official result file (`read_predictions`). For a file of more than 100 items
the report adds suites.official_last_printed, the figure the official scripts would last have printed.

Generation is greedy; `--sample` samples with the model's generation_config.json (Hugging Face's defaults for what it
leaves out) and the config's seed. The official runs sample unseeded in fp16, one prompt at a time; we batch in vLLM
in the dtype a checkpoint was trained in (its run's run_config.json), else the config's. A LoRA checkpoint runs as
training's rollout engine ran it, whatever machine evaluates it (`adapter_rank`, from its run's record: how its
pushes were made, else its `lora_push`, dtype and whether it ran CUDA's vLLM or the CPU's): where the run pushed
the adapter (by default on a GPU outside float32) as its base with the adapter applied by vLLM (W + s·B·A rounded
to bfloat16 would lose every update entry below half a step of W), on a CPU too, where vLLM's LoRA kernels are
slower; where it pushed merged weights (by default on a CPU, or in float32) as the adapter merged into its base in
float32, loaded at that dtype, on a GPU too.
Results go to OUTPUT_DIR/eval/<name>.json, with every prediction in <name>.predictions.jsonl beside it.
"""

from __future__ import annotations

from plumbing import runtime  # noqa: I001  (first: it sets the thread count and vLLM's mode before torch and vLLM load)

import contextlib
import dataclasses
import json
import tempfile
import warnings
from collections import defaultdict
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import torch

import data
from evaluation import loaders, suites
from rewards import format_reward

# Hugging Face's `generate` defaults for the sampling settings a generation_config.json leaves out.
HF_SAMPLING_DEFAULTS = {"do_sample": False, "temperature": 1.0, "top_p": 1.0, "top_k": 50, "min_p": None,
                        "repetition_penalty": 1.0}


def item_scores(rows: list[dict], outputs: list[str]) -> list[dict[str, bool]]:
    """Each output's em, contains and format (the module docstring's), in the rows' order."""
    formats = format_reward([[{"role": "assistant", "content": text}] for text in outputs])
    items = []
    for row, text, fmt in zip(rows, outputs, formats):
        answer, gold = data.answer_span(text), data.answer_span(row["solution"])
        items.append({"em": data.exact_match(answer, gold), "contains": data.exact_match(answer, gold, contains=True),
                      "format": fmt == 1.0})
    return items


def score(rows: list[dict], outputs: list[str]) -> dict:
    """n, em, contains and format_rate per task type and "overall"; `outputs` are the full texts (prefix included)."""
    groups: dict[str, list[dict[str, bool]]] = defaultdict(list)
    for row, item in zip(rows, item_scores(rows, outputs)):
        for group in (row.get("task", "all"), "overall"):
            groups[group].append(item)
    return {group: {"n": len(items), "em": sum(i["em"] for i in items) / len(items),
                    "contains": sum(i["contains"] for i in items) / len(items),
                    "format_rate": sum(i["format"] for i in items) / len(items)}
            for group, items in sorted(groups.items(), key=lambda kv: (kv[0] == "overall", kv[0]))}


def sampling_settings(model: str, sample: bool) -> dict[str, Any]:
    """vLLM sampling settings: greedy, or (sample=True) the model's generation_config.json with HF's defaults;
    a config without `do_sample: true` decodes greedily, as under `model.generate`."""
    if not sample:
        return {"temperature": 0.0}
    path = Path(model) / "generation_config.json"
    own = json.loads(path.read_text()) if path.exists() else {}
    gen = {key: own.get(key) if own.get(key) is not None else default for key, default in HF_SAMPLING_DEFAULTS.items()}
    if not gen["do_sample"]:
        return {"temperature": 0.0}
    return {"temperature": float(gen["temperature"]), "top_p": float(gen["top_p"]), "top_k": int(gen["top_k"] or 0),
            "min_p": float(gen["min_p"] or 0.0), "repetition_penalty": float(gen["repetition_penalty"])}


def generate(cfg, model: str, prompt_ids: list[list[int]], settings: dict[str, Any], max_model_len: int,
             max_tokens: int) -> list[str]:
    """One answer per prompt (at most `max_tokens` new tokens), the config's response prefix put back in front, from
    vLLM on `model` as training's rollout engine held it: a LoRA checkpoint's base with its adapter applied where
    training pushed the adapter (`adapter_rank`), else its float32 merge, beside it for as long as the engine runs."""
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt
    from vllm.lora.request import LoRARequest

    import rollout

    runtime.single_process_defaults()
    dtype = evaluation_dtype(cfg, model)
    source = lora_checkpoint(model)
    rank = adapter_rank(cfg, source[1], dtype, cuda=torch.cuda.is_available()) if source else 0
    merge = source if source and not rank else None
    with tempfile.TemporaryDirectory(dir=Path(model).parent) if merge else contextlib.nullcontext() as work:
        if merge:
            runtime.exit_on_sigterm()  # the merge (2.4 GB for the default's model) is removed on SIGTERM too
            model = str(Path(work) / "merged")
            print(f"merging {merge[1]} into {merge[0]} in float32 for the evaluation")
            merge_in_float32(*merge, Path(model))
        llm = rollout.make_engine(source[0] if rank else model, dtype=str(dtype).removeprefix("torch."), seed=cfg.seed,
                                  max_model_len=max_model_len, gpu_memory_utilization=cfg.vllm_gpu_memory_utilization,
                                  enable_sleep_mode=False, cpu_kv_cache_gib=cfg.vllm_cpu_kv_cache_gib, lora_rank=rank)
        params = SamplingParams(n=1, max_tokens=max_tokens, seed=cfg.seed, **settings)
        results = llm.generate([TokensPrompt(prompt_token_ids=ids) for ids in prompt_ids], params, use_tqdm=True,
                               lora_request=LoRARequest("policy", 1, source[1]) if rank else None)
    return [cfg.response_prefix + r.outputs[0].text for r in results]


def adapter_rank(cfg, adapter: str, dtype: torch.dtype, *, cuda: bool) -> int:
    """The adapter's rank where vLLM applies it to the base, as training's rollout engine did; 0 where its float32
    merge runs, as merged pushes do. The run that wrote it decides, not the machine that evaluates it: its
    run_config.json's "pushes" (metrics.write_run_info), else Config.pushes_adapter at the adapter's rank, with the
    run's `lora_push` and dtype, on the device its vLLM ran on (the `vllm` distribution in its versions is CUDA's,
    `vllm-cpu` the CPU's). What the record lacks, `cfg`, `dtype` and `cuda` (this machine's) give."""
    rank = json.loads((Path(adapter) / "adapter_config.json").read_text())["r"]
    trained = run_config(adapter)
    vllms = {"vllm", "vllm-cpu"} & set(trained.get("versions", {}))
    cuda = "vllm" in vllms if len(vllms) == 1 else cuda
    lora_push = trained.get("config", {}).get("lora_push", cfg.lora_push)
    dtype = getattr(torch, trained["dtype"]) if "dtype" in trained else dtype
    pushed = dataclasses.replace(cfg, lora_rank=rank, lora_push=lora_push).pushes_adapter(dtype, cuda=cuda)
    return rank if trained.get("pushes", "adapter" if pushed else "merged") == "adapter" else 0


def run_config(folder: str | Path) -> dict:
    """The run_config.json of the training run that wrote a checkpoint's `policy/` or `adapter/` folder
    (RUN/checkpoints/step-N/policy → RUN/run_config.json); {} for any other folder."""
    folder = Path(folder)
    path = folder.parent.parent.parent / "run_config.json"
    return json.loads(path.read_text()) if folder.name in ("policy", "adapter") and path.exists() else {}


def evaluation_dtype(cfg, model: str) -> torch.dtype:
    """The dtype `model` was trained and sampled in, where it is a checkpoint with its run's run_config.json; else
    the config's `dtype` as it resolves on this machine."""
    trained = run_config(model)
    return getattr(torch, trained["dtype"]) if "dtype" in trained else runtime.resolve_dtype(cfg.dtype)


def lora_checkpoint(model: str) -> tuple[str, str] | None:
    """(base model folder, adapter folder) when `model` is a LoRA run's `policy/` with `adapter/` beside it, else
    None. That `policy/` is merged in the training dtype: in bfloat16 it lost the entries of s·B·A below W's step."""
    adapter = Path(model).parent / "adapter"
    if Path(model).name != "policy" or not (adapter / "adapter_config.json").exists():
        return None
    base = json.loads((adapter / "adapter_config.json").read_text())["base_model_name_or_path"]
    _check_model(base)
    return base, str(adapter)


def merge_in_float32(base: str, adapter: str, target: Path) -> None:
    """Write the adapter merged into its base (W + s·B·A, in float32) and the base's tokenizer to `target`."""
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32)
    PeftModel.from_pretrained(model, adapter).merge_and_unload().save_pretrained(target)
    AutoTokenizer.from_pretrained(base).save_pretrained(target)


def _tokenizer_and_style(cfg, model: str, indent_system_prompt: bool | None) -> tuple[Any, dict[str, str]]:
    from transformers import AutoTokenizer

    _check_model(model)
    style = cfg.prompt_style()
    if indent_system_prompt:
        style["system_prompt"] = suites.indent_system_prompt(style["system_prompt"])
    return AutoTokenizer.from_pretrained(model), style


def _check_model(model: str) -> None:
    if not (Path(model) / "config.json").exists():
        raise SystemExit(f"error: model path {model!r} is not a Hugging Face model folder")


def _run_name(model: str) -> str:
    return Path(model).name if Path(model).name != "policy" else Path(model).parent.name


def _write(cfg, name: str, report: dict, predictions: Iterable[dict]) -> None:
    out = Path(cfg.output_dir) / "eval"
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{name}.json").write_text(json.dumps(report, indent=1))
    with open(out / f"{name}.predictions.jsonl", "w") as f:
        for prediction in predictions:
            f.write(json.dumps(prediction) + "\n")
    print(f"written to {out / (name + '.json')}")


def main(cfg, *, model: str | None, eval_file: str | None, limit: int = 0, suite: str | None = None,
         predictions: str | None = None, sample: bool = False, indent_system_prompt: bool | None = None) -> dict:
    """The `--eval` mode: the synthetic evaluation, or (with `suite`) a paper benchmark. Returns the scores."""
    if suite is not None:
        return run_suite(cfg, suite, eval_file=eval_file, model=model, predictions=predictions, sample=sample,
                         limit=limit, indent_system_prompt=indent_system_prompt is not False)  # None: on
    if predictions is not None:
        raise SystemExit("error: --predictions scores a benchmark's outputs: give its --suite too")
    model = model or cfg.model
    eval_file = eval_file or cfg.eval_file
    tokenizer, style = _tokenizer_and_style(cfg, model, indent_system_prompt)
    rows = loaders.load_eval_rows(eval_file)[: limit or None]
    rows, report = data.prepare_prompts(tokenizer, rows, cfg.max_prompt_tokens, cfg.on_long_prompt, **style)
    print(f"eval data: {eval_file}: {report.summary()}")
    outputs = generate(cfg, model, [r["prompt_ids"] for r in rows], sampling_settings(model, sample),
                       cfg.max_prompt_tokens + cfg.max_completion_tokens, cfg.max_completion_tokens)
    scores = score(rows, outputs)

    print(f"\n{'task':<16}{'n':>6}{'EM':>8}{'contains':>10}{'format':>8}")
    for group, s in scores.items():
        print(f"{group:<16}{s['n']:>6}{s['em']:>8.3f}{s['contains']:>10.3f}{s['format_rate']:>8.3f}")
    _write(cfg, f"{_run_name(model)}-{Path(eval_file).stem}",
           {"model": model, "eval_file": eval_file, "scores": scores},
           ({"id": row.get("id"), "task": row.get("task"), "solution": row["solution"], "output": text}
            for row, text in zip(rows, outputs)))
    return scores


class UnpairedPredictionsWarning(UserWarning):
    """Some predictions name no question, so nothing checks that they are paired with the right items."""


def _extracted(output: str) -> dict[str, str]:
    think, long_answer, answer = suites.extract(output).values()
    return {"output": output, "think": think, "long_answer": long_answer, "pred": answer}


def read_predictions(path: str | Path, items: list[suites.Item]) -> list[dict[str, str]]:
    """The `think`, `long_answer` and `pred` (the answer) of every item, from a predictions file; DataError if bad.

    A file starting with "[" is an official result file, whose `pred` is used as it is; any other is the JSONL
    `--eval --suite` writes, whose `output` is extracted again. The i-th prediction is scored against the i-th item;
    a record's `question`, where given, must be the item's (without one: one UnpairedPredictionsWarning per file).
    """
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8-sig")
    except FileNotFoundError:
        raise data.DataError(f"{path}: predictions file not found") from None
    except UnicodeDecodeError:
        raise data.DataError(f"{path}: not valid UTF-8") from None
    official = text.lstrip().startswith("[")
    if official:
        try:
            records = json.loads(text)
        except json.JSONDecodeError as err:
            raise data.DataError(f"{path}:{err.lineno}:{err.colno}: not valid JSON ({err.msg})") from None
    else:
        records = _jsonl_values(path, text)
    if len(records) != len(items):
        raise data.DataError(f"{path}: {len(records)} predictions for {len(items)} items; every item must be scored "
                             "(with --limit N, the first N items)")
    field = "pred" if official else "output"
    found = []
    for item, record in zip(items, records):
        where = f"{path}: prediction {item.index}"
        if not isinstance(record, dict) or not isinstance(record.get(field), str):
            raise data.DataError(f"{where}: no {field!r} string")
        if "question" in record and record["question"] != item.question:
            raise data.DataError(f"{where}: its question {record['question']!r} is not the item's {item.question!r}")
        found.append({"think": record.get("think"), "long_answer": record.get("long_answer"), "pred": record["pred"]}
                     if official else _extracted(record["output"]))
    missing = sum("question" not in record for record in records)
    if missing:
        warnings.warn(f"{path}: {missing} of {len(records)} predictions have no 'question' field, so they are paired "
                      "with the items by position alone, unchecked: the i-th prediction is scored against the i-th "
                      "item of --eval-file. Add a 'question' field to each (as `--eval --suite` writes it) to have "
                      "the pairing checked", UnpairedPredictionsWarning, stacklevel=2)
    return found


def _jsonl_values(path: Path, text: str) -> list[Any]:
    # Lines end at "\n" only (a "\r" before it dropped): str.splitlines would also cut inside JSON strings holding
    # U+2028, U+2029 or U+0085. Blank lines are allowed only after the last record, as in data.load_jsonl.
    lines = [line.removesuffix("\r") for line in text.split("\n")]
    while lines and not lines[-1].strip():
        lines.pop()
    values = []
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            raise data.DataError(f"{path}:{number}: blank line (blank lines are allowed only at the end of the file)")
        try:
            values.append(json.loads(line))
        except json.JSONDecodeError as err:
            raise data.DataError(f"{path}:{number}:{err.colno}: not valid JSON ({err.msg})") from None
    return values


def suite_table(suite: str, file: str, scores: dict, last_printed: dict | None = None) -> str:
    """The printed table: the suite's scores in percent over every item, after `answer` (suites.answer_share, "-"
    when the outputs are unknown); with `last_printed`, a second row with the official script's last figure."""
    metrics = suites.METRICS[suite]
    head = f"{'suite':<11}{'file':<28}{'n':>6}{'answer':>8}" + "".join(f"{m:>10}" for m in metrics)
    answer = f"{scores['answer']:>8.3f}" if scores.get("answer") is not None else f"{'-':>8}"
    row = f"{suite:<11}{Path(file).stem[:27]:<28}{scores['n']:>6}{answer}" + "".join(
        f"{scores[m]:>10.2f}" for m in metrics)
    if last_printed is None:
        return f"{head}\n{row}"
    m = last_printed["items"]
    official = f"{'':<11}{'official, last printed':<28}{m:>6}{'':>8}" + "".join(
        f"{last_printed['scores'][name]:>10.2f}" for name in metrics)
    every = suites.OFFICIAL_PRINT_EVERY
    note = (f"; {m} is a multiple of {every}, so its last figure covers every item too)" if m == scores["n"] else
            f": its last figure covers the first {m} of {scores['n']} items; the first row covers every item)")
    return f"{head}\n{row}\n{official}\n(the official script prints every {every} items the score so far{note}"


def _answer_suite(cfg, suite: str, items: list[suites.Item], eval_file: str, model: str, sample: bool,
                  indent_system_prompt: bool) -> tuple[list[dict[str, str]], dict]:
    """Every item answered by `model`, extracted; and the report's description of how."""
    tokenizer, style = _tokenizer_and_style(cfg, model, indent_system_prompt)
    # No limit: every item is scored, so the engine is sized for the longest prompt instead.
    rows, report = data.prepare_prompts(tokenizer, [{"problem": item.problem} for item in items], 10**9, **style)
    print(f"{suite}: {eval_file}: {len(items)} items; prompt tokens min {report.min_tokens}, "
          f"mean {report.mean_tokens:.1f}, max {report.max_tokens}")
    settings = sampling_settings(model, sample)
    # suite_max_tokens (the official evaluation's 1024 by default), not max_completion_tokens: a policy that
    # reasons at length must not lose its <answer> span to our cut.
    outputs = generate(cfg, model, [r["prompt_ids"] for r in rows], settings,
                       report.max_tokens + cfg.suite_max_tokens, cfg.suite_max_tokens)
    source = {"model": model, "sampling": settings, "max_new_tokens": cfg.suite_max_tokens, "seed": cfg.seed,
              "dtype": str(evaluation_dtype(cfg, model)).removeprefix("torch."),
              "system_prompt_indented": indent_system_prompt}
    return [_extracted(output) for output in outputs], source


def run_suite(cfg, suite: str, *, eval_file: str | None, model: str | None, predictions: str | None,
              sample: bool, limit: int, indent_system_prompt: bool) -> dict:
    """Read a benchmark file, answer every item (or read the answers), score by the official rules, write."""
    if eval_file is None:
        raise SystemExit(f"error: --suite {suite} needs the benchmark file: --eval-file PATH")
    items = suites.read_suite(suite, eval_file)[: limit or None]
    if predictions is not None:
        found = read_predictions(predictions, items)
        source = {"predictions": str(predictions)}
        name = f"{Path(predictions).stem}-{suite}"
    else:
        model = model or cfg.model
        found, source = _answer_suite(cfg, suite, items, eval_file, model, sample, indent_system_prompt)
        name = f"{_run_name(model)}-{suite}-{Path(eval_file).stem}"
    preds = [f["pred"] for f in found]
    scores = suites.score(suite, items, preds)
    outputs = [f.get("output") for f in found]
    # Not an official score: whether the format held (an official result file has no outputs, only `pred`).
    scores["answer"] = suites.answer_share(outputs) if all(isinstance(o, str) for o in outputs) else None
    last_printed = suites.official_last_printed(suite, items, preds)

    print("\n" + suite_table(suite, eval_file, scores, last_printed))
    report = {"suite": suite, "eval_file": str(eval_file), **source, "scores": scores}
    if last_printed is not None:
        report["official_last_printed"] = last_printed
    _write(cfg, name, report, ({"index": item.index, "id": item.id, "question": item.question, **pred,
                                "golds": list(item.golds), **suites.item_hits(suite, item, pred["pred"])}
                               for item, pred in zip(items, found)))
    return scores
