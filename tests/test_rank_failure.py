"""A check that fails on one rank stops every rank at once, each saying which rank failed and why.

The checks one rank can fail alone agree over the ranks before anyone raises (`runtime.stop_together`): were a
rank to raise on its own, the others would go on to their next collective and wait there until the launcher
noticed the dead process and killed them, saying nothing. Two gloo ranks, each this file run as a script (as
tests/test_collectives.py runs its own), call the real checks:
- vLLM's start-up check (`preflight.check_engine_can_start`), with `torch.cuda.mem_get_info` giving each rank the
  free memory the test chooses;
- the weight push (`WeightPush`, the real one, into tests/test_sleep_order.py's stand-in engine) with the weight
  sums on, where rank 1's push is produced and summed but never reaches its engine.
Each is run once passing on both ranks and once failing on rank 1 alone.
"""

from __future__ import annotations

import datetime
import json
import os
import sys
import time

import torch
import torch.distributed as dist

from test_collectives import RESULT, run_ranks

TIMEOUT_S = 60  # the process group's: a rank left waiting in a collective would stop only after this long
PROMPT_S = 10  # how soon every rank must stop once one failed (the checks themselves take milliseconds)
GIB = 2**30


def test_a_check_that_fails_on_one_rank_stops_every_rank_at_once_naming_it():
    ranks = run_ranks("checks", world=2, script=__file__)
    for step, error, reason in (
            ("start, rank 1 short", "SystemExit", "vLLM's start-up check failed on rank 1 of 2; every rank stops.\n"
                                                  "rank 1: error: vLLM needs vllm_gpu_memory_utilization × 80.0 GiB = "
                                                  "56.0 GiB free to start, but the trainer left 10.0 GiB;"),
            ("push, rank 1 stale", "WeightSyncError", "the weight sums' check failed on rank 1 of 2; every rank "
                                                      "stops.\nrank 1: weight push failed verification: the engine's "
                                                      "weights do not sum to what was pushed")):
        healthy, failed = ranks[0][step], ranks[1][step]
        assert healthy["error"] == failed["error"] == error
        assert healthy["message"] == failed["message"] and healthy["message"].startswith(reason)
        assert "rank 0:" not in healthy["message"]
        assert healthy["seconds"] < PROMPT_S, healthy  # at the check itself, not at the group's timeout
    for result in ranks:
        # a passing check costs one all-reduce of one number each (the push checks its sums, then its probe)
        assert result["start, enough memory"] == {"passed": True, "all_reduce": 1, "all_gather_object": 0}
        assert result["push, landed"] == {"passed": True, "all_reduce": 2, "all_gather_object": 0}


# ------------------------------------------------------------------------------------------------ the ranks


def counting(calls: dict[str, int], name: str):
    """torch.distributed's `name`, counted in `calls` (runtime calls it through the module, so it sees this)."""
    original = getattr(dist, name)

    def counted(*args, **kwargs):
        calls[name] += 1
        return original(*args, **kwargs)

    setattr(dist, name, counted)


def scenario_checks() -> dict:
    from config import Config
    from plumbing import weight_sync
    from test_sleep_order import SleepModeEngine, tiny_model
    from training import preflight
    from training.push import WeightPush

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{os.environ['MASTER_PORT']}",
                            rank=int(os.environ["RANK"]), world_size=int(os.environ["WORLD_SIZE"]),
                            timeout=datetime.timedelta(seconds=TIMEOUT_S))
    rank = dist.get_rank()
    weight_sync.cpu_kernels_are_packed = lambda: False  # the stand-in engine has no packed CPU kernels
    calls = {"all_reduce": 0, "all_gather_object": 0}
    for name in calls:
        counting(calls, name)
    policy = tiny_model()

    def update() -> None:  # a step away from the weights the engine holds
        with torch.no_grad():
            for param in policy.parameters():
                param.add_(0.01)

    push = WeightPush(SleepModeEngine(tiny_model()), ([1, 2, 3, 4], [5, 6, 7]), 1e-3, zero_stage=2, checksums=True)
    landing = weight_sync.push_weights

    def stale(llm, weights, **kwargs) -> float:  # rank 1's push: produced and summed, never in the engine
        for _ in weights:
            pass
        return 0.0

    def start(free_gib: float) -> None:
        torch.cuda.mem_get_info = lambda: (free_gib * GIB, 80 * GIB)
        preflight.check_engine_can_start(Config())  # vLLM's share: 0.7 × 80 GiB = 56 GiB

    def update_and_push(push_weights) -> None:
        update()
        weight_sync.push_weights = push_weights
        push(policy, asleep=False)

    steps = {"start, enough memory": lambda: start(60), "start, rank 1 short": lambda: start(60 if rank == 0 else 10),
             "push, landed": lambda: update_and_push(landing),
             "push, rank 1 stale": lambda: update_and_push(stale if rank == 1 else landing)}
    result = {}
    for step, check in steps.items():
        dist.barrier()  # both ranks start the check together
        calls.update(dict.fromkeys(calls, 0))
        start_s = time.monotonic()
        try:
            check()
        except (SystemExit, weight_sync.WeightSyncError) as error:
            result[step] = {"error": type(error).__name__, "message": str(error),
                            "seconds": time.monotonic() - start_s}
        else:
            result[step] = {"passed": True, **calls}
    dist.destroy_process_group()
    return result


if __name__ == "__main__":
    result = {"checks": scenario_checks}[sys.argv[1]]()
    print(RESULT + json.dumps(result), flush=True)
