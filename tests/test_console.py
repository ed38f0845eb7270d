"""The quiet console (runtime.route_logs): vLLM's log goes to OUTPUT_DIR/vllm.log, DeepSpeed's INFO to
deepspeed.log; the terminal keeps the progress bar, rank 0's lines, vLLM's errors and DeepSpeed's warnings.

The unit tests route the real "vllm" and "DeepSpeed" loggers in this process, with vLLM's own logging config
applied as an engine would apply it. The console of a real training run is checked by `check_quiet_console`,
which tests/test_train.py's `test_one_rank_zero2` calls on its own run (no run of its own: the suite stays as
long as it was).
"""

from __future__ import annotations

import io
import logging
import re
from pathlib import Path

import pytest

from plumbing import runtime

# A line in vLLM's format: "(MainProcess pid=8954) INFO 11-25 22:02:37 [model.py:733] ..." (vllm/logger.py lines
# 28-33), at any level below ERROR.
VLLM_LINE = re.compile(r"\b(DEBUG|INFO|WARNING) \d\d-\d\d \d\d:\d\d:\d\d \[[\w./]+:\d+\]")
# vLLM's lines at every weight push (before this change, ~5 per step on the console)
PER_PUSH = ("Reloading and processing weights", "reset prefix cache")
# A progress bar's line (tqdm's "42%|", vLLM's "100% Completed |") or an empty one
BAR = re.compile(r"^\s*$|\d+%\||% Completed \|")
# Lines on the console other than progress bars, for the smoke run of test_one_rank_zero2 (3 steps, one rank, CPU):
# 95 in all before the routing, 50 after, of which 22 not a progress bar: the launcher's 10 lines, DeepSpeed's
# accelerator warning (3 processes), its "shm_comm_op built", rank 0's 3 lines, vLLM's import-time "Triton ..."
# line (Python's last-resort handler), a torch FutureWarning (4 lines) and NUMA note. vLLM's start-up alone was
# 30 lines and each step 5 more, so a regression of either breaks this bound.
MAX_CONSOLE_LINES = 30


def check_quiet_console(result, run: Path, steps: int) -> None:
    """The console of a finished training run (`result` of test_train.launch) holds no vLLM line below ERROR and
    few lines besides the progress bar; vLLM's lines are in `run`/vllm.log, DeepSpeed's INFO in deepspeed.log."""
    console = (result.stdout + result.stderr).splitlines()
    assert not [line for line in console if VLLM_LINE.search(line)], "vLLM log lines on the console"
    assert not [line for line in console if any(text in line for text in PER_PUSH)]
    others = [line for line in console if not BAR.search(line)]
    assert len(others) <= MAX_CONSOLE_LINES, "\n".join(others)
    assert any(line.startswith("done: ") for line in others)  # rank 0's own lines are there
    vllm_log = (run / "vllm.log").read_text()
    assert all(vllm_log.count(text) >= steps for text in PER_PUSH)  # one push per step
    assert "non-default args" in vllm_log  # vLLM's start-up lines too
    assert "DeepSpeed info: version=" in (run / "deepspeed.log").read_text()


@pytest.fixture
def loggers(monkeypatch):
    """vLLM's logging config applied afresh (as an engine applies it, its stream this test's stdout); the "vllm"
    and "DeepSpeed" loggers put back as they were afterwards."""
    vllm_logger_module = pytest.importorskip("vllm.logger")
    from deepspeed.utils import logger as deepspeed_logger
    from vllm.config.logging import LoggingConfig

    monkeypatch.setattr(vllm_logger_module, "_last_configured_logging_config",
                        vllm_logger_module._last_configured_logging_config)
    saved = [(logger, logger.level, logger.propagate, list(logger.handlers), [h.level for h in logger.handlers])
             for logger in (logging.getLogger("vllm"), deepspeed_logger)]
    vllm_logger_module.configure_logging(LoggingConfig())
    yield logging.getLogger("vllm"), deepspeed_logger
    for logger, level, propagate, handlers, levels in saved:
        for handler in logger.handlers:
            if handler.get_name() == runtime.LOG_FILE_HANDLER:
                handler.close()
        logger.handlers[:] = handlers
        logger.setLevel(level)
        logger.propagate = propagate
        for handler, handler_level in zip(handlers, levels):
            handler.setLevel(handler_level)


def terminal_of(logger: logging.Logger) -> io.StringIO:
    """Point the logger's terminal handlers at one StringIO, and return it."""
    stream = io.StringIO()
    terminal = [h for h in logger.handlers if runtime.is_terminal_handler(h)]
    assert terminal, f"{logger.name} has no terminal handler"
    for handler in terminal:
        handler.setStream(stream)
    return stream


def test_vllm_errors_reach_the_terminal_and_everything_reaches_the_file(tmp_path, loggers):
    vllm_logger, deepspeed_logger = loggers
    paths = runtime.route_logs(tmp_path / "run", 0)
    assert paths == {"vllm": tmp_path / "run" / "vllm.log", "deepspeed": tmp_path / "run" / "deepspeed.log"}
    vllm_terminal, deepspeed_terminal = terminal_of(vllm_logger), terminal_of(deepspeed_logger)
    worker = logging.getLogger("vllm.model_executor.model_loader.reload")  # a module's logger, as vLLM names them
    worker.info("Reloading and processing weights took 0.05 seconds")
    worker.warning("RotaryEmbedding: Failed to load weights")
    worker.error("Engine core hit an error")
    deepspeed_logger.info("DeepSpeed info: version=0.19.8")
    deepspeed_logger.warning("a DeepSpeed warning")
    for handler in vllm_logger.handlers + deepspeed_logger.handlers:
        handler.flush()

    (line,) = vllm_terminal.getvalue().splitlines()  # the error alone, in vLLM's own format
    assert "Engine core hit an error" in line and " ERROR " in line
    log = paths["vllm"].read_text()
    for text in ("Reloading and processing weights", "RotaryEmbedding", "Engine core hit an error"):
        assert text in log
    assert "\033[" not in log  # no terminal colours in the file
    assert VLLM_LINE.search(log)
    assert "a DeepSpeed warning" in deepspeed_terminal.getvalue() and "version" not in deepspeed_terminal.getvalue()
    assert "DeepSpeed info: version=0.19.8" in paths["deepspeed"].read_text()


def test_verbose_keeps_vllms_full_log_on_the_terminal(tmp_path, loggers):
    vllm_logger, _ = loggers
    paths = runtime.route_logs(tmp_path, 0, verbose=True)
    terminal = terminal_of(vllm_logger)
    logging.getLogger("vllm.v1.core.block_pool").info("Successfully reset prefix cache")
    for handler in vllm_logger.handlers:
        handler.flush()
    assert "Successfully reset prefix cache" in terminal.getvalue()
    assert "Successfully reset prefix cache" in paths["vllm"].read_text()  # and in the file all the same


def test_each_rank_writes_its_own_files_and_a_second_call_replaces_the_first(tmp_path, loggers):
    vllm_logger, deepspeed_logger = loggers
    runtime.route_logs(tmp_path, 2)
    paths = runtime.route_logs(tmp_path, 3)
    assert paths == {"vllm": tmp_path / "vllm-rank-3.log", "deepspeed": tmp_path / "deepspeed-rank-3.log"}
    for logger in (vllm_logger, deepspeed_logger):
        assert len([h for h in logger.handlers if h.get_name() == runtime.LOG_FILE_HANDLER]) == 1
    logging.getLogger("vllm.test").info("to rank 3's file")
    assert "to rank 3's file" in paths["vllm"].read_text()
    assert "to rank 3's file" not in (tmp_path / "vllm-rank-2.log").read_text()


def test_verbose_is_a_flag_of_the_trainer(monkeypatch):
    import canoe

    seen = []
    monkeypatch.setattr(canoe, "train", lambda cfg, resume, verbose=False: seen.append(verbose))
    canoe.main(["--config", str(Path(runtime.__file__).parent.parent / "recipes" / "smoke.toml"), "--verbose"])
    canoe.main(["--config", str(Path(runtime.__file__).parent.parent / "recipes" / "smoke.toml")])
    assert seen == [True, False]
