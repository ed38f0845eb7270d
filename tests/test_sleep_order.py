"""The training step's order against vLLM 0.32's sleep mode, with an engine that stands in for a CUDA run.

A CUDA run with vLLM's sleep mode cannot be done on our machines (no GPU; vLLM's CPU platform has no sleep mode),
so `SleepModeEngine` behaves as vLLM 0.32 does on CUDA, read from its source (site-packages/vllm):
- `sleep(level=1)` copies every weight allocation to a host buffer and unmaps the device memory; the KV cache is
  discarded (device_allocator/sleep_mode_backend.py, `CuMemBackend.suspend`: level 1 offloads the "weights" tag;
  device_allocator/cumem.py, `CuMemAllocator.sleep`: the host copy, then `unmap_and_release`).
- `sleep(level=2)` discards the weights too and keeps only the module buffers on the host
  (v1/worker/gpu_worker.py, `Worker.sleep`), which `Worker.wake_up` of the weights copies back.
- `wake_up(tags)` maps the tagged allocations again; those with a host copy get it copied back, the others hold
  whatever the new memory holds (cumem.py, `CuMemAllocator.wake_up`). A tag that is not asleep is a warning and
  nothing happens (v1/executor/abstract.py, `Executor.wake_up`); so is sleeping twice (`Executor.sleep`).
- Requests are served only once the engine is fully awake (v1/engine/core.py, `EngineCore.wake_up`: the
  scheduler resumes when no tag sleeps), and writing weights into unmapped memory is an illegal address on CUDA.
The trainer is a real DeepSpeed engine (ZeRO-2, one CPU rank, in this process) and the step is the real
`canoe.train_step`; only the reward scoring is replaced, by fixed rewards that make the update move the weights.
"""

from __future__ import annotations

import os
import socket
from types import SimpleNamespace

import deepspeed
import pytest
import torch
import torch.distributed as dist
from transformers import LlamaConfig, LlamaForCausalLM

import canoe
from training import optimizer
import data
import rollout
from plumbing import weight_sync
from config import Config
from training.push import WeightPush
from variants import Variants

VOCAB = 64


class IllegalAddress(RuntimeError):
    """What CUDA reports when a kernel writes to unmapped memory."""


class SleepModeEngine:
    """vLLM 0.32's `LLM` with `enable_sleep_mode=True` on CUDA, as far as the training step uses it (see above).

    Its weights are the parameters of its own copy of the model; `events` records every call in order.
    """

    def __init__(self, model: torch.nn.Module):
        self.model = model.eval()
        self.asleep: set[str] = set()  # tags whose device memory is unmapped
        self.host_copy: dict[str, torch.Tensor] | None = None  # level 1's backup of the weights
        self.saved_buffers: dict[str, torch.Tensor] | None = None  # level 2's backup of the buffers
        self.events: list[str] = []

    def sleep(self, level: int = 1) -> None:
        self.events.append(f"sleep({level})")
        if "weights" in self.asleep:
            return  # "Executor is already sleeping."
        if level == 1:
            self.host_copy = {n: p.detach().clone() for n, p in self.model.named_parameters()}
        else:
            self.saved_buffers = {n: b.clone() for n, b in self.model.named_buffers()}
        self.asleep = {"weights", "kv_cache"}

    @torch.no_grad()
    def wake_up(self, tags: list[str] | None = None) -> None:
        self.events.append(f"wake_up({','.join(tags) if tags else 'all'})")
        if not self.asleep or any(tag not in self.asleep for tag in tags or ()):
            return  # "Executor is not sleeping." / "Tag ... is not in sleeping tags"
        tags = list(self.asleep) if tags is None else tags
        if "weights" in tags:
            for name, param in self.model.named_parameters():
                # new physical memory: the host copy if level 1 took one, else whatever it holds
                param.copy_(self.host_copy[name]) if self.host_copy else param.fill_(float("nan"))
            for name, buffer in self.model.named_buffers():
                if self.saved_buffers:
                    buffer.copy_(self.saved_buffers[name])
            self.host_copy = self.saved_buffers = None
        self.asleep -= set(tags)

    @torch.no_grad()
    def collective_rpc(self, method, kwargs: dict | None = None):
        if callable(method):  # vLLM calls a function with each worker and the kwargs (entrypoints/llm.py,
            # `LLM.collective_rpc`; v1/serial_utils.py, `run_method`); one worker here
            runner = SimpleNamespace(model=self.model, lora_manager=getattr(self, "lora_manager", None))
            return [method(SimpleNamespace(model_runner=runner), **(kwargs or {}))]
        assert method == "reload_weights", method
        self.events.append("reload_weights")
        if "weights" in self.asleep:
            raise IllegalAddress("CUDA error: an illegal memory access was encountered (weights pushed into an "
                                 "engine whose weight memory is unmapped while it sleeps)")
        parameters = dict(self.model.named_parameters())
        for name, tensor in kwargs["weights_iterator"]:
            parameters[name].copy_(tensor)

    def reset_prefix_cache(self) -> None:
        self.events.append("reset_prefix_cache")

    @torch.no_grad()
    def generate(self, prompts, params, use_tqdm: bool = False):
        self.events.append("generate")
        if self.asleep:
            raise RuntimeError(f"the engine serves no request while {sorted(self.asleep)} sleep (its scheduler is "
                               f"paused until it is fully awake): generate would wait forever")
        return [self._answer(list(p["prompt_token_ids"]), params) for p in prompts]

    def _logprobs(self, ids: list[int]) -> torch.Tensor:
        logits = self.model(input_ids=torch.tensor([ids])).logits[0].float()  # (len, V)
        return torch.log_softmax(logits, -1)

    def _answer(self, ids: list[int], params) -> SimpleNamespace:
        entry = lambda token, lp: {token: SimpleNamespace(logprob=float(lp))}  # noqa: E731
        if params.prompt_logprobs is not None:  # the probe: log-probabilities of the given tokens
            lp = self._logprobs(ids)
            return SimpleNamespace(prompt_logprobs=[None] + [entry(t, lp[i, t]) for i, t in enumerate(ids[1:])])
        samples = []
        for index in range(params.n):  # sampled with torch's generator, which rollout._sample seeds
            tokens, logprobs = [], []
            for _ in range(params.max_tokens):
                lp = self._logprobs(ids + tokens)[-1]
                token = int(torch.multinomial(lp.exp(), 1))
                tokens.append(token)
                logprobs.append(entry(token, lp[token]))
            samples.append(SimpleNamespace(text="", token_ids=tokens, logprobs=logprobs, finish_reason="length",
                                           index=index))
        return SimpleNamespace(outputs=samples)


def tiny_model() -> LlamaForCausalLM:
    torch.manual_seed(0)
    return LlamaForCausalLM(LlamaConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                        num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=64,
                                        attn_implementation="sdpa"))


@pytest.fixture(autouse=True)
def cuda_kernels(monkeypatch):
    """The stand-in is a CUDA engine: it has no packed CPU kernels for `weight_sync.push_weights` to re-pack."""
    monkeypatch.setattr(weight_sync, "cpu_kernels_are_packed", lambda: False)


LAUNCHER_VARIABLES = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")


@pytest.fixture(scope="module")
def process_group():
    """A gloo group of one rank in this process (made once; torch keeps it for the session), and while the module
    runs the launcher's variables that `deepspeed.initialize` reads (LOCAL_RANK); they are restored after it."""
    saved = {key: os.environ.get(key) for key in LAUNCHER_VARIABLES}
    for key, value in (("RANK", "0"), ("LOCAL_RANK", "0"), ("WORLD_SIZE", "1"), ("MASTER_ADDR", "127.0.0.1")):
        os.environ.setdefault(key, value)
    if not dist.is_initialized():
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            os.environ.setdefault("MASTER_PORT", str(s.getsockname()[1]))
        deepspeed.init_distributed(dist_backend="gloo")
    # The group holds the port from now on: a test's `canoe.py` subprocess must not inherit it (EADDRINUSE).
    if saved["MASTER_PORT"] is None:
        os.environ.pop("MASTER_PORT", None)
    yield
    for key, value in saved.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value


def make_run(tmp_path, sleep: bool, policy: torch.nn.Module | None = None,
             beta: float = 0.0) -> tuple[canoe.Run, SleepModeEngine]:
    """A Run around a real DeepSpeed engine (`policy`, default the tiny model; test_lora.py passes a PEFT model
    with β > 0, whose reference is the policy with its adapters disabled) and a stand-in engine."""
    cfg = Config(num_generations=2, prompts_per_device=2, gradient_accumulation_steps=1, max_prompt_tokens=16,
                 max_completion_tokens=3, beta=beta, learning_rate=0.05, lr_scheduler="constant", warmup_ratio=0.0,
                 dual=False, sync_tolerance=1e-4, dtype="float32", output_dir=str(tmp_path))
    policy = tiny_model() if policy is None else policy
    engine, *_ = deepspeed.initialize(model=policy, model_parameters=[p for p in policy.parameters() if p.requires_grad],
                                      config=optimizer.deepspeed_config(cfg, 1, torch.float32, train=True))
    llm = SleepModeEngine(tiny_model())  # the same initial weights, as a freshly started engine has
    rows = [{"prompt_ids": [1, 5 + i, 9, 13 + i], "problem": "<context>c</context>\n\nq", "solution": "a"}
            for i in range(4)]
    sampler = data.PromptSampler(len(rows), cfg.prompts_per_step, cfg.seed, 0, 1)
    grader = SimpleNamespace(timeouts=0, errors=0)  # the counters the step reads; the rewards are fixed_rewards
    push = WeightPush(llm, ([1, 2, 3, 4], [5, 6, 7]), cfg.push_tolerance(torch.float32), cfg.zero_stage, sleep=sleep)
    run = canoe.Run(cfg, 0, 1, torch.device("cpu"), None, engine, None, llm, rows, sampler, grader, 2,
                    Variants.create(cfg), push, tmp_path)
    return run, llm


def fixed_rewards(names, rows, completions, stage2, G, **extra):
    """1, 0 within each group for the first reward, 0 for the others: every group has an advantage, so the update
    moves the weights. Returns rewards.score's `(N, R)` per-reward scores."""
    per_reward = torch.zeros(len(completions), len(names))  # (N, R)
    per_reward[:, 0] = torch.tensor([float(i % 2 == 0) for i in range(len(completions))])
    return per_reward


def weights_agree(run: canoe.Run, llm: SleepModeEngine) -> bool:
    trained = dict(run.engine.module.named_parameters())
    return all(torch.equal(p, trained[n].detach()) for n, p in llm.model.named_parameters())


def test_the_step_pushes_only_into_an_awake_engine(tmp_path, process_group, monkeypatch):
    monkeypatch.setattr(canoe, "score", fixed_rewards)
    run, llm = make_run(tmp_path, sleep=True)
    before = {n: p.detach().clone() for n, p in run.engine.module.named_parameters()}
    for _ in range(2):
        step = canoe.train_step(run)
        assert step.pushed["sync/push_max_abs_diff"] <= 1e-4  # the probe agrees: vLLM generates from the trained weights
        assert weights_agree(run, llm)
    assert any(not torch.equal(p, before[n]) for n, p in run.engine.module.named_parameters()), "nothing trained"
    assert not llm.asleep  # awake for the next step's sampling
    # asleep (level 2: nothing copied to the host) from after sampling until the weights are woken for the push;
    # the KV cache wakes after the push, then the probe runs
    one_step = ["generate", "sleep(2)", "wake_up(weights)", "reload_weights", "reset_prefix_cache",
                "wake_up(kv_cache)", "generate"]
    assert llm.events == one_step * 2


def test_the_engine_sleeps_while_the_trainer_trains(tmp_path, process_group, monkeypatch):
    monkeypatch.setattr(canoe, "score", fixed_rewards)
    run, llm = make_run(tmp_path, sleep=True)
    seen = []
    completion_logprobs = canoe.completion_logprobs

    def watched(model, packed, temperature):
        seen.append(set(llm.asleep))
        return completion_logprobs(model, packed, temperature)

    monkeypatch.setattr(canoe, "completion_logprobs", watched)
    canoe.train_step(run)
    assert seen == [{"weights", "kv_cache"}]  # one micro-batch, trained while vLLM held no memory


def test_without_sleep_mode_the_step_never_sleeps_or_wakes(tmp_path, process_group, monkeypatch):
    monkeypatch.setattr(canoe, "score", fixed_rewards)
    run, llm = make_run(tmp_path, sleep=False)  # the CPU: vLLM has no sleep mode there
    canoe.train_step(run)
    assert llm.events == ["generate", "reload_weights", "reset_prefix_cache", "generate"]
    assert weights_agree(run, llm)


class SleepPool:
    """A torch.cuda.MemPool of vLLM 0.32's CuMemAllocator (device_allocator/cumem.py keeps each pool it allocated
    from in `allocator_and_pools`, per tag, as (pool, allocator)): its tensors stay allocated in torch's count while
    a sleep unmaps their memory. `snapshot` lists its segments as torch's `MemPool.snapshot` does."""

    def __init__(self, *allocated: int):
        self.segments = [{"allocated_size": size, "total_size": size + 2**20} for size in allocated]

    def snapshot(self, include_traces: bool = True) -> list[dict]:
        return self.segments


def count_cuda_memory(monkeypatch, llm: SleepModeEngine, peak: int) -> None:
    """A CUDA run's memory counters: torch's peak (`peak` bytes when read) and vLLM's sleep pools (1 GiB
    allocated), each reset and read of the peak recorded among the engine's events."""
    pools = {"weights": [(SleepPool(2**29, 2**28), None)], "kv_cache": [(SleepPool(2**28), None), (SleepPool(), None)]}
    monkeypatch.setattr(weight_sync, "get_mem_allocator_instance", lambda: SimpleNamespace(allocator_and_pools=pools))
    monkeypatch.setattr(weight_sync, "cuda_memory_counted", lambda: True)
    monkeypatch.setattr(torch.cuda, "reset_peak_memory_stats", lambda: llm.events.append("reset_peak"))
    monkeypatch.setattr(torch.cuda, "max_memory_allocated", lambda: llm.events.append("read_peak") or peak)


@pytest.mark.parametrize("sleep", [True, False], ids=["sleep mode", "no sleep mode"])
def test_the_training_peak_is_counted_from_the_sleep_to_the_wake(tmp_path, process_group, monkeypatch, sleep):
    """`memory/peak_gib` is the training phase's: torch's peak counter reset once vLLM sleeps and read before it
    wakes, less what torch still counts in vLLM's sleeping pools (3 − 1 GiB here). Without sleep mode vLLM's memory
    stays in use through training, as the plan's training peak without sleep counts it: nothing is taken off."""
    monkeypatch.setattr(canoe, "score", fixed_rewards)
    run, llm = make_run(tmp_path, sleep=sleep)
    count_cuda_memory(monkeypatch, llm, peak=3 * 2**30)
    step = canoe.train_step(run)
    woken = ["sleep(2)", "reset_peak", "read_peak", "wake_up(weights)"] if sleep else ["reset_peak", "read_peak"]
    assert llm.events[: len(woken) + 1] == ["generate", *woken]
    assert step.pushed["memory/peak_gib"] == (2.0 if sleep else 3.0)


def test_flash_attention_is_refused_through_the_deepspeed_engine(process_group):
    """packing's guard reads the attention setting of the model a DeepSpeed engine wraps (the engine's own
    `.config` is DeepSpeed's config dict, which has no attention setting)."""
    from training import packing

    model = tiny_model()
    model.config._attn_implementation = "flash_attention_2"
    engine, *_ = deepspeed.initialize(model=model, model_parameters=list(model.parameters()),
                                      config=optimizer.deepspeed_config(Config(), 1, torch.float32, train=True))
    assert isinstance(engine.config, dict)  # DeepSpeed's, not the model's
    with pytest.raises(ValueError, match="4D attention mask"):
        packing.attention_mask(engine, packing.pack([([1, 2], [[3]])]).allowed)
