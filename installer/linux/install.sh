#!/usr/bin/env bash
# DeepInfer installer for Linux (docs/install.md).
#
#   bash installer/linux/install.sh [--cpu] [--model SPEC | --no-model] [--autostart]
#
# Steps (mirrored by engine/desktop/install_plan.py STEPS["linux"]; each is marked `# step: NAME`):
#   python -> venv in <prefix>/venv -> torch (CUDA wheel for the driver's CUDA version, or CPU)
#   -> CuPy (cupy-cuda12x/13x) -> deepinfer from this checkout -> ~/.local/bin/deepinfer
#   -> model (pull, or export from Ollama / an HF folder) -> app-menu entry -> optional autostart.
# Run it again to upgrade in place. installer/linux/uninstall.sh removes it.
set -euo pipefail

SRC="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
PREFIX="${XDG_DATA_HOME:-$HOME/.local/share}/deepinfer"
CPU=0
MODEL=""
NO_MODEL=0
AUTOSTART=0
PYTHON=""
REUSE=""
SHORTCUT=1
WHEELS=""
[ "$(uname -s)" = Darwin ] && SHORTCUT=0  # no XDG menu on macOS (installer/macos/README.md)

usage() {
  cat <<EOF
usage: install.sh [options]
  --cpu               install the CPU build of torch (no GPU needed; slow for 3B/7B)
  --source DIR        install deepinfer from this checkout (default: $SRC)
  --prefix DIR        install root; the venv goes in DIR/venv (default: $PREFIX)
  --model SPEC        model to get: a known name (default qwen2.5-coder-0.5b), ollama:NAME
                      (e.g. ollama:qwen2.5:3b, exported to a w4 checkpoint), or an HF folder / .gguf
  --no-model          do not download or import a model now (run 'deepinfer pull' later)
  --autostart         start the tray at login (deepinfer autostart enable)
  --no-shortcut       no app-menu entry
  --wheels DIR        also look for wheels (torch, CuPy, ...) in DIR (pip --find-links): offline installs
  --python PY         Python 3.10+ interpreter for the venv (default: python3.12/3.11/3.10/python3)
  --reuse-python PY   reuse the packages of PY's environment (e.g. a venv or conda env that already
                      has torch): the new venv sees them and only deepinfer is installed
EOF
}

say() { printf '==> %s\n' "$*"; }
warn() { printf 'warning: %s\n' "$*" >&2; }
die() { printf 'error: %s\n' "$1" >&2; [ -n "${2:-}" ] && printf 'fix: %s\n' "$2" >&2; exit 1; }

while [ $# -gt 0 ]; do
  case "$1" in
    --cpu) CPU=1 ;;
    --source) SRC="$(cd "${2:?--source needs a folder}" && pwd)"; shift ;;
    --prefix) PREFIX="${2:?--prefix needs a folder}"; shift ;;
    --model) MODEL="${2:?--model needs a value}"; shift ;;
    --no-model) NO_MODEL=1 ;;
    --autostart) AUTOSTART=1 ;;
    --no-shortcut) SHORTCUT=0 ;;
    --wheels) WHEELS="$(cd "${2:?--wheels needs a folder}" && pwd)"; shift ;;
    --python) PYTHON="${2:?--python needs an interpreter}"; shift ;;
    --reuse-python) REUSE="${2:?--reuse-python needs an interpreter}"; shift ;;
    -h|--help) usage; exit 0 ;;
    *) usage >&2; die "unknown option $1" ;;
  esac
  shift
done
[ -f "$SRC/pyproject.toml" ] && [ -f "$SRC/engine/desktop/install_plan.py" ] ||
  die "$SRC is not a DeepInfer checkout" "pass --source DIR (the folder with pyproject.toml)"

# step: python
if [ -n "$REUSE" ]; then
  PYTHON="$("$REUSE" -c 'import sys; print(getattr(sys, "_base_executable", sys.executable))')" ||
    die "cannot run $REUSE" "pass a working python to --reuse-python"
fi
if [ -z "$PYTHON" ]; then
  for c in python3.12 python3.11 python3.10 python3; do
    if command -v "$c" >/dev/null 2>&1; then PYTHON="$(command -v "$c")"; break; fi
  done
fi
[ -n "$PYTHON" ] || die "no python3 found" "sudo apt install python3 python3-venv"
"$PYTHON" -c 'import sys; sys.exit(sys.version_info < (3, 10))' ||
  die "$PYTHON is $("$PYTHON" -V 2>&1); DeepInfer needs Python 3.10+" "install python3.11 and pass --python python3.11"
"$PYTHON" -c 'import venv, ensurepip' 2>/dev/null ||
  die "$PYTHON cannot create virtual environments" "sudo apt install python3-venv"
say "python: $PYTHON ($("$PYTHON" -V 2>&1))"

# step: venv
VENV="$PREFIX/venv"
VPY="$VENV/bin/python"
mkdir -p "$PREFIX"
printf 'source=%s\ndate=%s\n' "$SRC" "$(date -u +%FT%TZ)" > "$PREFIX/.deepinfer-install"
if [ -x "$VPY" ]; then
  say "venv: $VENV (exists, upgrading in place)"
else
  say "venv: $VENV"
  if [ -n "$REUSE" ]; then  # pip and setuptools come from the reused environment too
    "$PYTHON" -m venv --without-pip --system-site-packages "$VENV"
  else
    "$PYTHON" -m venv "$VENV"
  fi
fi
if [ -n "$REUSE" ]; then
  # a .pth file puts the reused environment's site-packages after the venv's own
  "$REUSE" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"]); print(sysconfig.get_paths()["platlib"])' |
    sort -u > "$("$VPY" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')/_deepinfer_reuse.pth"
fi
PIP=("$VPY" -m pip install --disable-pip-version-check)
[ -n "$WHEELS" ] && PIP+=(--find-links "$WHEELS")
BUILD=()  # the reused env's setuptools builds the package: no isolated build env to download
if [ -n "$REUSE" ] && "$VPY" -c 'import sys, setuptools; sys.exit(int(setuptools.__version__.split(".")[0]) < 68)' 2>/dev/null; then
  BUILD=(--no-build-isolation)
fi

# step: torch
# install_plan.py reads nvidia-smi's "CUDA Version: X.Y" and names the wheel (KEY=VALUE lines).
# Plain variables and while-read (no `declare -A`/mapfile): macOS ships bash 3.2.
T_VARIANT=cpu T_SPEC="" T_INDEX="" T_CUPY="" T_NOTE="" T_INDEX_OK=0
while IFS='=' read -r k v; do
  case "$k" in variant) T_VARIANT="$v" ;; spec) T_SPEC="$v" ;; index_url) T_INDEX="$v" ;;
               cupy) T_CUPY="$v" ;; note) T_NOTE="$v" ;; index_ok) T_INDEX_OK="$v" ;; esac
done < <("$PYTHON" "$SRC/engine/desktop/install_plan.py" torch $([ $CPU = 1 ] && echo --cpu))
[ -n "$T_NOTE" ] && say "torch: $T_NOTE"
if "$VPY" -c 'import sys, torch; sys.exit(0 if ("'"$T_VARIANT"'" == "cpu" or torch.version.cuda) else 1)' 2>/dev/null; then
  say "torch: $("$VPY" -c 'import torch; print(torch.__version__)') already present"
else
  # --extra-index-url: a local wheel (pip find-links) or the PyTorch index's +cpu/+cuXXX build wins
  # over PyPI's plain one (a local version label sorts higher).
  INDEX=(--extra-index-url "$T_INDEX")
  if [ "$T_INDEX_OK" != 1 ]; then
    warn "$T_INDEX is unreachable: taking $T_SPEC from local wheels / PyPI (on Linux PyPI's torch is a CUDA build)"
    INDEX=()
  fi
  say "torch: $T_SPEC ($T_VARIANT) from a wheel on disk or ${T_INDEX}"
  "${PIP[@]}" "$T_SPEC" ${INDEX[@]+"${INDEX[@]}"} ||
    die "torch install failed" "check the network, or install torch yourself and use --reuse-python"
fi

# step: cupy
if [ -n "$T_CUPY" ]; then
  say "cupy: $T_CUPY (custom CUDA kernels through NVRTC)"
  "${PIP[@]}" "$T_CUPY" || warn "CuPy install failed: the GPU kernels will be unavailable (deepinfer doctor)"
else
  say "cupy: not needed on the CPU path"
fi

# step: package
say "deepinfer: from $SRC"
"${PIP[@]}" ${BUILD[@]+"${BUILD[@]}"} "$SRC[tray]" || die "installing deepinfer failed" "see the pip error above"
DEEPINFER="$VENV/bin/deepinfer"

# step: launcher
LAUNCHER="$HOME/.local/bin/deepinfer"
mkdir -p "$(dirname "$LAUNCHER")"
ln -sfn "$DEEPINFER" "$LAUNCHER"
say "launcher: $LAUNCHER"
case ":$PATH:" in *":$HOME/.local/bin:"*) ;; *) warn "$HOME/.local/bin is not on PATH: add it, or run $DEEPINFER" ;; esac

# step: model
if [ $NO_MODEL = 1 ]; then
  say "model: skipped (--no-model); later: deepinfer pull"
else
  MODEL_CMD=()
  while IFS= read -r a; do MODEL_CMD+=("$a"); done < <("$VPY" -m engine.desktop.install_plan model-cmd "$MODEL")
  say "model: deepinfer ${MODEL_CMD[*]}"
  "$DEEPINFER" "${MODEL_CMD[@]}" || warn "getting the model failed; run later: deepinfer ${MODEL_CMD[*]}"
fi

# step: shortcut
APPS="${XDG_DATA_HOME:-$HOME/.local/share}/applications"
if [ $SHORTCUT = 1 ]; then
  mkdir -p "$APPS"
  cat > "$APPS/deepinfer.desktop" <<EOF
[Desktop Entry]
Type=Application
Name=DeepInfer
Comment=Local AI assistant (tray) and OpenAI-compatible endpoint on 127.0.0.1:18000
Exec="$DEEPINFER" tray
Terminal=false
Categories=Utility;Development;
EOF
  command -v update-desktop-database >/dev/null 2>&1 && update-desktop-database "$APPS" >/dev/null 2>&1 || true
  say "shortcut: $APPS/deepinfer.desktop"
fi

# step: autostart
if [ $AUTOSTART = 1 ]; then
  "$DEEPINFER" autostart enable
else
  say "autostart: off (enable with: deepinfer autostart enable)"
fi

say "done. Check the install with: deepinfer doctor"
