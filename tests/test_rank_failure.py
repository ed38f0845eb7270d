"""An error on one rank stops every rank within seconds, each saying which rank failed and why.

One mechanism does it, around the whole of canoe.train (`runtime.stop_together`): were a rank to raise on its
own, the others would go on to their next collective and wait there until the launcher or `dist_timeout_minutes`
ended them, saying nothing. Two ranks, each a process of its own started here without a launcher (nothing else
would end a waiting rank), with gloo:
- canoe.py itself (tests/faults.py) on the smoke model, where a reward raises on rank 1, or writing the policy
  into a checkpoint does;
- this file run as a script, where rank 1 fails and then stays alive while rank 0 waits in a barrier, as a rank
  waits under NCCL for a peer that will not come (gloo would see a dead peer's socket close); and where nothing
  fails, at no collective's cost.
"""

from __future__ import annotations

import datetime
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch.distributed as dist

from conftest import SMOKE_MODEL
from test_train import free_port, smoke_data, write_config  # noqa: F401  (smoke_data: a fixture)

ROOT = Path(__file__).resolve().parent.parent
PROMPT_S = 15  # how soon rank 0 must be gone once rank 1 raised: the poll (0.5 s) and grace (5 s), on a busy CPU
TIMEOUT_S = 120  # the process group's: a rank left waiting in a collective would stop only after this long


def start_ranks(command: list[str]) -> list[subprocess.Popen]:
    """`command` as rank 0 and rank 1 of a world of two on this node, meeting at a fresh port."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1", "PYTHONPATH": str(ROOT),
           "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port()), "WORLD_SIZE": "2", "LOCAL_SIZE": "2"}
    return [subprocess.Popen(command, cwd=ROOT, text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             env={**env, "RANK": str(rank), "LOCAL_RANK": str(rank)}) for rank in range(2)]


def wait_for_rank_0(ranks: list[subprocess.Popen], linger_s: float = 60) -> tuple[float, list[tuple[int, str]]]:
    """The moment rank 0 ended, then each rank's exit code and stderr (a rank still there `linger_s` later is
    ended)."""
    deadline = time.monotonic() + 900
    while ranks[0].poll() is None and time.monotonic() < deadline:
        time.sleep(0.1)
    ended = time.time()
    results = []
    for rank in ranks:
        try:
            _, err = rank.communicate(timeout=linger_s)
        except subprocess.TimeoutExpired:
            rank.kill()
            _, err = rank.communicate()
        results.append((rank.returncode, err))
    return ended, results


def raised_at(stderr: str) -> float:
    return float(next(line for line in stderr.splitlines() if line.startswith("fault raised at ")).split()[-1])


@pytest.mark.skipif(not SMOKE_MODEL.exists(), reason="run `make setup` first (makes models/smoke-llama)")
@pytest.mark.parametrize("fault, error", [("reward_error_on_rank_1", "ValueError: a reward with a bug"),
                                          ("save_error_on_rank_1", "OSError: [Errno 28] No space left on device")])
def test_an_error_on_rank_1_in_a_step_stops_rank_0_within_seconds_naming_it(tmp_path, smoke_data, fault, error):
    config = write_config(tmp_path, smoke_data, max_steps=1, save_every=1, dist_timeout_minutes=TIMEOUT_S / 60)
    ranks = start_ranks([sys.executable, str(ROOT / "tests" / "faults.py"), "--fault", fault, "--config",
                         str(config)])
    ended, ((code_0, err_0), (code_1, err_1)) = wait_for_rank_0(ranks)
    assert f"error: rank 1 of 2 failed; every rank stops. {error}" in err_1, err_1[-3000:]
    assert code_0 == 1 and f"error: rank 1 of 2 failed, so rank 0 stops too. rank 1: {error}" in err_0, err_0[-3000:]
    assert ended - raised_at(err_1) < PROMPT_S
    assert code_1 == 1 and "Traceback" in err_1  # the failing rank's own error, as Python reports it


def test_a_rank_held_in_a_collective_stops_within_seconds_when_another_fails():
    ranks = start_ranks([sys.executable, __file__, "held"])
    ended, ((code_0, err_0), (_, err_1)) = wait_for_rank_0(ranks, linger_s=1)
    assert code_0 == 1 and "error: rank 1 of 2 failed, so rank 0 stops too. rank 1: RuntimeError: rank 1's" in err_0
    assert ended - raised_at(err_1) < PROMPT_S, err_0[-3000:]


def test_ranks_that_do_not_fail_pass_through_at_no_collectives_cost():
    ranks = start_ranks([sys.executable, __file__, "passes"])
    _, results = wait_for_rank_0(ranks)
    for code, err in results:
        assert code == 0, err[-3000:]


# ------------------------------------------------------------------------------------------------ the ranks


def scenario(name: str) -> None:
    """`held`: rank 1 raises in `stop_together` and then lives on (as a peer under NCCL may), rank 0 waits in a
    barrier. `passes`: both ranks run through a block with no collective in it, which must cost none."""
    from plumbing import runtime

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{os.environ['MASTER_PORT']}",
                            rank=int(os.environ["RANK"]), world_size=2, timeout=datetime.timedelta(seconds=TIMEOUT_S))
    rank = dist.get_rank()
    calls = []
    for collective in ("all_reduce", "barrier", "all_gather_object", "broadcast"):
        original = getattr(dist, collective)
        setattr(dist, collective, lambda *args, _original=original, _name=collective, **kwargs:
                calls.append(_name) or _original(*args, **kwargs))
    try:
        with runtime.stop_together():
            if name == "passes":
                time.sleep(2 * runtime.POLL_S)  # the watcher looks, more than once
            elif rank == 1:
                print(f"fault raised at {time.time()}", file=sys.stderr, flush=True)
                raise RuntimeError("rank 1's error")
            else:
                dist.barrier()
    except RuntimeError:
        if rank == 0:
            raise
        time.sleep(TIMEOUT_S)  # alive, so rank 0's barrier does not fail on a closed socket
    assert calls == [], calls
    print(json.dumps({"rank": rank, "passed": True}), flush=True)
    runtime.leave_process_group()  # nothing failed: every rank gets here


if __name__ == "__main__":
    scenario(sys.argv[1])
