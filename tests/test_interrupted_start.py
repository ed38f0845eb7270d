"""A run stopped by SIGTERM while DeepSpeed starts leaves no build lock behind.

The first start from a new `.venv` (or a new TORCH_EXTENSIONS_DIR) compiles DeepSpeed's shared-memory all-reduce
with torch's JIT, which holds the file `lock` in the op's build folder meanwhile and removes it in a `finally`.
Python's default SIGTERM kills the process without running `finally`, and the lock left behind makes every later
start wait on it forever, printing nothing. `runtime.init_distributed` turns SIGTERM into an exit through
`finally` while DeepSpeed starts. Here the real `init_distributed` starts with an empty extensions folder and gets
SIGTERM as soon as the build takes its lock.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
START = "from plumbing.runtime import init_distributed; init_distributed()"


def test_sigterm_during_the_shm_op_build_exits_and_removes_the_lock(tmp_path):
    launcher_keys = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_SIZE", "MASTER_ADDR", "MASTER_PORT")
    env = {key: value for key, value in os.environ.items() if key not in launcher_keys}
    process = subprocess.Popen([sys.executable, "-c", START], cwd=ROOT,
                               env={**env, "TORCH_EXTENSIONS_DIR": str(tmp_path)})
    lock = tmp_path / "deepspeed_shm_comm" / "lock"
    deadline = time.monotonic() + 120
    try:
        while not lock.exists():
            assert process.poll() is None, f"the start ended ({process.returncode}) before the build took its lock"
            assert time.monotonic() < deadline, "no build lock within 120 s"
            time.sleep(0.02)
        process.send_signal(signal.SIGTERM)
        code = process.wait(timeout=60)
    finally:
        process.kill()
    assert not lock.exists(), f"the build lock stayed behind (exit {code})"
    assert code == 128 + signal.SIGTERM  # sys.exit's code, not death by the signal (−15)
