"""bench/gpu_check.py's CPU subset (`--cpu`): every check that can run without a GPU runs and passes, without vLLM;
and a broken packed mask (`--break-mask`) fails the packing checks.

The GPU's run is recorded in bench/RESULTS.md; here the script must not be left to fail on the device for a reason
a CPU could have shown (an import of vLLM, a wrong call into the project's code).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "bench" / "gpu_check.py"


def run(*args: str) -> tuple[subprocess.CompletedProcess, list[str]]:
    done = subprocess.run([sys.executable, str(SCRIPT), "--cpu", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=900)
    return done, [line for line in done.stdout.splitlines() if line.startswith(("PASS", "FAIL", "SKIP"))]


def test_the_cpu_subset_runs_every_check_it_can_and_passes_without_vllm():
    done, lines = run()
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    expected = [f"PASS  packing {backend}: {what}" for backend in ("default", "math")
                for what in ("log π packed vs alone (L = 41, max |Δ|)", "LoRA gradient packed vs alone (relative)")]
    expected += ["PASS  merge: "] * 3 + ["SKIP  memory"]
    expected += [f"PASS  deepspeed {mode} ZeRO-{stage}: " for mode in ("lora", "full") for stage in (2, 3)
                 for _ in range(4)]
    assert len(lines) == len(expected) and all(map(str.startswith, lines, expected)), "\n".join(lines)
    # the sums are of real weights, and each loaded engine's second step matched bit for bit
    sums = [line for line in lines if "WeightSums" in line]
    assert len(sums) == 4 and all(line.split("total ")[1].split(" / ")[0] != "0" for line in sums)
    assert all(": 0 of " in line for line in lines if "save, load" in line)


def test_a_mask_that_lets_completions_see_each_other_fails_the_packing_checks():
    done, lines = run("--only", "packing", "--break-mask")
    assert done.returncode == 1, done.stderr[-3000:]
    assert [line.split("  ")[0] for line in lines] == ["FAIL"] * 4
    gaps = [float(line.rsplit(": ", 1)[1].split(" ")[0]) for line in lines if "log π" in line]  # "5.72 nats, ..."
    assert len(gaps) == 2 and min(gaps) > 1.0  # nats: far beyond the bfloat16 noise the check allows
