"""Config loading and validation, and the driver's small pure helpers (no launcher, no vLLM)."""

from __future__ import annotations

import dataclasses
import math
import os
import re
import subprocess
import sys
import tomllib
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

import canoe
from training import optimizer
from training import preflight
from config import Config, ConfigError, describe_config, load_config
from test_sleep_order import process_group, tiny_model  # noqa: F401

ROOT = Path(__file__).resolve().parent.parent


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "config.toml"
    path.write_text(text)
    return path


def test_shipped_configs_load(isolated_registry):
    paths = [ROOT / "config.toml", *sorted((ROOT / "recipes").glob("*.toml"))]
    assert len(paths) > 1  # the recipes were found: an empty glob would pass on config.toml alone
    for path in paths:
        load_config(path)  # raises ConfigError naming the file and the key


def test_the_plain_prompt_baseline_is_the_default_prompted_plainly():
    default, plain = load_config(ROOT / "config.toml"), load_config(ROOT / "recipes" / "plain-prompt.toml")
    assert plain.prompt_style() == {"system_prompt": "You are a helpful assistant.", "response_prefix": ""}
    assert (plain.model, plain.eval_file, plain.max_prompt_tokens, plain.max_completion_tokens, plain.seed) == (
        default.model, default.eval_file, default.max_prompt_tokens, default.max_completion_tokens, default.seed)


def test_defaults_are_the_papers():
    cfg = Config()
    assert (cfg.num_generations, cfg.beta, cfg.learning_rate, cfg.temperature) == (7, 0.04, 1e-6, 0.9)
    assert (cfg.prompts_per_device, cfg.gradient_accumulation_steps, cfg.zero_stage) == (2, 8, 2)
    assert cfg.rewards == {"accuracy": 1.0, "format": 1.0, "influence": 1.0, "length": 1.0}
    # the loss options are off: CANOE's objective, one update per rollout
    assert (cfg.num_iterations, cfg.importance_cap, cfg.ratio_level, cfg.advantage_std) == (1, 0.0, "token", "unbiased")
    assert (cfg.clip_eps_low, cfg.clip_eps_high, cfg.aggregation) == (0.2, 0.2, "seq-mean-token-mean")
    assert not cfg.mask_truncated and not cfg.skip_zero_variance_groups


@pytest.mark.parametrize(
    "text, message",
    [
        ("num_generation = 7\n", "unknown key 'num_generation' (did you mean num_generations"),
        ("learning_rat = 1e-6\n", "unknown key 'learning_rat'"),
        ('num_generations = "7"\n', "key 'num_generations' must be int, got str"),
        ("num_generations = 7.0\n", "key 'num_generations' must be int, got float"),
        ("dual = 1\n", "key 'dual' must be bool, got int"),
        ("beta = true\n", "key 'beta' must be float, got bool"),
        ("num_generations = 1\n", "num_generations = 1: GRPO needs at least 2 samples"),
        ("prompts_per_device = 0\n", "prompts_per_device = 0: must be at least 1"),
        ("zero_stage = 1\n", "zero_stage = 1: must be one of (2, 3)"),
        ('aggregation = "mean"\n', "aggregation = 'mean': must be one of"),
        ("[rewards]\naccuracy = 1.0\nbogus = 1.0\n", "rewards = {'accuracy': 1.0, 'bogus': 1.0}: unknown ['bogus']"),
        ('[rewards]\naccuracy = "1"\n', "the weight of ['accuracy'] must be a number"),
        ("[rewards]\naccuracy = true\n", "the weight of ['accuracy'] must be a number"),
        ("rewards = 1.0\n", "key 'rewards' must be dict, got float"),
        ("num_iterations = 0\n", "num_iterations = 0: must be at least 1"),
        ("importance_cap = -1.0\n", "importance_cap = -1.0: must not be negative"),
        ('ratio_level = "group"\n', "ratio_level = 'group': must be one of ('token', 'sequence')"),
        ('advantage_std = "mad"\n', "advantage_std = 'mad': must be one of ('unbiased', 'biased', 'none')"),
        ("mask_truncated = 1\n", "key 'mask_truncated' must be bool, got int"),
        ("learning_rate = 0.0\n", "learning_rate = 0.0: must lie in (0, 1)"),
        ("temperature = 0.0\n", "temperature = 0.0: must be positive"),
        ("max_steps = 0\nnum_epochs = 0.0\n", "num_epochs = 0.0: with max_steps = 0 this must be positive"),
        ("num_generations = \n", "is not valid TOML"),
    ],
)
def test_bad_config_names_the_key(tmp_path, text, message):
    with pytest.raises(ConfigError) as error:
        load_config(write(tmp_path, text))
    assert message in str(error.value)


def test_missing_config_file(tmp_path):
    with pytest.raises(ConfigError, match="does not exist"):
        load_config(tmp_path / "nope.toml")


def test_base_supplies_the_keys_a_recipe_leaves_out(tmp_path):
    write(tmp_path, 'beta = 0.1\nlearning_rate = 1e-5\n[rewards]\naccuracy = 1.0\nformat = 1.0\n')
    (tmp_path / "recipes").mkdir()
    recipe = tmp_path / "recipes" / "r.toml"
    recipe.write_text('base = "../config.toml"\nlearning_rate = 2e-5\n[rewards]\nformat = 0.5\n')
    cfg = load_config(recipe)
    assert (cfg.beta, cfg.learning_rate) == (0.1, 2e-5)  # the base's key kept, the recipe's key wins
    assert cfg.rewards == {"format": 0.5}  # a table replaces the base's whole


@pytest.mark.parametrize(
    "text, message",
    [
        ('base = "missing.toml"\n', "missing.toml does not exist"),
        ('base = "config.toml"\n', "`base` leads back to itself"),
        ("base = 1\n", "'base' must be a path (a string), got 1"),
    ],
)
def test_bad_base(tmp_path, text, message):
    with pytest.raises(ConfigError, match=re.escape(message)):
        load_config(write(tmp_path, text))


def test_examples_are_pairs_of_text_set_instead_of_the_single_example(tmp_path):
    cfg = load_config(write(tmp_path, 'examples = [["P1", "R1"], ["P2", "R2"]]\n'))
    assert cfg.prompt_style()["examples"] == (("P1", "R1"), ("P2", "R2")) and "example" not in cfg.prompt_style()
    for text in ('examples = [["P1"]]\n', 'examples = [["P1", ""]]\n', 'examples = ["P1", "R1"]\n',
                 'examples = [["P1", "R1"]]\nexample_problem = "P"\nexample_response = "R"\n'):
        with pytest.raises(ConfigError, match="examples = .*pairs of text"):
            load_config(write(tmp_path, text))


def test_ints_are_accepted_for_floats_and_config_is_frozen(tmp_path):
    cfg = load_config(write(tmp_path, "beta = 0\nlearning_rate = 1e-5\n"))
    assert cfg.beta == 0.0 and isinstance(cfg.beta, float)
    with pytest.raises(dataclasses.FrozenInstanceError, match="cannot assign to field 'beta'"):
        cfg.beta = 1.0  # type: ignore[misc]


def test_describe_config_lists_every_key():
    text = describe_config()
    for name in Config.__dataclass_fields__:
        assert f"\n{name} = " in "\n" + text, name
    for name in ("num_iterations", "importance_cap", "mask_truncated", "ratio_level", "skip_zero_variance_groups"):
        assert f"\n{name} = " in "\n" + text, name
    advantage_std = next(line for line in text.splitlines() if line.startswith("advantage_std = "))
    assert "none" in advantage_std
    # the rewards default is written as a TOML inline table, which loads back to the same value
    line = next(line for line in text.splitlines() if line.startswith("rewards = "))
    assert tomllib.loads(line.split("#")[0])["rewards"] == Config().rewards


def test_rewards_table_sets_names_and_weights(tmp_path):
    cfg = load_config(write(tmp_path, "[rewards]\naccuracy = 2\nformat = 0.5\n"))
    assert cfg.rewards == {"accuracy": 2, "format": 0.5}


def run_canoe(tmp_path: Path, config_text: str) -> subprocess.CompletedProcess:
    # a run that gets far enough writes its output folder: never the repository's runs/default
    config = write(tmp_path, f'output_dir = "{tmp_path / "run"}"\n' + config_text)
    return subprocess.run([sys.executable, str(ROOT / "canoe.py"), "--config", str(config)], cwd=ROOT,
                          capture_output=True, text=True, timeout=300)


def train_in_process(tmp_path: Path, config_text: str) -> str:
    """canoe.py's command line run in this process on a config that must stop before training starts; returns
    the message it exits with (what `python canoe.py` prints on stderr before exiting with status 1)."""
    from training import cli

    config = write(tmp_path, f'output_dir = "{tmp_path / "run"}"\n' + config_text)
    with pytest.raises(SystemExit) as stopped:
        cli.main(["--config", str(config)], canoe.train)
    assert not (tmp_path / "run").exists()  # stopped before anything was written
    return str(stopped.value.code)


def test_a_reward_file_registers_its_rewards_for_the_configs_that_name_it(tmp_path, isolated_registry):
    idea = tmp_path / "idea.py"
    idea.write_text("from rewards import REWARD_FUNCS\nREWARD_FUNCS['short'] = lambda completions, **kw: [1.0]\n")
    rewards = "\n[rewards]\naccuracy = 1.0\nshort = 0.5\n"
    cfg = load_config(write(tmp_path, f"reward_files = [{str(idea)!r}]{rewards}"))
    assert cfg.rewards == {"accuracy": 1.0, "short": 0.5} and isolated_registry["short"]([]) == [1.0]
    # loaded once in this process, it is still not known to a config that does not name it, as in the trainer
    with pytest.raises(ConfigError, match=r"rewards = .*: unknown \['short'\]; known: \[.*\] \(a new reward is "
                                          r"registered in a file the config names in reward_files"):
        load_config(write(tmp_path, rewards))
    with pytest.raises(ConfigError, match=r"reward_files: 'ideas/nowhere\.py': no such file \(paths are from the "
                                          r"repository root\)"):
        load_config(write(tmp_path, 'reward_files = ["ideas/nowhere.py"]' + rewards))
    for text, why in (("REWARD_FUNCS['format'] = len", r"replaces the registered \['format'\]: give it a name of"),
                      ("X = 1", r"registers no reward")):
        other = tmp_path / f"other{len(why)}.py"
        other.write_text(f"from rewards import REWARD_FUNCS\n{text}\n")
        with pytest.raises(ConfigError, match=f"reward_files: {other}: {why}"):
            load_config(write(tmp_path, f"reward_files = [{str(other)!r}]{rewards}"))
    assert isolated_registry["format"].__name__ == "format_reward"  # the refused file's registration is undone


def test_missing_model_path_is_a_clear_error(tmp_path):
    message = train_in_process(tmp_path, f'model = "{tmp_path}/no-model"\n')
    assert message == f"error: model path '{tmp_path}/no-model' is not a Hugging Face model folder"


def test_missing_data_path_is_a_clear_error(tmp_path):
    message = train_in_process(tmp_path, f'model = "{ROOT / "models" / "smoke-llama"}"\ntrain_file = "{tmp_path}/none.jsonl"\n')
    assert message == f"error: data file '{tmp_path}/none.jsonl' does not exist"


@pytest.mark.skipif(not (ROOT / "models" / "smoke-llama").exists(), reason="needs `make setup`")
def test_malformed_data_line_is_reported_with_its_line_number(tmp_path):
    data = tmp_path / "bad.jsonl"
    data.write_text('{"problem": "<context>a</context>\\n\\nq", "solution": "<answer>a</answer>"}\n{"problem": 3}\n')
    result = run_canoe(tmp_path, f'model = "models/smoke-llama"\ntrain_file = "{data}"\nmax_steps = 1\n')
    assert result.returncode != 0
    assert f"{data}:2:" in result.stderr and "Traceback" not in result.stderr


def test_unknown_key_from_the_command_line(tmp_path):
    message = train_in_process(tmp_path, "G = 7\n")
    assert message.startswith("error: ") and "unknown key 'G'" in message


# --- small pure helpers of the driver


def test_deepspeed_batch_arithmetic():
    cfg = Config(prompts_per_device=2, gradient_accumulation_steps=8, num_generations=7)
    ds = optimizer.deepspeed_config(cfg, world_size=4, dtype=torch.float32, train=True)
    assert ds["train_micro_batch_size_per_gpu"] == 14
    assert ds["train_batch_size"] == 14 * 8 * 4
    assert ds["zero_optimization"]["stage"] == 2 and ds["gradient_clipping"] == 1.0
    assert ds["optimizer"]["params"]["torch_adam"] is True and ds["optimizer"]["params"]["fused"] is True
    reference = optimizer.deepspeed_config(Config(zero_stage=3), world_size=1, dtype=torch.float32, train=False)
    assert "optimizer" not in reference and reference["zero_optimization"]["stage"] == 3


def test_the_optimizer_is_torchs_fused_adamw_on_a_gpu_too(monkeypatch):
    """DeepSpeed's FusedAdam compiles a CUDA kernel at first use (nvcc needed); with `torch_adam` DeepSpeed's own
    selection (engine.py, `DeepSpeedEngine.get_optimizer_configuration`, called as it is here) returns torch's AdamW, and `fused` reaches it."""
    from deepspeed.ops.adam import FusedAdam
    from deepspeed.runtime.engine import DeepSpeedEngine

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)  # the config as a GPU machine builds it
    params = dict(optimizer.deepspeed_config(Config(), world_size=8, dtype=torch.bfloat16, train=True)["optimizer"]["params"])
    engine = SimpleNamespace(zero_use_cpu_optimizer=lambda: False)  # what the method reads besides its arguments
    chosen, extra = DeepSpeedEngine.get_optimizer_configuration(engine, params, True)
    assert chosen is torch.optim.AdamW and params["fused"] is True and "torch_adam" not in params
    # without the keys DeepSpeed would take its own kernel: the keys are what decide
    plain = {"lr": 1e-6, "betas": [0.9, 0.999], "eps": 1e-8, "weight_decay": 0.0}
    assert DeepSpeedEngine.get_optimizer_configuration(engine, plain, True)[0] is FusedAdam
    # with the optimizer on the host, DeepSpeed's CPU Adam: the keys are left out
    offload = optimizer.deepspeed_config(Config(offload_optimizer=True), world_size=8, dtype=torch.bfloat16, train=True)
    assert "torch_adam" not in offload["optimizer"]["params"]


def test_learning_rate_schedule_is_canoes():
    """⌈ratio · steps⌉ warm-up steps at step / warmup (the first update's rate is 0), as Hugging Face's trainer."""
    def factors(cfg, total_steps, steps):
        sgd = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=1.0)
        return [optimizer.lr_schedule(cfg, sgd, total_steps).lr_lambdas[0](step) for step in steps]

    # 0.1 × 100 = 10 warm-up steps; cosine over the 90 after them: halfway (step 55) at 0.5, 0 at the end
    assert factors(Config(warmup_ratio=0.1, lr_scheduler="cosine"), 100, [0, 5, 10, 55, 100]) == pytest.approx(
        [0.0, 0.5, 1.0, 0.5 * (1 + math.cos(math.pi * 0.5)), 0.0], abs=1e-12)
    # the default: 0.05 × 24 = 1.2, rounded up to 2 warm-up steps (0, 1/2), then constant
    assert factors(Config(warmup_ratio=0.05, lr_scheduler="constant"), 24, [0, 1, 2, 23]) == [0.0, 0.5, 1.0, 1.0]
    assert factors(Config(warmup_ratio=0.0, lr_scheduler="constant"), 10, [0, 7]) == [1.0, 1.0]


@pytest.mark.skipif(not (ROOT / "models" / "smoke-llama").exists(), reason="needs `make setup`")
def test_batch_larger_than_the_data_is_a_clear_error(tmp_path):
    data = tmp_path / "one.jsonl"
    data.write_text('{"problem": "<context>a b c</context>\\n\\nq?", "solution": "<answer>a</answer>"}\n')
    result = run_canoe(tmp_path, f'model = "models/smoke-llama"\ntrain_file = "{data}"\nprompts_per_device = 2\n'
                                 "gradient_accumulation_steps = 1\nmax_steps = 1\n")
    assert result.returncode != 0 and "Traceback" not in result.stderr
    assert "error: prompts_per_device × gradient_accumulation_steps × ranks = 2 × 1" in result.stderr
    assert "cannot fill one global batch" in result.stderr


def test_check_fits_refuses_a_model_too_large_for_the_host():
    with pytest.raises(SystemExit, match=r"needs about .* GiB of host memory per rank"):
        preflight.check_fits(Config(), num_parameters=10**12, dtype=torch.float32)
    preflight.check_fits(Config(), num_parameters=10**6, dtype=torch.float32)  # a small one passes


def test_host_memory_count_with_lora_holds_one_copy_less_and_adam_for_the_adapters_only():
    P, T, gib = 10**9, 10**6, 2**30
    full = preflight.host_bytes_needed(Config(), P, P, torch.float32, world_size=1)
    lora = preflight.host_bytes_needed(Config(lora_rank=8), P, T, torch.float32, world_size=1)
    # full: policy, vLLM and reference copies, gradients, 12 bytes of AdamW per parameter, 1 GiB of KV cache
    assert full == 4 * P * 3 + 4 * P + 12 * P + gib
    # LoRA: no reference copy; gradients and AdamW for the T adapter parameters only
    assert lora == 4 * P * 2 + 4 * T + 12 * T + gib


def fake_run(cfg: Config, tmp_path: Path):
    """What canoe.reward_metrics reads of a Run: the config, a grader's counters, the output folder
    and the phase times."""
    from types import SimpleNamespace

    return SimpleNamespace(cfg=cfg, grader=SimpleNamespace(timeouts=0, errors=0), out=tmp_path, times={})


def test_score_passes_the_union_of_the_rows_fields(tmp_path, monkeypatch):
    """Rows with different optional fields: each reaches the rewards, None where a row lacks it (the first row's
    keys alone raised KeyError for `hint`, and never passed `source`, which only the second row has)."""
    from types import SimpleNamespace

    import rewards

    seen = {}

    def spy(completions, **kwargs):
        seen.update(kwargs)
        return [0.0] * len(completions)

    monkeypatch.setitem(rewards.REWARD_FUNCS, "spy", spy)
    rows = [{"problem": "<context>a</context>\n\nq", "solution": "<answer>a</answer>", "hint": "h", "prompt_ids": [1]},
            {"problem": "<context>b</context>\n\nq", "solution": "<answer>b</answer>", "source": "s", "prompt_ids": [2]}]
    cfg = Config(num_generations=2, rewards={"spy": 1.0})
    completion = SimpleNamespace(text="<answer>a</answer>")
    per_reward = rewards.score(cfg.rewards, rows, [completion] * 4, [None] * 4, cfg.num_generations)
    assert seen["hint"] == ["h", "h", None, None]
    assert seen["source"] == [None, None, "s", "s"]
    assert "prompt_ids" not in seen and per_reward.shape == (4, 1)


def test_score_logs_the_share_of_groups_where_each_reward_varies(tmp_path, monkeypatch):
    from types import SimpleNamespace

    import rewards

    # B = 3 groups of G = 2: "a" varies in groups 0 and 2, "b" in none
    monkeypatch.setitem(rewards.REWARD_FUNCS, "a", lambda completions, **kw: [1.0, 0.0, 1.0, 1.0, 0.0, 1.0])
    monkeypatch.setitem(rewards.REWARD_FUNCS, "b", lambda completions, **kw: [1.0] * 6)
    rows = [{"problem": "<context>x</context>\n\nq", "solution": "<answer>x</answer>"}] * 3
    cfg = Config(num_generations=2, rewards={"a": 1.0, "b": 0.5})
    completion = SimpleNamespace(text="<answer>x</answer>")
    run = fake_run(cfg, tmp_path)
    before = canoe.reward_counts(run)
    per_reward = rewards.score(cfg.rewards, rows, [completion] * 6, [None] * 6, cfg.num_generations)  # (6, 2)
    means = canoe.reward_metrics(run, SimpleNamespace(rows=rows, completions=[completion] * 6, scores=per_reward),
                                 before)
    assert means["signal/a"] == pytest.approx(2 / 3) and means["signal/b"] == 0.0
    assert means["reward/a"] == pytest.approx(4 / 6)


@pytest.mark.parametrize("field", preflight.REWARD_KEYWORDS)
def test_a_data_field_named_like_a_reward_keyword_is_refused(field):
    rows = [{"problem": "p", "solution": "s"}, {"problem": "p", "solution": "s", field: 1}]
    with pytest.raises(canoe.data.DataError, match=f"train.jsonl: field '{field}' has the name of a keyword"):
        preflight.check_reward_fields(rows, "train.jsonl")
    preflight.check_reward_fields(rows[:1], "train.jsonl")  # no clash: nothing raised


# --- the GPU path's set-up


def test_the_policy_loads_in_the_training_dtype_with_what_deepspeed_would_have_made_of_float32(tmp_path, process_group):
    """Loading in bfloat16 gives DeepSpeed's engine the same parameters and float32 buffers as loading in float32
    and letting the engine cast (engine.py, `DeepSpeedEngine._configure_distributed_model`), without the float32 copy on the host."""
    import deepspeed

    tiny_model().save_pretrained(tmp_path)
    assert next(canoe.load_policy(str(tmp_path), torch.float32).parameters()).dtype == torch.float32  # the CPU run
    engines = []
    for load_dtype in (torch.float32, torch.bfloat16):
        model = canoe.load_policy(str(tmp_path), load_dtype)
        engine, *_ = deepspeed.initialize(model=model, model_parameters=list(model.parameters()),
                                          config=optimizer.deepspeed_config(Config(), 1, torch.bfloat16, train=True))
        engines.append(engine.module)
    cast, loaded = engines
    assert {p.dtype for p in loaded.parameters()} == {torch.bfloat16}
    assert all(torch.equal(a, b) for a, b in zip(cast.parameters(), loaded.parameters()))
    buffers = dict(loaded.named_buffers())
    assert buffers and all(buffers[n].dtype == torch.float32 and torch.equal(b, buffers[n])
                           for n, b in cast.named_buffers())


def test_the_process_group_timeout_is_the_configs(monkeypatch, tmp_path):
    """DeepSpeed's group times out after 10 minutes by default (deepspeed/constants.py, `default_pg_timeout`); a checkpoint's
    policy/ written by rank 0 on slow storage keeps the other ranks in a barrier longer than that."""
    import datetime

    from plumbing import runtime
    from deepspeed import constants

    assert constants.default_pg_timeout == datetime.timedelta(minutes=int(os.environ.get("DEEPSPEED_TIMEOUT", 10)))
    seen = []
    monkeypatch.setattr(runtime.deepspeed, "init_distributed", lambda **kwargs: seen.append(kwargs))
    monkeypatch.setattr(runtime.dist, "is_initialized", lambda: False)  # an earlier test's group may still be up
    monkeypatch.setattr(runtime.dist, "get_rank", lambda: 0)
    monkeypatch.setattr(runtime.dist, "get_world_size", lambda: 1)
    assert runtime.init_distributed(Config().dist_timeout_minutes) == (0, 1)
    assert seen == [{"timeout": datetime.timedelta(minutes=60)}]
    with pytest.raises(ConfigError, match="dist_timeout_minutes"):
        load_config(write(tmp_path, "dist_timeout_minutes = 0\n"))
