"""Stage-2 prompt construction, the push check and the seeding rule of rollout.py (vLLM itself: tests/test_train.py)."""

from __future__ import annotations

import doctest
import json
import os
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import SMOKE_MODEL

import rollout
from plumbing import weight_sync
from rollout import Completion, extract_long_answer, substitute_context
from plumbing.weight_sync import WeightSyncError, check_sync

CASES = Path(__file__).resolve().parent / "cases" / "canoe_reward_cases.json"


def load_cases() -> list[dict]:
    return [c for c in json.loads(CASES.read_text()) if c["fn"] == "substitute_context"]


@pytest.mark.parametrize("case", load_cases(), ids=lambda c: c["id"])
def test_substitute_context_worked_cases(case):
    assert substitute_context(case["problem"], case["long_answer"]) == case["expected"]


@pytest.mark.parametrize(
    "problem, long_answer, expected",
    [
        # regex replacement syntax and backslashes stay literal (the original's re.escape bug)
        ("<context>x</context>\n\nQ?", r"C:\new\table \\ \0", "<context>C:\\new\\table \\\\ \\0</context>\n\nQ?"),
        ("<context>x</context>\n\nQ?", "It costs 5.00. Is it?", "<context>It costs 5.00. Is it?</context>\n\nQ?"),
        # an empty context block is still a block
        ("<context></context>\n\nQ?", "L", "<context>L</context>\n\nQ?"),
        # text before the block is kept
        ("Read: <context>x</context> then answer.", "L", "Read: <context>L</context> then answer."),
        # a long answer that itself contains tags does not confuse the first-block rule
        ("<context>x</context>\n\nQ?", "a </context> b", "<context>a </context> b</context>\n\nQ?"),
        # unclosed context: no block
        ("<context>x\n\nQ?", "L", None),
        (None, "L", None),
    ],
)
def test_substitute_context_replaces_the_first_closed_block_literally(problem, long_answer, expected):
    assert substitute_context(problem, long_answer) == expected


def test_substitute_context_does_not_use_regex_replacement():
    long_answer = "".join(chr(c) for c in range(32, 127))  # every printable ASCII character, \ and \g<0> included
    assert substitute_context("<context>a</context>", long_answer) == f"<context>{long_answer}</context>"


@pytest.mark.parametrize(
    "text, expected",
    [
        ("<think>t</think><long_answer> L1\nL2 </long_answer><answer>a</answer>", "L1\nL2"),
        ("<long_answer>first</long_answer><long_answer>second</long_answer>", "first"),
        ("<long_answer></long_answer>", ""),
        ("<long_answer>unclosed", None),
        ("no tags", None),
        (None, None),
        (42, None),
    ],
)
def test_extract_long_answer(text, expected):
    assert extract_long_answer(text) == expected


def test_doctests():
    result = doctest.testmod(rollout)
    assert result.attempted > 0 and result.failed == 0


def test_check_sync_passes_within_tolerance_and_reports_the_gaps():
    vllm = torch.tensor([-1.0, -2.0, -3.0])
    trainer = torch.tensor([-1.0, -2.0005, -3.0])
    gaps = check_sync(vllm, trainer, tolerance=1e-3)
    assert gaps["sync/push_max_abs_diff"] == pytest.approx(5e-4, abs=1e-6)
    assert gaps["sync/push_trimmed_abs_diff"] == pytest.approx(5e-4, abs=1e-6)  # 3 tokens: none set aside


def probe(off: int, by: float, tokens: int = 34) -> tuple[torch.Tensor, torch.Tensor]:
    """A 34-token probe (the default's length) whose first `off` tokens differ by `by` nats, the rest by 1e-5."""
    trainer = -torch.linspace(0.5, 4.0, tokens)
    return trainer + torch.where(torch.arange(tokens) < off, by, 1e-5), trainer


@pytest.mark.parametrize("tolerance", [1e-3, 0.5], ids=["float32", "bfloat16"])
def test_one_token_of_many_off_by_a_nat_passes_the_probe(tolerance):
    """Kernel rounding moves a few tokens far (a rare token's log-probability in bfloat16): the trimmed maximum sets
    the worst quarter of the probe's tokens aside, and the largest gap is still logged."""
    gaps = check_sync(*probe(off=1, by=1.0), tolerance=tolerance)
    assert gaps["sync/push_max_abs_diff"] == pytest.approx(1.0)
    assert gaps["sync/push_trimmed_abs_diff"] == pytest.approx(1e-5, abs=1e-6)
    assert check_sync(*probe(off=8, by=1.0), tolerance=tolerance)["sync/push_trimmed_abs_diff"] <= tolerance


@pytest.mark.parametrize("tolerance", [1e-3, 0.5], ids=["float32", "bfloat16"])
def test_most_tokens_off_by_a_nat_fail_the_probe_with_every_figure_named(tolerance):
    with pytest.raises(WeightSyncError) as caught:
        check_sync(*probe(off=30, by=1.0), tolerance=tolerance, sums="matched: every pushed value landed bit for bit")
    message = str(caught.value)
    assert f"`sync_tolerance` = {tolerance:g} nats on 30 of its 34 tokens" in message
    assert "trimmed maximum |Δ| (the largest after the worst 8 set aside) is 1," in message
    assert f"{1 - tolerance:.3g} over" in message and "weight sums matched" in message
    assert "a `sync_tolerance` above 1 lets the run go on" in message
    # nine tokens beyond the tolerance are one more than a 34-token probe sets aside
    with pytest.raises(WeightSyncError, match="on 9 of its 34 tokens"):
        check_sync(*probe(off=9, by=1.0), tolerance=tolerance)


def test_check_sync_fails_with_a_message_naming_the_token():
    vllm = torch.tensor([-1.0, -2.0, -3.0])
    trainer = torch.tensor([-1.0, -2.5, -3.0])
    with pytest.raises(WeightSyncError, match=r"the largest is 0.5 at token 1 \(vLLM -2.0000, trainer -2.5000"):
        check_sync(vllm, trainer, tolerance=1e-3)


def test_check_sync_fails_on_nan_even_in_one_token_of_many():
    with pytest.raises(WeightSyncError):
        check_sync(torch.tensor([float("nan")]), torch.tensor([-1.0]), tolerance=1.0)
    vllm, trainer = probe(off=0, by=0.0)
    vllm[5] = float("nan")
    with pytest.raises(WeightSyncError, match="at token 5"):
        check_sync(vllm, trainer, tolerance=0.5)


def test_request_seed_is_stable_and_distinct():
    assert rollout.request_seed(42, "stage1", 3, 0) == rollout.request_seed(42, "stage1", 3, 0)
    seeds = {rollout.request_seed(42, stage, step, rank) for stage in ("stage1", "stage2") for step in range(5)
             for rank in range(3)}
    assert len(seeds) == 30 and all(0 <= s < 2**63 for s in seeds)


class RecordingEngine:
    """Stands in for vLLM in the one test about which stage-2 prompts are built (generation itself is tested
    for real in tests/test_train.py); it records what it was asked to sample."""

    def __init__(self):
        self.prompts = None

    def generate(self, prompts, params, use_tqdm=False):
        from types import SimpleNamespace

        self.prompts = [p["prompt_token_ids"] for p in prompts]
        assert params.n == 1
        sample = SimpleNamespace(text="<answer>x</answer>", token_ids=[7], logprobs=[{7: SimpleNamespace(logprob=-0.1)}],
                                 finish_reason="stop", index=0)
        return [SimpleNamespace(outputs=[sample]) for _ in prompts]


def test_generate_stage2_regenerates_only_usable_long_answers():
    problems = ["<context>ctx A</context>\n\nQ1?", "no context block\n\nQ2?"]
    texts = ["<long_answer>la one</long_answer>", "nothing", "<long_answer>la two</long_answer>",
             "<long_answer>" + "very long " * 50 + "</long_answer>",  # prompt 1 (G=2): no context block
             ]
    completions = [Completion(t, (1,), (-0.5,), "stop") for t in texts]
    engine = RecordingEngine()
    render = lambda problem: [ord(ch) for ch in problem]  # noqa: E731 - one "token" per character
    result = rollout.generate_stage2(engine, problems, completions, group_size=2, render=render,
                                     max_prompt_tokens=10_000, temperature=0.9, top_p=1.0, max_tokens=8, seed=1,
                                     step=0, rank=0)
    assert result.problems == ["<context>la one</context>\n\nQ1?", None, None, None]
    assert [c is not None for c in result.completions] == [True, False, False, False]
    assert engine.prompts == [render("<context>la one</context>\n\nQ1?")]
    # a prompt over the limit is not sampled and is counted
    result = rollout.generate_stage2(engine, problems, completions[:2], group_size=1, render=render,
                                     max_prompt_tokens=5, temperature=0.9, top_p=1.0, max_tokens=8, seed=1, step=0,
                                     rank=0)
    assert result.too_long == 1 and result.completions == [None, None]


@pytest.mark.skipif(not SMOKE_MODEL.exists(), reason="run `make setup` first (makes models/smoke-llama)")
def test_push_into_the_packed_cpu_engine_lands_only_with_the_repack():
    """vLLM's packed CPU kernels read a copy of each weight made at load time: a perturbed push must fail the
    probe check when the kernels are not rebuilt, and pass it when `push_weights` rebuilds them (its default)."""
    result = packed_push("float32")
    assert result["packed"] is result["packed_said"] is True  # read from vLLM's kernels, and what weight_sync says
    assert result["without_repack"]["passed"] is False and result["without_repack"]["gap"] > 1e-2
    assert "trimmed maximum" in result["without_repack"]["message"]
    assert result["with_repack"]["passed"] is True and result["with_repack"]["gap"] <= 1e-3


def packed_push(dtype: str) -> dict:
    import subprocess
    import sys

    script = Path(__file__).resolve().parent / "packed_push.py"
    done = subprocess.run([sys.executable, str(script), str(SMOKE_MODEL), dtype], capture_output=True, text=True,
                          timeout=600)
    lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    assert lines, done.stderr[-3000:]
    return json.loads(lines[-1].removeprefix("RESULT "))


def test_a_sleeping_engine_offloads_its_cuda_graphs(monkeypatch):
    """vLLM 0.32 keeps CUDA graphs on the GPU while asleep unless `sleep_mode_offload_cudagraph` is set; the memory
    plan counts a sleeping engine as holding nothing, so make_engine sets it whenever sleep mode is on."""
    import dataclasses

    from vllm.engine.arg_utils import EngineArgs

    assert "sleep_mode_offload_cudagraph" in {f.name for f in dataclasses.fields(EngineArgs)}  # the installed vLLM's
    seen = []
    monkeypatch.setattr(rollout, "LLM", lambda **kwargs: seen.append(kwargs))
    monkeypatch.setattr(weight_sync, "keep_cpu_linear_weights", lambda: None)
    for sleep in (True, False):
        rollout.make_engine("m", dtype="bfloat16", seed=0, max_model_len=64, gpu_memory_utilization=0.5,
                            enable_sleep_mode=sleep)
    assert [(k["enable_sleep_mode"], k["sleep_mode_offload_cudagraph"]) for k in seen] == [(True, True), (False, False)]


def test_each_engine_gets_its_own_kv_cache_size_on_the_cpu(monkeypatch):
    """vLLM's CPU platform reads VLLM_CPU_KVCACHE_SPACE from the environment as each engine starts
    (vllm/platforms/cpu.py, check_and_update_config); a size left there by an earlier engine of the process, or by
    the parent process, must not replace the one asked for."""
    seen = []
    monkeypatch.setattr(rollout.torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(rollout, "LLM", lambda **kwargs: seen.append(os.environ["VLLM_CPU_KVCACHE_SPACE"]))
    monkeypatch.setattr(weight_sync, "keep_cpu_linear_weights", lambda: None)
    monkeypatch.setenv("VLLM_CPU_KVCACHE_SPACE", "1")  # as an earlier engine or the parent left it
    for gib in (4, 2.4, 0.25):
        rollout.make_engine("m", dtype="bfloat16", seed=0, max_model_len=64, gpu_memory_utilization=0.5,
                            enable_sleep_mode=False, cpu_kv_cache_gib=gib)
    assert seen == ["4", "2", "1"]  # whole GiB, at least one, as vLLM's variable takes them


def test_the_trainer_draws_its_own_seed_after_the_engine_seeded_torch(monkeypatch):
    """vLLM's worker ends its start-up with `set_random_seed(seed)` (the real function is called
    here, as the worker calls it), alike on every rank; make_engine seeds torch with the rank's seed after it."""
    from vllm.utils.torch_utils import set_random_seed

    def starting_engine(**kwargs):
        set_random_seed(kwargs["seed"])

    monkeypatch.setattr(rollout, "LLM", starting_engine)
    monkeypatch.setattr(weight_sync, "keep_cpu_linear_weights", lambda: None)
    draws = []
    for rank in (0, 1):
        torch.manual_seed(7 + rank)  # the trainer's seeding before the engine (canoe.setup)
        rollout.make_engine("m", dtype="float32", seed=7, max_model_len=64, gpu_memory_utilization=0.5,
                            enable_sleep_mode=False, trainer_seed=7 + rank)
        draws.append(torch.rand(4))
    assert torch.equal(draws[0], torch.rand(4, generator=torch.Generator().manual_seed(7)))  # rank 0 as before
    assert torch.equal(draws[1], torch.rand(4, generator=torch.Generator().manual_seed(8)))  # rank 1 its own
    assert not torch.equal(draws[0], draws[1])


# ---------------------------------------------------------------------------------------------- seeds on CUDA

SMOLLM2 = Path(__file__).resolve().parent.parent / "models" / "SmolLM2-135M-Instruct"


@pytest.mark.skipif(not SMOLLM2.exists(), reason="run `make setup` first (makes models/SmolLM2-135M-Instruct)")
def test_vllm_logprobs_of_its_samples_are_the_trainers_at_the_sampling_temperature():
    """At τ = 0.7 the engine returns the log-probabilities of the distribution that drew each token (processed,
    after the temperature), which the trainer's π at τ matches within the float32 probe tolerance; the trainer's
    unscaled π (or vLLM's raw values) would miss by far more. Asked for none (stage 2), it draws the same tokens."""
    import subprocess
    import sys

    script = Path(__file__).resolve().parent / "tempered_rollout.py"
    done = subprocess.run([sys.executable, str(script), str(SMOLLM2), "0.7"], capture_output=True, text=True,
                          timeout=600)
    lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    assert lines, done.stderr[-3000:]
    result = json.loads(lines[-1].removeprefix("RESULT "))
    assert result["tokens"] >= 8
    assert result["tempered"]["passed"] and result["tempered"]["gap"] <= 1e-3
    assert not result["unscaled"]["passed"] and result["unscaled"]["gap"] > 0.1
    assert result["without_logprobs"] == {"same_tokens": True, "logprobs": 0}  # stage 2's way: the draw unchanged


class V2SamplingEngine:
    """vLLM 0.32's `LLM.generate` on CUDA with the default (V2) model runner, as far as seeding goes:
    - a request without a seed gets one from numpy's global generator, which the worker seeded with the engine
      seed and no rank (v1/worker/gpu/sample/states.py, `SamplingStates.add_request`; utils/torch_utils.py,
      `set_random_seed`): each
      engine here has its own numpy generator seeded like that, as each rank's process has;
    - the i-th of a request's n samples has the seed + i (v1/engine/parallel_sampling.py,
      `ParentRequest._get_child_sampling_params`);
    - a sample's token at position t is drawn from its seed and t alone (gumbel.py, `gumbel_sample`).
    The torch generator, which `rollout._sample` seeds, plays no part, as on CUDA."""

    def __init__(self, engine_seed: int):
        self.numpy = np.random.RandomState(engine_seed)

    def generate(self, prompts, params, use_tqdm=False):
        from types import SimpleNamespace

        params = params if isinstance(params, list) else [params] * len(prompts)
        assert len(params) == len(prompts)
        outputs = []
        for request in params:
            samples = []
            for index in range(request.n):  # each sample is a child request of its own
                if request.seed is None:
                    seed = int(self.numpy.randint(-2**63, 2**63 - 1, dtype=np.int64))
                else:
                    seed = request.seed + index
                assert -2**63 <= seed < 2**63  # vLLM keeps seeds in int64 arrays
                tokens = [rollout.request_seed(seed, t) % 50 for t in range(request.max_tokens)]
                samples.append(SimpleNamespace(text=" ".join(map(str, tokens)), token_ids=tokens, index=index,
                                               logprobs=[{t: SimpleNamespace(logprob=-1.0)} for t in tokens],
                                               finish_reason="length"))
            outputs.append(SimpleNamespace(outputs=samples))
        return outputs


def stage1(engine, step: int, rank: int) -> list[tuple[int, ...]]:
    completions = rollout.generate_stage1(engine, [[1, 2, 3], [4, 5]], num_generations=3, temperature=0.9, top_p=1.0,
                                          max_tokens=6, seed=42, step=step, rank=rank)
    return [c.token_ids for c in completions]


def test_on_cuda_every_request_carries_its_own_seed_so_ranks_differ_and_a_resume_redraws(monkeypatch):
    monkeypatch.setattr(rollout, "seeds_per_request", lambda: True)
    rank0, rank1 = V2SamplingEngine(42), V2SamplingEngine(42)  # every rank's engine has the run's seed
    run0 = [stage1(rank0, step, 0) for step in range(3)]
    assert run0[2] != stage1(rank1, 2, 1)  # the ranks draw their own samples
    assert stage1(V2SamplingEngine(42), 2, 0) == run0[2]  # a fresh engine (a resumed run) redraws step 2 exactly
    samples = run0[0]
    assert len(set(samples)) == 6  # 2 prompts × 3 samples, all different


def test_prompt_seeds_fit_vllm_and_the_cpu_path_sends_none(monkeypatch):
    from vllm import SamplingParams

    seeds = [rollout.prompt_seed(rollout.request_seed(s, "stage1", step, 0), i) for s in (0, 42) for step in range(50)
             for i in range(4)]
    assert len(set(seeds)) == len(seeds) and all(0 <= s < 2**62 for s in seeds)
    assert SamplingParams(n=7, seed=max(seeds)).seed == max(seeds)  # vLLM takes it as it is
    seen = []

    class Recording(V2SamplingEngine):
        def generate(self, prompts, params, use_tqdm=False):
            seen.append(params)
            return super().generate(prompts, params)

    monkeypatch.setattr(rollout, "seeds_per_request", lambda: False)  # the CPU: one request setting, no seed
    stage1(Recording(0), 0, 0)
    assert not isinstance(seen[-1], list) and seen[-1].seed is None
    monkeypatch.setattr(rollout, "seeds_per_request", lambda: True)
    stage1(Recording(0), 0, 0)
    assert [p.seed for p in seen[-1]] == [rollout.prompt_seed(rollout.request_seed(42, "stage1", 0, 0), i)
                                          for i in range(2)]
