"""What `make setup` and `.ci/run` do to the disk: setup refuses a disk too small before it writes anything, and
CI's clone (about 7 GB once set up) is removed whether its tests pass or fail."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_setup_on_a_disk_too_small_says_so_before_making_the_venv(tmp_path):
    for name in ("Makefile", "requirements.txt"):
        shutil.copy(ROOT / name, tmp_path / name)
    done = subprocess.run(["make", ".venv/.setup-done", "SETUP_GB=1000000"], cwd=tmp_path, capture_output=True,
                          text=True, timeout=60)
    assert done.returncode != 0
    assert "free here; make setup needs 1000000 GB" in done.stdout + done.stderr
    assert not (tmp_path / ".venv").exists()


def test_ci_removes_its_clone_when_the_tests_fail(tmp_path):
    """`make` is replaced by a stand-in that notes where it ran and fails, as a failing suite does."""
    (tmp_path / "make").write_text(f'#!/bin/sh\npwd > "{tmp_path / "ran-in"}"\nexit 1\n')
    (tmp_path / "make").chmod(0o755)
    env = {**os.environ, "PATH": f"{tmp_path}:{os.environ['PATH']}"}
    done = subprocess.run([str(ROOT / ".ci" / "run")], env=env, capture_output=True, text=True, timeout=120)
    clone = Path((tmp_path / "ran-in").read_text().strip())
    assert done.returncode != 0 and clone.name == "repo"
    assert not clone.parent.exists()


SKIPPING = '''import pytest

@pytest.mark.skipif(True, reason="run `make setup` first (makes models/none)")
def test_needs_a_model():
    pass

@pytest.mark.skipif(True, reason="not on this platform")
def test_elsewhere():
    pass
'''


def test_in_ci_a_skip_for_a_set_up_step_fails_naming_it_and_the_summary_lists_skips(tmp_path):
    """tests/conftest.py's hook, loaded as a plugin into a suite of two skipping tests, run as `make test` runs."""
    (tmp_path / "test_skipping.py").write_text(SKIPPING)
    env = {**os.environ, "CI": "true", "PYTHONPATH": str(ROOT / "tests")}
    done = subprocess.run([str(ROOT / ".venv" / "bin" / "python"), "-m", "pytest", "-p", "conftest", "-q", "-rs",
                           "-p", "no:cacheprovider", str(tmp_path)], cwd=tmp_path, env=env, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 1, done.stdout
    assert "1 skipped, 1 error" in done.stdout  # a skip for another reason stays a skip, listed by -rs
    assert "run `make setup` first (makes models/none): set-up was done" in done.stdout
    assert "SKIPPED [1] test_skipping.py:7: not on this platform" in done.stdout
    assert "-m pytest tests -q -rs" in (ROOT / "Makefile").read_text()  # `make test`, which .ci/run runs
