"""Two nodes through DeepSpeed's own launcher, emulated on this machine: docs/multinode.md, "Several nodes without ssh".

Two `deepspeed --no_ssh` launchers run at the same time, one per "node", each with `--node_rank` 0 or 1 and one
rank (`--num_gpus 1`), on the same two-line hostfile; they meet at 127.0.0.1 like the nodes of a cluster meet at
the first node's address. Each launcher only knows its own node (LOCAL_SIZE = 1 in a world of 2), so DeepSpeed's
same-node shared-memory collectives stay off and every collective goes through torch.distributed, as it does
between real nodes. Both "nodes" see this machine's filesystem, so `output_dir` is shared, as docs/multinode.md requires.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from collections import Counter
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from test_train import ROOT, SMOKE_MODEL, check_ranks_drew_apart, check_run, free_port, read_jsonl, write_config
from test_train import smoke_data  # noqa: F401  (a fixture: pytest finds it by its name in this module)

pytestmark = pytest.mark.skipif(not SMOKE_MODEL.exists(), reason="run `make setup` first (makes models/smoke-llama)")

NODES = 2
TIMEOUT_S = 900  # both launchers together; a hang fails the test instead of blocking the suite


def node_command(node: int, hostfile: Path, port: int, config: Path) -> list[str]:
    """The per-node command of docs/multinode.md for the case without ssh, for node `node` of NODES with one rank each;
    canoe.py is run through tests/faults.py's record_prompts, which only records each rank's prompts."""
    return [str(ROOT / ".venv" / "bin" / "deepspeed"), "--hostfile", str(hostfile), "--no_ssh",
            "--num_nodes", str(NODES), "--node_rank", str(node), "--num_gpus", "1",
            "--master_addr", "127.0.0.1", "--master_port", str(port),
            str(ROOT / "tests" / "faults.py"), "--fault", "record_prompts", "--config", str(config)]


def stop(process: subprocess.Popen) -> None:
    """End a launcher we started and everything it started (its own process group)."""
    for sig, wait_s in ((signal.SIGTERM, 30), (signal.SIGKILL, 30)):
        if process.poll() is not None:
            return
        try:
            os.killpg(process.pid, sig)
        except ProcessLookupError:
            return
        try:
            process.wait(timeout=wait_s)
        except subprocess.TimeoutExpired:
            pass


def launch_nodes(commands: list[list[str]], logs: list[Path]) -> list[int]:
    """Start every node's launcher at once and wait for all; returns their exit codes.

    When one fails the others are stopped at once (they would wait for it in a collective until the process
    group's timeout); after TIMEOUT_S all are stopped and the test fails.
    """
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    processes = []
    try:
        for command, log in zip(commands, logs):
            with open(log, "w") as out:
                processes.append(subprocess.Popen(command, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT,
                                                  start_new_session=True))
        deadline = time.monotonic() + TIMEOUT_S
        while any(p.poll() is None for p in processes):
            if any(p.poll() not in (None, 0) for p in processes):
                break
            if time.monotonic() > deadline:
                tails = "\n".join(f"--- {log.name}\n{log.read_text()[-3000:]}" for log in logs)
                raise AssertionError(f"the nodes did not finish within {TIMEOUT_S} s:\n{tails}")
            time.sleep(2)
    finally:
        for process in processes:
            stop(process)
    return [p.returncode for p in processes]


def flat_groups(weights: dict[str, torch.Tensor], param_shapes: list[dict]) -> list[torch.Tensor]:
    """The weights laid out as ZeRO-1/2 flattens each parameter group (in its order), before its end padding."""
    return [torch.cat([weights[name].flatten().float() for name in group]) for group in param_shapes]


def check_zero2_checkpoint(checkpoint: Path) -> None:
    """Rank 0's policy folder, rank 1's share of the fp32 master weights and DeepSpeed's merge of all shares agree.

    Under ZeRO-2 each rank keeps the fp32 master weights and optimizer state of its 1/2 of every flattened
    parameter group, and writes them (zero_pp_rank_K_...) from its own process; rank 0 alone writes the full
    weights it holds after the all-gather into policy/ and mp_rank_00_model_states.pt.
    """
    from deepspeed.checkpoint.constants import OPTIMIZER_STATE_DICT, SINGLE_PARTITION_OF_FP32_GROUPS
    from deepspeed.utils.zero_to_fp32 import get_fp32_state_dict_from_zero_checkpoint

    state = checkpoint / "deepspeed" / "state"
    assert sorted(p.name for p in state.glob("*.pt")) == [
        "mp_rank_00_model_states.pt",
        *(f"zero_pp_rank_{k}_mp_rank_00_optim_states.pt" for k in range(NODES)),
    ]
    assert sorted(p.name for p in (checkpoint / "rng").iterdir()) == [f"rank-{k}.pt" for k in range(NODES)]
    policy = load_file(checkpoint / "policy" / "model.safetensors")
    base = load_file(SMOKE_MODEL / "model.safetensors")

    # DeepSpeed's own consolidation (what zero_to_fp32.py does) of both ranks' files gives the policy folder
    merged = get_fp32_state_dict_from_zero_checkpoint(str(checkpoint / "deepspeed"), tag="state")
    assert policy.keys() <= merged.keys()
    for name, tensor in policy.items():
        assert torch.equal(merged[name], tensor.float()), name

    # and the share rank 1 wrote is the second half of the policy's flat weights, which training changed
    param_shapes = torch.load(state / "mp_rank_00_model_states.pt", weights_only=False)["param_shapes"]
    shares = [torch.load(state / f"zero_pp_rank_{k}_mp_rank_00_optim_states.pt", weights_only=False)
              [OPTIMIZER_STATE_DICT][SINGLE_PARTITION_OF_FP32_GROUPS] for k in range(NODES)]
    changed = False
    for i, (trained, original) in enumerate(zip(flat_groups(policy, param_shapes), flat_groups(base, param_shapes))):
        first, second = shares[0][i], shares[1][i]
        assert first.numel() == second.numel() and first.numel() + second.numel() >= trained.numel()
        assert first.numel() < trained.numel()  # rank 1's share holds real weights, not only padding
        n = trained.numel() - first.numel()
        assert torch.equal(first, trained[: first.numel()])
        assert torch.equal(second[:n], trained[first.numel():])
        changed |= not torch.equal(second[:n], original[first.numel():])
    assert changed, "rank 1's share of the weights did not change"


def test_two_nodes_without_ssh(tmp_path, smoke_data):  # noqa: F811
    started = time.monotonic()
    config = write_config(tmp_path, smoke_data, max_steps=2, save_every=1)
    hostfile = tmp_path / "hostfile"
    hostfile.write_text("".join(f"node-{k} slots=1\n" for k in range(NODES)))
    port = free_port()
    logs = [tmp_path / f"node-{k}.log" for k in range(NODES)]
    codes = launch_nodes([node_command(k, hostfile, port, config) for k in range(NODES)], logs)
    outputs = [log.read_text() for log in logs]
    assert codes == [0] * NODES, "\n".join(f"--- node {k} exited {c}\n{o[-6000:]}" for k, (c, o) in
                                           enumerate(zip(codes, outputs)))

    # each launcher started one rank of a world of two, its node's: global rank k on node k
    for k, output in enumerate(outputs):
        assert f"nnodes={NODES}, num_local_procs=1, node_rank={k}" in output
        assert f"dist_world_size={NODES}" in output
    assert "on 2 rank(s)" in outputs[0] and "on 2 rank(s)" not in outputs[1]  # only global rank 0 prints

    run = tmp_path / "run"
    info = json.loads((run / "run_config.json").read_text())
    assert info["world_size"] == NODES
    # one metrics.jsonl, written by rank 0 alone: steps 1 and 2 once each; and the run checks of test_train
    assert sorted(tmp_path.rglob("metrics.jsonl")) == [run / "metrics.jsonl"]
    check_run(run, 2)
    check_ranks_drew_apart(run, ranks=NODES, steps=2)  # and this is test_train's two-rank ZeRO-2 run as well
    # samples.jsonl holds rank 0's 2 prompts × 4 completions per step, once
    assert Counter(s["step"] for s in read_jsonl(run / "samples.jsonl")) == {1: 8, 2: 8}

    # every checkpoint complete and published, with both ranks' state in it
    checkpoints = run / "checkpoints"
    assert sorted(p.name for p in checkpoints.iterdir()) == ["latest", "step-000001", "step-000002"]
    assert (checkpoints / "latest").read_text().strip() == "step-000002"
    for step in ("step-000001", "step-000002"):
        check_zero2_checkpoint(checkpoints / step)
    print(f"two nodes, 2 steps: {time.monotonic() - started:.0f} s")
