"""Every collective of the trainer runs on the process group's device, and counts add up over ranks.

On CUDA the process group is NCCL's (DeepSpeed 0.19.8 picks the accelerator's backend), and torch 2.13 registers
NCCL for the "cuda" device type only: a collective on a CPU tensor then fails with "No backend type associated
with device type cpu" (see runtime.collective_device for the source lines). Our CPU runs use gloo, which serves
"cpu", so they never showed it. These tests build groups that serve no "cpu":

- `cuda:gloo` is gloo registered for "cuda" alone, as NCCL is. It needs no GPU to exist, so it shows the refusal
  and that `collective_device` answers "cuda" for it; a CPU-only torch cannot make CUDA tensors, though.
- `accel:gloo` is gloo registered for a device type of its own: torch's out-of-tree device slot (PrivateUse1,
  renamed "accel" by torch's set-up for a device written in Python, torch/utils/backend_registration.py
  `_setup_privateuseone_for_python_backend`, as a device plugin would be). `Accelerator`, a
  TorchDispatchMode, gives it tensors: an "accel" tensor is a wrapper subclass that holds an ordinary CPU tensor.
  A collective on such tensors reaches the mode as the c10d op, where the mode plays the device's c10d kernel:
  like torch's own (`allreduce_CUDA`, `allreduce_PrivateUse1`, ...), it asks the group for the backend registered
  for the tensors' device type (`ProcessGroup._get_backend`, which refuses a type it does not serve) and runs the
  op with that backend on the data. A collective on CPU tensors is passed on untouched, to torch's CPU kernel,
  which refuses it for this group. Every c10d op is recorded with the devices of its tensors.

The functions under test are the real ones (canoe.loss_denominators, canoe.skip_or_stop_on_bad_step,
canoe.out_of_time, metrics.step_metrics with its loss-total reductions and runtime.reduce_over_ranks), on two
ranks: each test starts its own processes (this file, run as a script), so no process group of this pytest
process is touched.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
import torch.distributed as dist
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_map

from conftest import SMOKE_MODEL

ROOT = Path(__file__).resolve().parent.parent
ACCEL = "accel"
RESULT = "RESULT "


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_ranks(scenario: str, world: int, script: str = __file__) -> list[dict]:
    """Run `scenario` of `script` (this file) on `world` ranks (one process each, a fresh process group); each
    rank's result, the line after RESULT that it prints."""
    port = free_port()
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT), "MASTER_ADDR": "127.0.0.1",
           "MASTER_PORT": str(port), "WORLD_SIZE": str(world)}
    procs = [subprocess.Popen([sys.executable, script, scenario], cwd=ROOT, text=True, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, env={**env, "RANK": str(rank), "LOCAL_RANK": str(rank)})
             for rank in range(world)]
    results = []
    try:
        for rank, proc in enumerate(procs):
            out, err = proc.communicate(timeout=540)
            assert proc.returncode == 0, f"rank {rank} failed:\n{err[-4000:]}"
            results.append(json.loads(next(line for line in out.splitlines() if line.startswith(RESULT))[len(RESULT):]))
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
    return results


# ------------------------------------------------------------------------------------------------------ tests


def test_the_device_is_the_one_the_group_serves():
    (result,) = run_ranks("devices", world=1)
    # gloo alone serves cpu and cuda; gloo for cuda alone is NCCL's case; with cpu among several, cpu (no copy)
    assert result["devices"] == {"gloo": "cpu", "cuda:gloo": "cuda", "cpu:gloo,cuda:gloo": "cpu",
                                 f"{ACCEL}:gloo": ACCEL}
    # torch itself, no test machinery: a group that serves no cpu refuses a CPU tensor (the code under test did this)
    assert "No backend type associated with device type cpu" in result["cpu_tensor_on_cuda_group"]


def test_every_collective_runs_on_the_groups_device():
    ranks = run_ranks("accelerator", world=2)
    for rank, result in enumerate(ranks):
        assert result["collective_device"] == ACCEL
        # loss_denominators: 3 + 1 sequences, 10 + 6 tokens, each a mean over the 2 ranks
        assert result["loss_denominators"] == {"total_sequences": 2.0, "total_tokens": 8.0}
        # skip_or_stop_on_bad_step: rank 1's NaN makes both ranks count the step; then a finite step resets
        assert result["nonfinite"] == {"bad_steps_in_a_row": 1, "bad_steps_total": 1}
        assert result["finite"] == {"bad_steps_in_a_row": 0, "bad_steps_total": 1}
        # out_of_time: rank 0's clock decides, whatever the other rank's deadline says
        assert result["out_of_time"] == [True, False]
        check_step_metrics(result["metrics"])
        # every collective reached the c10d ops with tensors on the group's device: 1 (loss_denominators) + 2
        # (skip_or_stop_on_bad_step, twice) + 2 (out_of_time, twice) + 3 (the loss totals: SUM, MIN, MAX) + 2
        # (the metrics: SUM, MAX)
        ops = [call["op"] for call in result["collectives"]]
        assert ops == ["c10d::allreduce_"] * 3 + ["c10d::broadcast_"] * 2 + ["c10d::allreduce_"] * 5
        assert all(call["devices"] == [ACCEL] for call in result["collectives"]), result["collectives"]
        # the test's device is no way around the group: a CPU tensor still goes to torch's CPU kernel, refused
        assert "No backend type associated with device type cpu" in result["cpu_tensor"]


def test_counts_are_summed_and_rates_averaged_over_ranks():
    """Two gloo ranks: rank 0 has one grader error, rank 1 none; the line logs 1 error and the mean format."""
    ranks = run_ranks("counts", world=2)
    for result in ranks:
        check_step_metrics(result["metrics"])


def test_each_rank_leaves_the_group_it_joined_and_exits_cleanly():
    """runtime.leave_process_group after a collective, as canoe.train ends: the group is gone and both ranks exit
    with 0 (`run_ranks` checks it); a rank that exits with a live group can abort at exit (SIGABRT, -6)."""
    for result in run_ranks("leave", world=2):
        assert result == {"joined": True, "sum": 1.0, "left": True, "groups": 0, "left_twice": True}


@pytest.mark.skipif(not SMOKE_MODEL.exists(), reason="run `make setup` first (makes models/smoke-llama)")
def test_a_rank_with_a_vllm_engine_leaves_before_the_engine_cleans_up():
    """vLLM's engine makes its groups within the trainer's and destroys them when it is collected or at exit; after
    runtime.leave_process_group that clean-up finds none of them left to destroy, and raises nothing."""
    (result,) = run_ranks("leave_engine", world=1)
    assert result == {"vllm_groups": True, "left": True}


def check_step_metrics(metrics: dict) -> None:
    """The metrics line of `make_step` on ranks 0 and 1."""
    assert metrics["reward/grader_errors"] == 1  # 1 + 0, not their mean 0.5
    assert metrics["reward/timeouts"] == 3  # 2 + 1
    assert metrics["reward/issues"] == 0
    assert metrics["stage2/too_long"] == 3  # 1 + 2
    assert metrics["reward/format"] == pytest.approx(0.75)  # a rate: (1.0 + 0.5) / 2
    assert metrics["faithfulness/em"] == pytest.approx(0.25)  # (0.5 + 0) / 2
    assert metrics["completion/length_mean"] == pytest.approx(4.25)  # (4 + 4.5) / 2
    assert metrics["completion/length_max"] == 7  # the longest completion of any rank
    assert metrics["sync/push_max_abs_diff"] == pytest.approx(2e-5)  # the worst push of any rank
    assert metrics["train/bad_steps_total"] == 2  # the same on every rank: neither summed nor changed
    assert metrics["train/lr"] == pytest.approx(1e-6)
    # the loss metrics, reduced exactly: sums add up over ranks, ratio_min takes the MIN and ratio_max the MAX
    assert metrics["loss/kl"] == pytest.approx(2.0 / 10)
    assert metrics["loss/clip_frac"] == pytest.approx(3 / 10)
    assert metrics["loss/ratio_mean"] == pytest.approx(10.3 / 10)
    assert metrics["loss/ratio_min"] == pytest.approx(0.8)
    assert metrics["loss/ratio_max"] == pytest.approx(1.1)
    assert metrics["loss/importance_capped_frac"] == pytest.approx(1 / 10)
    assert metrics["loss/loss"] == pytest.approx((0.5 + 1.5) / 2)
    assert metrics["step"] == 3


# ------------------------------------------------------------------------------------------------ the ranks


def make_step(rank: int):
    """Rank 0's or rank 1's step and run, as metrics.step_metrics reads them."""
    from training.metrics import Step

    def loss_metrics(tokens, kl_sum, clipped, ratio_sum, ratio_min, ratio_max, capped):
        values = dict(tokens=tokens, kl_sum=kl_sum, clipped_tokens=clipped, ratio_sum=ratio_sum, ratio_min=ratio_min,
                      ratio_max=ratio_max, importance_sum=tokens, importance_capped=capped)
        return {key: torch.tensor(float(value)) for key, value in values.items()}

    mine = [dict(grader_errors=1, timeouts=2, too_long=1, format=1.0, em=0.5, lengths=[3, 5], diff=1e-5, loss=0.5,
                 metrics=loss_metrics(4, 0.4, 1, 4.0, 0.9, 1.1, 0)),
            dict(grader_errors=0, timeouts=1, too_long=2, format=0.5, em=0.0, lengths=[7, 2], diff=2e-5, loss=1.5,
                 metrics=loss_metrics(6, 1.6, 2, 6.3, 0.8, 1.05, 1))][rank]
    completions = [SimpleNamespace(token_ids=[1] * n, finish_reason="stop") for n in mine["lengths"]]
    batch = SimpleNamespace(rows=[{}], completions=completions,
                            stage2=SimpleNamespace(completions=[None, None], too_long=mine["too_long"]),
                            metrics={"reward/format": mine["format"], "reward/issues": 0,
                                     "reward/timeouts": mine["timeouts"], "reward/grader_errors": mine["grader_errors"],
                                     "faithfulness/em": mine["em"]})
    micro = SimpleNamespace(packed=SimpleNamespace(completion_mask=torch.ones(2, 1)), old=torch.zeros(2, 1),
                            vllm_logprobs=torch.full((2, 1), -0.01))  # vLLM − trainer: 0.01 per token
    step = Step(rollout=batch, rewards=torch.tensor([1.0, 0.0]), advantages=torch.tensor([1.0, -1.0]),
                kept=torch.tensor([True, True]), losses=[(torch.tensor(mine["loss"]), mine["metrics"])],
                micro_batches=[micro], pushed={"sync/push_seconds": 0.1, "sync/push_max_abs_diff": mine["diff"]})
    run = SimpleNamespace(engine=SimpleNamespace(get_lr=lambda: [1e-6], get_global_grad_norm=lambda: 0.5),
                          bad_steps_total=2, times={"rewards": 1.0}, step=3)
    return step, run


def init_group(backend: str) -> None:
    dist.init_process_group(backend, init_method=f"tcp://127.0.0.1:{os.environ['MASTER_PORT']}",
                            rank=int(os.environ["RANK"]), world_size=int(os.environ["WORLD_SIZE"]))


def register_accelerator() -> None:
    """torch's out-of-tree device slot (PrivateUse1) as the device type "accel": torch's own set-up for a device
    written in Python (the name, the device module, hooks and device guard a C++ device would register)."""
    from torch.utils.backend_registration import _setup_privateuseone_for_python_backend

    _setup_privateuseone_for_python_backend(rename=ACCEL)


def scenario_devices() -> dict:
    from plumbing import runtime

    register_accelerator()
    devices, refusal = {}, None
    for backend in ("gloo", "cuda:gloo", "cpu:gloo,cuda:gloo", f"{ACCEL}:gloo"):
        os.environ["MASTER_PORT"] = str(free_port())
        init_group(backend)
        devices[backend] = str(runtime.collective_device())
        if backend == "cuda:gloo":
            try:
                dist.all_reduce(torch.ones(1))
            except RuntimeError as error:
                refusal = str(error)
        dist.destroy_process_group()
    return {"devices": devices, "cpu_tensor_on_cuda_group": refusal}


def scenario_accelerator() -> dict:
    import canoe
    from plumbing import runtime
    from training.metrics import step_metrics

    register_accelerator()
    init_group(f"{ACCEL}:gloo")
    rank = dist.get_rank()
    result = {}
    with Accelerator() as accelerator:
        kept = torch.tensor([True, True, True, False] if rank == 0 else [True, False, False, False])
        batches = [SimpleNamespace(mask=torch.ones(2, 5 if rank == 0 else 3)), SimpleNamespace(mask=torch.zeros(2, 3))]
        result["loss_denominators"] = canoe.loss_denominators(kept, batches)

        applied = iter([False, True])  # DeepSpeed skipped the first update (every rank alike), applied the second
        run = SimpleNamespace(bad_steps_in_a_row=0, bad_steps_total=0, cfg=SimpleNamespace(max_bad_steps=5),
                              engine=SimpleNamespace(was_step_applied=lambda: next(applied)))
        canoe.skip_or_stop_on_bad_step(run, [torch.tensor(1.0), torch.tensor(float("nan") if rank else 2.0)])
        result["nonfinite"] = {"bad_steps_in_a_row": run.bad_steps_in_a_row, "bad_steps_total": run.bad_steps_total}
        canoe.skip_or_stop_on_bad_step(run, [torch.tensor(1.0)])
        result["finite"] = {"bad_steps_in_a_row": run.bad_steps_in_a_row, "bad_steps_total": run.bad_steps_total}

        now = time.monotonic()
        result["out_of_time"] = [canoe.out_of_time(now - 1 if rank == 0 else now + 3600),
                                 canoe.out_of_time(now + 3600 if rank == 0 else now - 1)]

        step, run = make_step(rank)
        result["metrics"] = step_metrics(run, step, seconds=2.0, reward_means={})
        result["collectives"] = list(accelerator.calls)
        result["collective_device"] = str(runtime.collective_device())
        try:
            dist.all_reduce(torch.ones(1))
        except RuntimeError as error:
            result["cpu_tensor"] = str(error)
    dist.destroy_process_group()
    return result


def scenario_counts() -> dict:
    from training.metrics import step_metrics

    init_group("gloo")
    step, run = make_step(dist.get_rank())
    metrics = step_metrics(run, step, seconds=2.0, reward_means={})
    dist.destroy_process_group()
    return {"metrics": metrics}


def scenario_leave() -> dict:
    from plumbing import runtime

    rank, _ = runtime.init_distributed()  # as canoe.train joins: DeepSpeed's group, gloo on the CPU
    joined = dist.is_initialized()
    (total,) = runtime.all_reduce_values([float(rank)])  # 0 + 1
    runtime.leave_process_group()
    left, groups = not dist.is_initialized(), len(dist.distributed_c10d._world.pg_map)
    runtime.leave_process_group()  # once left (or never joined), nothing to do
    return {"joined": joined, "sum": total, "left": left, "groups": groups, "left_twice": not dist.is_initialized()}


def scenario_leave_engine() -> dict:
    from plumbing import runtime  # noqa: I001  (before vLLM loads)
    import rollout
    from vllm.distributed import parallel_state

    runtime.init_distributed()
    llm = rollout.make_engine(str(SMOKE_MODEL), dtype="float32", seed=0, max_model_len=256,
                              gpu_memory_utilization=0.5, enable_sleep_mode=False)
    vllm_groups = parallel_state._WORLD is not None and parallel_state._TP is not None
    runtime.leave_process_group()
    llm.llm_engine.engine_core.shutdown()  # the engine's clean-up, now rather than at exit, where it would only print
    return {"vllm_groups": vllm_groups, "left": not dist.is_initialized()}


class AcceleratorTensor(torch.Tensor):
    """A tensor on the "accel" device whose data is an ordinary CPU tensor, `inner`."""

    __torch_function__ = torch._C._disabled_torch_function_impl

    @staticmethod
    def __new__(cls, inner: torch.Tensor):
        tensor = torch.Tensor._make_wrapper_subclass(cls, inner.shape, strides=inner.stride(), dtype=inner.dtype,
                                                     device=torch.device(ACCEL), requires_grad=False)
        tensor.inner = inner
        return tensor

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        with Accelerator():
            return func(*args, **(kwargs or {}))


class Accelerator(TorchDispatchMode):
    """The "accel" device: its tensors, its operators (run on their CPU data) and its c10d kernels (see the
    module's docstring). `calls` records every c10d op with the device types of its tensors."""

    def __init__(self):
        super().__init__()
        self.calls: list[dict] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func.namespace == "c10d":
            return self.collective(func, args, kwargs)
        on_accel = False

        def unwrap(value):
            nonlocal on_accel
            if isinstance(value, AcceleratorTensor):
                on_accel = True
                return value.inner
            return value

        args, kwargs = tree_map(unwrap, args), tree_map(unwrap, kwargs)
        if kwargs.get("device") is not None:  # a factory or a copy: the device asked for decides
            on_accel = torch.device(kwargs["device"]).type == ACCEL
            if on_accel:
                kwargs["device"] = torch.device("cpu")
        out = func(*args, **kwargs)
        return tree_map(lambda v: AcceleratorTensor(v) if isinstance(v, torch.Tensor) else v, out) if on_accel else out

    def collective(self, func, args, kwargs):
        tensors = args[0]
        self.calls.append({"op": func._schema.name, "devices": [t.device.type for t in tensors]})
        if not all(isinstance(t, AcceleratorTensor) for t in tensors):
            return func(*args, **kwargs)  # torch's own kernel for these tensors' device, untouched
        # the c10d kernel of "accel", as torch's are for theirs: the backend that the group registered for this
        # device type (the lookup refuses a type the group does not serve), running the op on the tensors' data
        group = dist.ProcessGroup.unbox(args[1])
        backend = group._get_backend(torch.device(ACCEL))
        data_group = dist.ProcessGroup(dist.HashStore(), group.rank(), group.size())  # that backend, for CPU data
        data_group._register_backend(torch.device("cpu"), dist.ProcessGroup.BackendType.GLOO, backend)
        data_group._set_default_backend(dist.ProcessGroup.BackendType.GLOO)
        _, work = func([t.inner for t in tensors], data_group.boxed(), *args[2:], **kwargs)
        return tensors, work


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    scenario = sys.argv[1]
    result = {"devices": scenario_devices, "accelerator": scenario_accelerator, "counts": scenario_counts,
              "leave": scenario_leave, "leave_engine": scenario_leave_engine}[scenario]()
    print(RESULT + json.dumps(result), flush=True)


def test_the_cores_are_shared_by_the_ranks_the_deepspeed_launcher_starts(monkeypatch):
    """DeepSpeed's launcher sets LOCAL_SIZE, never torchrun's LOCAL_WORLD_SIZE (deepspeed/launcher/launch.py line
    182): read either, so that two ranks on a 2-core node get one thread each, not two."""
    from plumbing import runtime

    for name in ("LOCAL_WORLD_SIZE", "LOCAL_SIZE"):
        monkeypatch.delenv(name, raising=False)
    assert runtime.ranks_on_this_node() == 1
    monkeypatch.setenv("LOCAL_SIZE", "2")
    assert runtime.ranks_on_this_node() == 2
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "4")  # torchrun's, where both are set
    assert runtime.ranks_on_this_node() == 4
