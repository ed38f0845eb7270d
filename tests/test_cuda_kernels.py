"""Every op the project computes on device tensors has a CUDA kernel for its dtypes (tests/cuda_kernels.py).

A GPU run cannot be made here, and the CPU has kernels that CUDA lacks (an int64 matrix product, aten::dot, ran on
the CPU and stopped every bfloat16 GPU run at its first push). So the push of each kind, in float32 and bfloat16,
and one training step's loss and backward run under a dispatch mode that records each op the project calls with
its input dtypes, and torch's own OpInfo table says whether CUDA has that kernel.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from conftest import SMOKE_MODEL

import cuda_kernels

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("kind", ["plain", "adapter"])
def test_the_pushes_and_a_training_step_use_only_ops_cuda_has_for_their_dtypes(dtype, kind):
    done = subprocess.run([sys.executable, str(ROOT / "tests" / "cuda_kernels.py"), str(SMOKE_MODEL), dtype, kind],
                          cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    (line,) = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    result = json.loads(line.removeprefix("RESULT "))
    assert result["missing"] == []
    assert set(result["pushed"]) == ({"adapter"} if kind == "adapter" else {"full", "merged"})
    seen = result["seen"]
    # the recorder saw what the push computes itself: the weight sums outside float32 and always for the adapter
    summed = any(key.startswith("sum int") and where.startswith("plumbing/weight_sync.py") for key, where in seen.items())
    assert summed == (dtype == "bfloat16" or kind == "adapter")
    assert any(where.startswith("training/packing.py") for where in seen.values())  # the probe's trainer side
    if kind == "plain":  # and the loss, its custom backward and the model's backward
        assert any(where.startswith("grpo_loss.py") for where in seen.values())
        assert any(key.startswith("embedding_dense_backward") for key in seen)


def test_an_integer_dot_is_caught_and_a_libraries_ops_are_not_recorded():
    a = torch.arange(4)
    with cuda_kernels.DeviceOps() as ours:
        int(a @ a)  # called from here: the project's
    assert list(ours.seen) == [("dot", ("int64",)), ("_local_scalar_dense", ("int64",))]
    assert ours.seen[("dot", ("int64",))].startswith("tests/test_cuda_kernels.py:")
    assert [m.split(" at ")[0] for m in cuda_kernels.missing_kernels(ours.seen)] == ["dot ['int64']"]
    with cuda_kernels.DeviceOps() as theirs:  # the same product, called from a library's file
        exec(compile("b = a @ a", str(ROOT / ".venv" / "lib" / "library.py"), "exec"), {"a": a})
    assert theirs.seen == {}
    # the same product in float32, and the product as the weight sums now compute it, have kernels
    assert cuda_kernels.missing_kernels({("dot", ("float32",)): "x.py:1", ("mul", ("int64",)): "x.py:2",
                                         ("sum", ("int64",)): "x.py:3", ("__rshift__", ("int64",)): "x.py:4"}) == []
    # bfloat16 matmuls: the table lists them only where it sees a capable GPU, which every recipe's GPU is
    assert cuda_kernels.missing_kernels({("mm", ("bfloat16",)): "x.py:1"}) == []
    # an op neither in the table nor among the commented exceptions is not trusted
    assert "nor in NOT_IN_TABLE" in cuda_kernels.missing_kernels({("no_such_op", ("float32",)): "x.py:1"})[0]
