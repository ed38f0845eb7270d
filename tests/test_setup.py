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
