"""End-to-end training on the CPU, with the smoke recipe.

Each test runs canoe.py for real (vLLM rollouts, rewards, loss, ZeRO updates, weight push), under the `deepspeed`
launcher where the launch is part of what is tested (ranks, checkpoints and resumption) and as `python canoe.py`
elsewhere, on the tiny format-taught model that `make setup` writes to models/smoke-llama, on prompts that model
knows how to answer (so stage 2 has long answers to work with and rewards differ inside a group).
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from conftest import SMOKE_MODEL

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "scripts"))

from config import Config  # noqa: E402
from prepare_models import SMOKE_ANSWERS  # noqa: E402
from test_console import check_quiet_console  # noqa: E402
from test_repository import PACKAGES  # noqa: E402

pytestmark = pytest.mark.skipif(not SMOKE_MODEL.exists(), reason="run `make setup` first (makes models/smoke-llama)")


@pytest.fixture(scope="module")
def smoke_data(tmp_path_factory) -> Path:
    """Prompts shaped like the ones the smoke model was taught on, with answers among the ones it writes."""
    path = tmp_path_factory.mktemp("data") / "smoke.jsonl"
    rows = []
    for i in range(8):
        answer = SMOKE_ANSWERS[i % len(SMOKE_ANSWERS)]
        rows.append({"id": f"smoke-{i}", "problem": f"<context>{answer} is mentioned here.</context>\n\nWhich city? ({i})",
                     "solution": f"<answer>{answer}</answer>"})
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def write_config(tmp_path: Path, data: Path, **overrides) -> Path:
    """The smoke recipe with `overrides`, written back as TOML (plain keys first, then tables such as [rewards]).

    The dtype is float32 unless a test says otherwise: "auto" would make the run, and what it may be held to,
    depend on the machine's CPU (test_auto_dtype_runs_end_to_end_either_way fakes both resolutions).
    """
    settings = {**tomllib.loads((ROOT / "recipes" / "smoke.toml").read_text()), "dtype": "float32",
                "train_file": str(data), "output_dir": str(tmp_path / "run"), **overrides}
    plain = [f"{key} = {json.dumps(value)}" for key, value in settings.items() if not isinstance(value, dict)]
    tables = [f"[{key}]\n" + "".join(f"{k} = {json.dumps(v)}\n" for k, v in value.items())
              for key, value in settings.items() if isinstance(value, dict)]
    path = tmp_path / "config.toml"
    path.write_text("\n".join(plain) + "\n" + "".join(tables))
    return path


def free_port() -> int:
    """A port no process listens on now, for a launch's rendezvous."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch(config: Path, ranks: int = 1, *args: str, fault: str | None = None, expect_ok: bool = True,
           root: Path = ROOT, launcher: bool = True):
    """`deepspeed canoe.py --config config` (with `fault`: tests/faults.py, which patches that fault in). Without
    `launcher`, `python canoe.py` (a world of one, which canoe.py supports): for the tests about the driver's own
    behaviour, which the launcher's start-up (seconds of imports) would only slow down."""
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    script = [str(root / "canoe.py")] if fault is None else [str(ROOT / "tests" / "faults.py"), "--fault", fault]
    port = free_port()
    if launcher:
        command = [str(ROOT / ".venv" / "bin" / "deepspeed"), "--num_gpus", str(ranks),
                   "--master_port", str(port), *script, "--config", str(config), *args]
    else:
        assert ranks == 1, "only the launcher starts several ranks"
        env["MASTER_PORT"] = str(port)
        command = [str(ROOT / ".venv" / "bin" / "python"), *script, "--config", str(config), *args]
    result = subprocess.run(command, cwd=root, env=env, capture_output=True, text=True, timeout=900)
    if expect_ok and result.returncode != 0:
        raise AssertionError(f"training failed ({result.returncode}):\n{result.stdout[-6000:]}\n{result.stderr[-6000:]}")
    # every run, ended or killed, leaves its ranks' DeepSpeed all-reduce buffers out of /dev/shm (runtime.unlink_shm_buffer)
    assert not list(Path("/dev/shm").glob(f"deepspeed_allreduce_buffer_*_{port}_*"))
    return result


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def policy_weights(run: Path, step: int | None = None) -> dict[str, torch.Tensor]:
    checkpoints = run / "checkpoints"
    name = f"step-{step:06d}" if step else (checkpoints / "latest").read_text().strip()
    return load_file(checkpoints / name / "policy" / "model.safetensors")


def run_dtype(run: Path) -> torch.dtype:
    """The dtype the run resolved its config's `dtype` to (run_config.json)."""
    return getattr(torch, json.loads((run / "run_config.json").read_text())["dtype"])


def push_tolerance(run: Path) -> float:
    """The probe tolerance the trainer held this run to: Config.push_tolerance of its own config and dtype."""
    settings = json.loads((run / "run_config.json").read_text())["config"]
    return Config(sync_tolerance=settings["sync_tolerance"]).push_tolerance(run_dtype(run))


# The mean |vLLM − trainer| log-probability of the sampled tokens that each dtype's kernels leave on the smoke model,
# measured on the 2-core AMX machine (float32 3.6-3.8e-5 nats a token, bfloat16 0.7-1.0e-3), times about 10; a
# sampler that is not the trained policy (another temperature, stale weights) misses by far more.
VLLM_TRAINER_GAP = {torch.float32: 4e-4, torch.bfloat16: 1e-2}


def check_run(run: Path, steps: int) -> None:
    metrics = read_jsonl(run / "metrics.jsonl")
    assert [m["step"] for m in metrics] == list(range(1, steps + 1))
    tolerance = push_tolerance(run)
    for m in metrics:
        # every push was verified, and within the run's tolerance (a failed check stops the run)
        assert 0.0 <= m["sync/push_max_abs_diff"] <= tolerance
        # the trainer's packed scoring of the sampled tokens agrees with the log-probs vLLM sampled them with
        assert 0.0 < m["sync/vllm_trainer_gap"] <= VLLM_TRAINER_GAP[run_dtype(run)]
        for key in ("reward/accuracy", "reward/format", "reward/influence", "reward/length", "loss/kl", "time/stage1"):
            assert key in m
        # the driver hands the rewards well-formed completions (lists of messages with string contents), so no
        # sample was scored 0 for a malformed input
        assert m["reward/issues"] == 0
    assert sum(m["stage2/regenerated_frac"] for m in metrics) > 0
    # weights changed
    before = load_file(SMOKE_MODEL / "model.safetensors")
    after = policy_weights(run)
    changed = [k for k in before if not torch.equal(before[k], after[k].to(before[k].dtype))]
    assert changed, "no parameter changed"
    # stage-2 prompts are the stage-1 problems with the long answer literally in place of the context
    samples = read_jsonl(run / "samples.jsonl")
    regenerated = [s for s in samples if s["stage2_problem"] is not None]
    assert regenerated
    for s in regenerated:
        long_answer = s["completion"].split("<long_answer>", 1)[1].split("</long_answer>", 1)[0].strip()
        question = s["problem"].split("</context>", 1)[1]
        assert s["stage2_problem"] == f"<context>{long_answer}</context>{question}"
    for s in samples:
        if "<long_answer>" not in s["completion"] or "</long_answer>" not in s["completion"]:
            assert s["stage2_problem"] is None and s["stage2_completion"] is None


# The uninterrupted runs that several tests read (trained once each), one rank, ZeRO-2, 4 steps with a checkpoint
# every 2: full fine-tuning (CANOE's step, no variant), the same with dynamic sampling (its step 2 draws again), and
# LoRA. test_resume_reproduces_uninterrupted_run interrupts the last two, so a resumed run must redraw as it did.
STRAIGHT = {"full": {"max_steps": 4, "save_every": 2, "tensorboard": True},
            "dynamic": {"max_steps": 4, "save_every": 2, "dynamic_sampling_draws": 2},
            "lora": {"max_steps": 4, "save_every": 2, "lora_rank": 8, "lora_alpha": 16.0}}


@pytest.fixture(scope="module")
def straight_runs(tmp_path_factory, smoke_data):
    """Each STRAIGHT run, launched on first use: {name: (its folder, the launcher's CompletedProcess)}."""
    runs = {}

    def get(name: str) -> tuple[Path, subprocess.CompletedProcess]:
        if name not in runs:
            folder = tmp_path_factory.mktemp(f"straight-{name}")
            runs[name] = folder, launch(write_config(folder, smoke_data, **STRAIGHT[name]), 1)
        return runs[name]
    return get


def test_one_rank_zero2(straight_runs):
    folder, result = straight_runs("full")
    check_run(folder / "run", 4)
    check_quiet_console(result, folder / "run", steps=4)  # vLLM's log in run/vllm.log, not on the console
    info = json.loads((folder / "run" / "run_config.json").read_text())
    assert info["config"]["zero_stage"] == 2 and "deepspeed" in info["versions"]
    assert list((folder / "run" / "tensorboard").glob("events.out.tfevents.*"))
    # CANOE's step meets no variant: nothing of dynamic sampling is drawn or logged
    assert not [key for m in read_jsonl(folder / "run" / "metrics.jsonl") for key in m if key.startswith("rollout/")]



def test_the_step_page_shows_the_numbers_training_used(straight_runs, tmp_path):
    """`make explain`'s page (training/explain.py) of the full run's steps 1 and 3: its loss is the logged one, its
    advantages are the README's equation on its own rewards, and its log-probabilities are
    `plain_completion_logprobs` on its own tokens (π_θ at step 1 and π_ref the base model; π_θ at step 3 the
    step-2 checkpoint's policy, saved after the second update)."""
    from transformers import AutoModelForCausalLM

    from grpo_loss import plain_completion_logprobs
    from training.explain import write_page

    run = straight_runs("full")[0] / "run"
    base = AutoModelForCausalLM.from_pretrained(SMOKE_MODEL, dtype=torch.float32).eval()
    after_two = AutoModelForCausalLM.from_pretrained(run / "checkpoints" / "step-000002" / "policy",
                                                     dtype=torch.float32).eval()
    logged = {m["step"]: m for m in read_jsonl(run / "metrics.jsonl")}
    for step, policy in ((1, base), (3, after_two)):
        page, numbers = write_page(run, step, tmp_path)
        text, trace = page.read_text(), json.loads(numbers.read_text())
        assert "<script" not in text and "<link" not in text and 'id="loss"' in text  # one file, nothing fetched
        assert len(trace["completions"]) == 4 and len(trace["passes"]) == 1  # G = 4, μ = 1
        # 1. the loss, added up from the page's per-token ℓ and the other micro-batch's loss, is the logged one
        assert trace["derived"]["rank_loss"] == pytest.approx(logged[step]["loss/loss"], rel=1e-5, abs=1e-7)
        assert f"{logged[step]['loss/loss']:.6f}" in text
        # the rate of that update: the schedule's value that the previous step logged (constant 1e-3 here)
        assert trace["passes"][0]["lr"] == pytest.approx(1e-3)
        # 2. A_i = (r_i − mean) / (std + 1e-4) over the group, unbiased std, r_i the weighted sum of the four rewards
        weights = trace["reward_weights"]
        rewards = [sum(weights[k] * c["scores"][k] for k in weights) for c in trace["completions"]]
        mean = sum(rewards) / 4
        std = (sum((r - mean) ** 2 for r in rewards) / 3) ** 0.5
        expected = [0.0 if std == 0 else (r - mean) / (std + 1e-4) for r in rewards]
        assert [c["advantage"] for c in trace["completions"]] == pytest.approx(expected, abs=1e-5)
        assert [c["reward"] for c in trace["completions"]] == pytest.approx(rewards)
        # 3. log π_θ and log π_ref of each sampled token, recomputed one sequence at a time
        prompts = [trace["prompt"]["token_ids"]] * 4
        tokens = [c["token_ids"] for c in trace["completions"]]
        with torch.no_grad():
            tau = trace["config"]["temperature"]
            theta = plain_completion_logprobs(policy, prompts, tokens, temperature=tau)
            ref = plain_completion_logprobs(base, prompts, tokens, temperature=tau)
        # float32 kernels' rounding is a few 1e-6 here; another policy or temperature misses by 0.8 or more
        for i, completion in enumerate(tokens):
            n = len(completion)
            torch.testing.assert_close(torch.tensor(trace["passes"][0]["logprobs"][i]), theta[i, :n],
                                       atol=2e-5, rtol=0, msg=f"step {step}: log π_θ of completion {i}")
            torch.testing.assert_close(torch.tensor(trace["micro_batch"]["ref"][i]), ref[i, :n], atol=2e-5, rtol=0,
                                       msg=f"step {step}: log π_ref of completion {i} is not the frozen base model's")
        if step == 3:  # two updates on, π_θ has left π_ref, and ℓ = −A + β·k3 with μ = 1 (ρ = 1), k3 recomputed
            largest = 0.0
            for i, c in enumerate(trace["completions"]):
                n = len(c["token_ids"])
                x = ref[i, :n] - theta[i, :n]
                k3 = torch.exp(x) - x - 1
                loss = torch.tensor(trace["passes"][0]["token_loss"][i])
                torch.testing.assert_close(loss, -c["advantage"] + 0.04 * k3, atol=2e-5, rtol=0,
                                           msg=f"the KL does not enter ℓ with β (completion {i})")
                largest = max(largest, float(0.04 * k3.max()))
            assert largest > 1e-2, f"β·KL is at most {largest}: π_θ is still π_ref, so this check could not fail"


def test_a_dapo_mask_keeps_truncated_completions_out_of_the_loss(tmp_path, smoke_data):
    """DAPO's `mask_truncated` in a real run, read from its trace: a completion cut off by the token limit has no
    trained token and a token loss of 0 (so it adds nothing to the gradient), the finished ones are trained, and
    the logged loss is the sum over the trained tokens alone."""
    from training.explain import write_page

    config = write_config(tmp_path, smoke_data, max_steps=3, mask_truncated=True, max_completion_tokens=35)
    launch(config, 1)
    run, seen = tmp_path / "run", {"length": 0, "stop": 0}
    for step in (1, 2, 3):
        trace = json.loads(write_page(run, step, tmp_path / "page")[1].read_text())
        for i, c in enumerate(trace["completions"]):
            seen[c["finish_reason"]] += 1
            mask, losses = trace["micro_batch"]["mask"][i], trace["passes"][0]["token_loss"][i]
            if c["finish_reason"] == "length":
                assert not c["kept"] and not any(mask), f"step {step}: truncated completion {i} was trained"
                assert not any(losses), f"step {step}: truncated completion {i} has a token loss"
            else:
                assert c["kept"] and all(mask), f"step {step}: finished completion {i} was not trained"
        logged = read_jsonl(run / "metrics.jsonl")[step - 1]["loss/loss"]
        assert trace["derived"]["rank_loss"] == pytest.approx(logged, rel=1e-5, abs=1e-7)
    assert seen["length"] and seen["stop"], f"the check needs both kinds of completion: {seen}"

def test_dynamic_sampling_draws_again_and_the_sampler_counts_every_draw(straight_runs):
    folder, _ = straight_runs("dynamic")
    metrics = read_jsonl(folder / "run" / "metrics.jsonl")
    draws, replaced = (sum(m[key] for m in metrics) for key in ("rollout/extra_draws", "rollout/replaced_groups"))
    assert draws > 0 and 0 < replaced <= 2 * draws  # 2 prompts a step (smoke.toml: 1 × 2 accumulation steps)
    state = json.loads((folder / "run" / "checkpoints" / "step-000004" / "trainer_state.json").read_text())["sampler"]
    per_epoch = state["num_rows"] // state["global_batch_size"]
    assert state["epoch"] * per_epoch + state["position"] == 4 + draws  # a batch per step, one per extra draw


# Two ranks under ZeRO-2: test_multinode.py's run, which makes the same checks.
@pytest.mark.parametrize("stage, lora_rank", [(3, 0), (3, 8)], ids=["zero3", "zero3-lora"])
def test_two_ranks(tmp_path, smoke_data, stage, lora_rank):
    config = write_config(tmp_path, smoke_data, max_steps=2, zero_stage=stage, lora_rank=lora_rank)
    launch(config, 2, fault="record_prompts")
    check_run(tmp_path / "run", 2)
    check_ranks_drew_apart(tmp_path / "run", ranks=2, steps=2)


def check_ranks_drew_apart(run: Path, ranks: int, steps: int) -> None:
    """Each rank trained on prompts of its own at every step (tests/faults.py's record_prompts, every rank's batch),
    2 prompts each (smoke.toml: 1 × 2 accumulation steps); rank 0's are the ones samples.jsonl holds."""
    drawn = [read_jsonl(run / f"prompts-rank-{rank}.jsonl") for rank in range(ranks)]
    for step in range(1, steps + 1):
        batches = [next(line["problems"] for line in lines if line["step"] == step) for lines in drawn]
        assert all(len(set(batch)) == 2 for batch in batches)
        assert len(set().union(*batches)) == 2 * ranks, batches  # no prompt on two ranks
        assert {s["problem"] for s in read_jsonl(run / "samples.jsonl") if s["step"] == step} == set(batches[0])


# How each STRAIGHT run is interrupted before it is resumed and compared with the uninterrupted one (tests/faults.py):
# the LoRA run dies right after checkpoint 2 is published, the full run while checkpoint 4 is being written, so that
# its latest complete checkpoint is step 2's.
INTERRUPTIONS = {"dynamic": "mid_checkpoint_4", "lora": "after_step_2"}


@pytest.fixture(scope="module")
def resumed_runs(tmp_path_factory, smoke_data):
    """Each STRAIGHT run launched again, killed by its INTERRUPTIONS fault and resumed, on first use: {name: (its
    folder, what the crash left)}; what the crash left: the launcher's exit code, the `latest` pointer, the
    checkpoint folders, and a copy of the latest checkpoint's policy folder as it was before the resume."""
    runs = {}

    def get(name: str) -> tuple[Path, dict]:
        if name not in runs:
            folder = tmp_path_factory.mktemp(f"resumed-{name}")
            config = write_config(folder, smoke_data, **STRAIGHT[name])
            stopped = launch(config, 1, fault=INTERRUPTIONS[name], expect_ok=False)
            checkpoints = folder / "run" / "checkpoints"
            latest = (checkpoints / "latest").read_text().strip()
            left = {"returncode": stopped.returncode, "latest": latest,
                    "folders": sorted(path.name for path in checkpoints.iterdir() if path.is_dir()),
                    "policy": shutil.copytree(checkpoints / latest / "policy", folder / "policy-at-crash")}
            launch(config, 1, "--resume")
            runs[name] = folder, left
        return runs[name]
    return get


@pytest.mark.parametrize("name", ["dynamic", "lora"])
def test_resume_reproduces_uninterrupted_run(straight_runs, resumed_runs, name):
    straight, _ = straight_runs(name)
    resumed, left = resumed_runs(name)
    assert left["returncode"] != 0 and left["latest"] == "step-000002"

    a, b = read_jsonl(straight / "run" / "samples.jsonl"), read_jsonl(resumed / "run" / "samples.jsonl")
    assert [(s["step"], s["problem"], s["completion"]) for s in a] == [(s["step"], s["problem"], s["completion"]) for s in b]
    wa, wb = policy_weights(straight / "run"), policy_weights(resumed / "run")
    for key in wa:  # same data, same samples, same optimizer state: equal to float32 round-off
        torch.testing.assert_close(wb[key], wa[key], rtol=0, atol=1e-6)
    if name == "lora":  # the adapters themselves, as PEFT saved them
        aa, ab = (load_file(run / "checkpoints" / "step-000004" / "adapter" / "adapter_model.safetensors")
                  for run in (straight / "run", resumed / "run"))
        assert aa.keys() == ab.keys() and aa
        for key in aa:
            torch.testing.assert_close(ab[key], aa[key], rtol=0, atol=1e-6)


def test_lora_one_rank_zero2(straight_runs):
    """LoRA under the launcher: the run is checked as full fine-tuning's; the checkpoint's adapter loads with PEFT
    and gives the merged policy folder's outputs; the base weights in DeepSpeed's state are left out (frozen)."""
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    folder, _ = straight_runs("lora")
    check_run(folder / "run", 4)
    final = folder / "run" / "checkpoints" / "step-000004"
    settings = json.loads((final / "adapter" / "adapter_config.json").read_text())
    assert settings["r"] == 8 and settings["lora_alpha"] == 16.0 and settings["peft_type"] == "LORA"
    ids = torch.tensor([[1, 50, 300, 7, 2000, 12]])
    with torch.no_grad():
        adapted = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(SMOKE_MODEL), final / "adapter")
        merged = AutoModelForCausalLM.from_pretrained(final / "policy")
        torch.testing.assert_close(merged(ids).logits, adapted(ids).logits, rtol=0, atol=1e-4)
    # the merged folder is the base model's format: the same tensor names and shapes, the same config (what vLLM
    # and `--eval --model` load; the crash test loads such a folder into vLLM)
    base, policy = load_file(SMOKE_MODEL / "model.safetensors"), load_file(final / "policy" / "model.safetensors")
    assert {k: v.shape for k, v in policy.items()} == {k: v.shape for k, v in base.items()}
    assert json.loads((final / "policy" / "config.json").read_text())["architectures"] == ["LlamaForCausalLM"]
    state = torch.load(final / "deepspeed" / "state" / "mp_rank_00_model_states.pt", weights_only=False)["module"]
    assert all("lora_" in key for key in state if "layers" in key)  # no frozen decoder weight is stored again


def test_crash_mid_checkpoint_leaves_previous_checkpoint_usable(resumed_runs):
    folder, left = resumed_runs("dynamic")  # died while checkpoint 4 was written (INTERRUPTIONS)
    assert left["returncode"] != 0
    assert left["latest"] == "step-000002"
    assert "step-000004.tmp" in left["folders"] and "step-000004" not in left["folders"]
    policy = left["policy"]  # the latest checkpoint's policy as the crash left it
    script = f"""
import os
os.environ.update(VLLM_ENABLE_V1_MULTIPROCESSING="0", VLLM_CPU_KVCACHE_SPACE="1")
from transformers import AutoModelForCausalLM
AutoModelForCausalLM.from_pretrained({str(policy)!r})
from vllm import LLM, SamplingParams
llm = LLM(model={str(policy)!r}, dtype="float32", enforce_eager=True, max_model_len=512)
out = llm.generate(["<|im_start|>user\\nWhich city?<|im_end|>\\n<|im_start|>assistant\\n"], SamplingParams(max_tokens=8, temperature=0))
print("GENERATED", len(out[0].outputs[0].token_ids))
"""
    done = subprocess.run([str(ROOT / ".venv" / "bin" / "python"), "-c", script], capture_output=True, text=True, timeout=600)
    assert "GENERATED" in done.stdout, done.stderr[-4000:]
    # and training resumed from it
    assert [m["step"] for m in read_jsonl(folder / "run" / "metrics.jsonl")] == [1, 2, 3, 4]


def test_failed_push_stops_the_run(tmp_path, smoke_data):
    config = write_config(tmp_path, smoke_data, max_steps=2)
    result = launch(config, 1, fault="corrupt_push", expect_ok=False, launcher=False)
    assert result.returncode != 0
    assert "weight push failed verification" in result.stdout + result.stderr


def test_nonfinite_loss_skips_steps_then_stops(tmp_path, smoke_data):
    config = write_config(tmp_path, smoke_data, max_steps=4, max_bad_steps=2)
    result = launch(config, 1, fault="nan_loss", expect_ok=False, launcher=False)
    assert result.returncode != 0
    assert "2 steps in a row had a non-finite loss" in result.stdout + result.stderr
    metrics = read_jsonl(tmp_path / "run" / "metrics.jsonl")
    assert [m["train/bad_steps_total"] for m in metrics] == [1]  # the second bad step stops before logging


def test_several_updates_per_rollout_make_the_ratio_act_and_the_schedule_count_each_update(tmp_path, smoke_data):
    # μ = 2: the second pass trains a policy that already moved, so π_θ / π_old leaves 1 and the clip can act.
    # The warm-up, ⌈0.9 × 2 steps × 2 updates⌉ = 4 updates long, gives each update its own rate, 0, 1/4, 2/4, 3/4
    # of the peak, then the peak: the rate logged after step s is (2s / 4) × peak only if every update counted.
    # (The importance weights act in test_applied_update.py, on a batch where they are far from 1.)
    config = write_config(tmp_path, smoke_data, max_steps=2, num_iterations=2, warmup_ratio=0.9)
    launch(config, 1, launcher=False)
    check_run(tmp_path / "run", 2)
    metrics = read_jsonl(tmp_path / "run" / "metrics.jsonl")
    assert any(m["reward/total_std"] > 0 for m in metrics), "no group had rewards that differ"
    assert any(m["loss/ratio_min"] < 1 or m["loss/ratio_max"] > 1 for m in metrics)
    assert [m["train/lr"] for m in metrics] == pytest.approx([1e-3 * 2 / 4, 1e-3 * 4 / 4], rel=1e-6)


def readme_example(heading: str, document: str = "README.md") -> str:
    """The Python blocks of a section of a document (docs/loss-options.md's "Adding a loss variant",
    docs/reward-ideas.md's "Adding a reward"), one after the other, as a user would copy them."""
    section = (ROOT / document).read_text().split(heading, 1)[1].split("\n## ", 1)[0]
    return "\n".join(block.split("```", 1)[0] for block in section.split("```python\n")[1:])


def fork_repository(fork: Path) -> Path:
    """A copy of the repository's code (the card's files and the packages) in `fork`, as a user's fork holds it."""
    fork.mkdir()
    for path in ROOT.glob("*.py"):
        shutil.copy(path, fork / path.name)
    for package in PACKAGES:
        shutil.copytree(ROOT / package, fork / package, ignore=shutil.ignore_patterns("__pycache__"))
    return fork


MESSAGE_REWARD = '''
def message_seen_reward(completions: list, message: list, problem: list, **kwargs) -> list[float]:
    """1.0 when this completion's `message` column is CANOE's chat for its own problem."""
    return [1.0 if m[0]["role"] == "user" and m[0]["content"] == p else 0.0 for m, p in zip(message, problem)]

REWARD_FUNCS["message_seen"] = message_seen_reward
'''


FORK_REWARDS = {"accuracy": 1.0, "format": 1.0, "influence": 1.0, "length": 1.0, "brevity": 0.5, "message_seen": 1.0}


@pytest.fixture(scope="module")
def fork_run(tmp_path_factory, smoke_data) -> Path:
    """One run of a user's fork, launched once and read by the tests below: ideas/brevity.py written from
    docs/reward-ideas.md's example as it stands (the config names it in reward_files), rewards.py with a reward that
    reads the `message` column appended; variants.py with the README's loss
    variants appended as they stand (RLOO's advantages, the seq-mean-token-sum aggregation), which the config names;
    CANOE's final_10k.jsonl rows (problem, solution, the chat in `message` as a list of {role, content}, other
    columns); three steps under a time budget that the first step spends. Returns the folder that holds `run/`."""
    folder = tmp_path_factory.mktemp("fork-run")
    rows = [{**row, "message": [{"role": "user", "content": row["problem"]}], "source": "canoe"}
            for row in read_jsonl(smoke_data)]
    canoe_file = folder / "final_10k.jsonl"
    canoe_file.write_text("".join(json.dumps(r) + "\n" for r in rows))
    fork = fork_repository(folder / "fork")
    (fork / "ideas").mkdir()
    (fork / "ideas" / "brevity.py").write_text(readme_example("## Adding a reward", "docs/reward-ideas.md"))
    with open(fork / "rewards.py", "a") as f:
        f.write("\n" + MESSAGE_REWARD)
    with open(fork / "variants.py", "a") as f:
        f.write("\n\n" + readme_example("## Adding a loss variant", "docs/loss-options.md"))
    config = write_config(folder, canoe_file, max_steps=3, max_minutes=0.001, model=str(SMOKE_MODEL),
                          rewards=FORK_REWARDS, reward_files=["ideas/brevity.py"], advantage_rule="rloo",
                          aggregation="seq-mean-token-sum")
    launch(config, 1, root=fork, launcher=False)
    return folder


def test_the_readmes_reward_example_trains_and_is_logged(fork_run):
    (metrics,) = read_jsonl(fork_run / "run" / "metrics.jsonl")
    # the smoke model writes short answers, so brevity scores: left out of the total, the sum below would miss
    # 0.5 × reward/brevity
    assert metrics["reward/brevity"] > 0
    # the total is the weighted sum of the rewards, so its mean is the weighted sum of their means
    assert metrics["reward/total"] == pytest.approx(sum(w * metrics[f"reward/{n}"] for n, w in FORK_REWARDS.items()))


def test_the_readmes_advantage_rule_trains(fork_run):
    """The fork's variants.py has the README's RLOO rule appended and its config names it: every group's logged
    advantages are its rewards minus the mean of the other G − 1 (CANOE's rule would normalise them)."""
    samples = read_jsonl(fork_run / "run" / "samples.jsonl")
    G = json.loads((fork_run / "run" / "run_config.json").read_text())["config"]["num_generations"]
    assert len(samples) % G == 0 and any(s["advantage"] != 0 for s in samples)
    for start in range(0, len(samples), G):
        rewards = [s["reward"] for s in samples[start:start + G]]
        for reward, sample in zip(rewards, samples[start:start + G]):
            others = (sum(rewards) - reward) / (G - 1)
            assert sample["advantage"] == pytest.approx(reward - others, abs=1e-5)


def test_the_readmes_aggregation_trains(fork_run):
    """The fork's variants.py has the README's seq-mean-token-sum appended and its config names it: the logged loss
    is that aggregation's hand value. At the first step π_θ = π_old (ρ = 1) and w = 1, so token t of completion i
    has the loss -(A_i - β D_{i,t}), and L = (1/N) Σ_i Σ_t -(A_i - β D_{i,t}) = (-Σ_i A_i |o_i| + β Σ D) / N,
    where |o_i| is the completion's trained tokens (its sampled tokens, EOS included) and Σ D = loss/kl × Σ_i |o_i|.
    CANOE's seq-mean-token-mean would give -(1/N) Σ_i A_i + β (...) instead, and RLOO's advantages sum to 0 in
    every group, so the first term tells the two apart."""
    from transformers import AutoTokenizer

    (metrics,) = read_jsonl(fork_run / "run" / "metrics.jsonl")
    samples = read_jsonl(fork_run / "run" / "samples.jsonl")
    config = json.loads((fork_run / "run" / "run_config.json").read_text())["config"]
    tokenizer = AutoTokenizer.from_pretrained(SMOKE_MODEL)
    # a completion's sampled tokens: its text's, and the EOS that ended it unless it ran to max_completion_tokens
    # (the smoke model writes its taught format, whose text tokenizes back to the sampled tokens; the sum of the
    # lengths is checked against the logged mean below)
    lengths = [min(len(tokenizer(s["completion"], add_special_tokens=False)["input_ids"]) + 1,
                   config["max_completion_tokens"]) for s in samples]
    N, tokens = len(samples), sum(lengths)
    assert metrics["train/trained_frac"] == 1.0 and tokens == pytest.approx(N * metrics["completion/length_mean"])
    surrogate = sum(s["advantage"] * n for s, n in zip(samples, lengths))
    assert abs(surrogate) > 0.1, "every completion the same length: the aggregations would not differ"
    expected = (-surrogate + config["beta"] * metrics["loss/kl"] * tokens) / N
    assert metrics["loss/loss"] == pytest.approx(expected, rel=1e-4, abs=1e-6)


def test_time_budget_ends_the_run_with_a_checkpoint(fork_run):
    # max_steps 3, max_minutes 0.001: the budget is spent after the first step, which is the last
    assert [m["step"] for m in read_jsonl(fork_run / "run" / "metrics.jsonl")] == [1]
    assert (fork_run / "run" / "checkpoints" / "latest").read_text().strip() == "step-000001"


def test_canoe_training_rows_with_message_train_as_they_are(fork_run):
    # Our stage 2 builds its prompt from `problem`; `message` reaches every reward as a keyword argument, one value
    # per completion, which the fork's message_seen reward checks.
    check_run(fork_run / "run", 1)
    (metrics,) = read_jsonl(fork_run / "run" / "metrics.jsonl")
    assert metrics["reward/message_seen"] == 1.0


@pytest.mark.parametrize("lora_rank", [0, 8], ids=["full", "lora-adapter"])
def test_a_tied_model_trains_in_bfloat16(tmp_path, smoke_data, lora_rank):
    """The smoke model ties its embedding and output head, as SmolLM2 does; in
    bfloat16 every push is also checked by weight sums, which count the tied tensor once on both sides. With
    LoRA the adapter goes to vLLM apart (`lora_push = "adapter"`; on the CPU "auto" merges) and trains in float32
    over the bfloat16 base. `--eval` of its last checkpoint under its config then runs what the sampler held after
    the run's last push: the base with the adapter applied by vLLM (evaluate.adapter_rank), whose greedy outputs
    are the rollout engine's (tests/faults.py `record_greedy`)."""
    assert json.loads((SMOKE_MODEL / "config.json").read_text())["tie_word_embeddings"] is True
    config = write_config(tmp_path, smoke_data, max_steps=2, dtype="bfloat16", lora_rank=lora_rank, lora_alpha=16.0,
                          lora_push="adapter")
    result = launch(config, 1, launcher=False, fault="record_greedy" if lora_rank else None)
    assert "dtype: bfloat16 (set in the config)" in result.stdout
    metrics = read_jsonl(tmp_path / "run" / "metrics.jsonl")
    assert [m["step"] for m in metrics] == [1, 2]
    for m in metrics:
        assert m["sync/weight_sums_gap"] <= 1e-10  # what was pushed is what the engine holds, the tied tensor once
        assert m["sync/push_max_abs_diff"] <= push_tolerance(tmp_path / "run")
    assert metrics[0]["loss/kl"] == 0.0  # π_ref is the same bfloat16 base: step 1's policy is it exactly
    assert ("time/adapter_push" in metrics[0]) == bool(lora_rank)
    if lora_rank:
        policy = tmp_path / "run" / "checkpoints" / "step-000002" / "policy"
        result = launch(config, 1, "--eval", "--model", str(policy), "--eval-file", str(smoke_data), "--limit", "3",
                        launcher=False)
        assert "merging" not in result.stdout  # the adapter is applied, not merged
        evaluated = read_jsonl(tmp_path / "run" / "eval" / "step-000002-smoke.predictions.jsonl")
        sampled = json.loads((tmp_path / "run" / "greedy.json").read_text())
        assert [(p["id"], p["output"]) for p in evaluated] == [(s["id"], s["output"]) for s in sampled]
        assert len(sampled) == 3 and all(s["tokens"] for s in sampled)


@pytest.mark.parametrize("cpu, dtype, reason", [
    ("avx2", torch.float32, "auto: the CPU has neither avx512_bf16 nor amx_bf16"),
    ("amx", torch.bfloat16, "auto: the CPU has amx_bf16"),
])
def test_auto_dtype_runs_end_to_end_either_way(tmp_path, smoke_data, cpu, dtype, reason):
    """`dtype = "auto"` on a faked CPU of each kind (tests/faults.py replaces runtime.cpu_flags), so that what auto
    resolves to on the machine running the suite cannot hide a break on the other kind. With LoRA, merged on the
    CPU: on the AMX side this is the bfloat16 merged push, held to the bfloat16 tolerance the trainer uses."""
    config = write_config(tmp_path, smoke_data, max_steps=2, dtype="auto", lora_rank=8, lora_alpha=16.0)
    result = launch(config, 1, fault=f"{cpu}_machine", launcher=False)
    assert f"dtype: {str(dtype).removeprefix('torch.')} ({reason}" in result.stdout
    run = tmp_path / "run"
    assert run_dtype(run) == dtype
    assert push_tolerance(run) == {torch.float32: 1e-3, torch.bfloat16: 0.5}[dtype]
    check_run(run, 2)
    metrics = read_jsonl(run / "metrics.jsonl")
    assert ("sync/weight_sums_gap" in metrics[0]) == (dtype == torch.bfloat16)  # the exact check outside float32
