"""bench/bench_scoring.py, run for real on the smoke model: each setting reaches the engine (a batch of at most
`seqs` requests), the counts are the outputs' own, and the KV and batch settings leave every greedy output as it
was."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import SMOKE_MODEL

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = ROOT / "tests" / "suites"


@pytest.mark.skipif(not SMOKE_MODEL.exists(), reason="run `make setup` first (makes models/smoke-llama)")
def test_the_scoring_benchmark_runs_each_setting_and_compares_the_outputs(tmp_path):
    benchmarks = tmp_path / "benchmarks"
    benchmarks.mkdir()
    cnq = json.loads((FIXTURES / "conflict_dev_filtered.json").read_text())
    (benchmarks / "cnq-nqswap.dev500.json").write_text(json.dumps([{**r, "org_answer": ["Douglass"]} for r in cnq]))
    config = tmp_path / "config.toml"
    config.write_text(f'base = "{ROOT / "recipes" / "smoke.toml"}"\nmodel = "{SMOKE_MODEL}"\ndtype = "float32"\n'
                      'suite_max_tokens = 24\n')
    out = tmp_path / "scoring.json"
    command = [sys.executable, str(ROOT / "bench" / "bench_scoring.py"), "--benchmarks", str(benchmarks),
               "--config", str(config), "--settings", "kv 1", "kv 2", "kv 1, seqs 2", "--out", str(out)]
    # a KV size already in the environment (an earlier engine of the session sets it) must not replace the setting's
    environment = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": "1"}
    result = subprocess.run(command, cwd=ROOT, env=environment, capture_output=True, text=True, timeout=900)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    report = json.loads(out.read_text())
    first, second, narrow = report["settings"]
    assert [row["setting"] for row in report["settings"]] == ["kv 1", "kv 2", "kv 1, seqs 2"]
    n = len(cnq)
    for row in report["settings"]:
        assert 0 < row["tokens"] <= 24 * n and row["at_limit"] <= n and row["steps"] > 0
        assert row["binds"] in ("bandwidth", "compute") and 0 < row["bound_s"] < row["seconds"]
        assert row["batch"] == pytest.approx(row["tokens"] / row["steps"]) and row["prompt_computed"] > 0
    assert second["kv_tokens"] == 2 * first["kv_tokens"]  # the setting's KV cache reached the engine
    assert narrow["batch"] <= 2 < first["batch"]  # and its batch: two requests at most at once
    # a larger KV cache that binds nothing leaves every output as it was
    assert second["same_as_first"] == n and f"outputs equal to the first setting's: {n} of {n}" in result.stdout
