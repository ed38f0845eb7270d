#!/usr/bin/env bash
# Creates .venv-trl at the repo root: a separate environment with TRL, used only by the step-time benchmark
# (bench/bench_step.py runs bench/trl_worker.py in it). The project itself never imports TRL.
#
#   bash bench/setup_trl.sh          # idempotent: a marker file records a finished install of these pins
#
# torch is pinned in the same pip call as trl, so pip resolves trl's dependencies around the local CPU wheel
# (/opt/wheels, `2.13.0+cpu`) instead of pulling a CUDA build. math-verify is added so that the project's
# rewards.py imports in this environment too. If anything brought torchvision/torchaudio/torchcodec built for
# another torch, they are removed: transformers would then fail at import (`operator torchvision::nms does not
# exist`).
set -euo pipefail
cd "$(dirname "$0")/.."

VENV=.venv-trl
TRL_VERSION=1.16.0
PINS=(
    "torch==2.13.0"
    "trl==${TRL_VERSION}"
    "peft==0.21.2"
    "math-verify[antlr4_13_2]==0.9.0"
    "latex2sympy2_extended==1.11.0"
)
MARKER="$VENV/.installed-trl-${TRL_VERSION}-peft"

if [[ -f "$MARKER" ]]; then
    echo "$VENV is ready (trl==${TRL_VERSION}); remove $MARKER to reinstall"
    exit 0
fi

start=$(date +%s)
# The interpreter of the project venv when there is one, so both workers run the same Python.
PYTHON=${PYTHON:-python3.11}
if [[ -x .venv/bin/python ]]; then
    PYTHON=$(.venv/bin/python -c 'import sys; print(sys._base_executable)')
fi
[[ -x "$VENV/bin/python" ]] || "$PYTHON" -m venv "$VENV"
"$VENV/bin/pip" install --quiet "${PINS[@]}"

# Wheels built against another torch break `import transformers` (operator torchvision::nms does not exist).
for pkg in torchvision torchaudio torchcodec; do
    if "$VENV/bin/pip" show --quiet "$pkg" >/dev/null 2>&1; then
        echo "removing $pkg (built for another torch)"
        "$VENV/bin/pip" uninstall --quiet --yes "$pkg"
    fi
done

"$VENV/bin/python" - <<'EOF'
import torch, transformers, trl
assert torch.__version__.startswith("2.13.0"), f"torch was replaced: {torch.__version__}"
print(f"torch {torch.__version__}, transformers {transformers.__version__}, trl {trl.__version__}")
EOF
touch "$MARKER"
echo "$VENV ready in $(( $(date +%s) - start )) s"
