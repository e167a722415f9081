#!/usr/bin/env bash
# Remove what installer/linux/install.sh made: autostart entry, app-menu entry, ~/.local/bin link,
# the install folder (venv). Models, config and logs stay unless --purge.
# Steps mirrored by engine/desktop/install_plan.py UNINSTALL_STEPS["linux"].
set -euo pipefail

PREFIX="${XDG_DATA_HOME:-$HOME/.local/share}/deepinfer"
PURGE=0
while [ $# -gt 0 ]; do
  case "$1" in
    --prefix) PREFIX="${2:?--prefix needs a folder}"; shift ;;
    --purge) PURGE=1 ;;
    -h|--help) echo "usage: uninstall.sh [--prefix DIR] [--purge (also delete models, config, logs)]"; exit 0 ;;
    *) echo "error: unknown option $1" >&2; exit 2 ;;
  esac
  shift
done
say() { printf '==> %s\n' "$*"; }
VPY="$PREFIX/venv/bin/python"
DATA_DIRS=()
if [ -x "$VPY" ]; then  # ask the install where its data lives before deleting it
  while IFS= read -r d; do DATA_DIRS+=("$d"); done < <("$VPY" -c 'from engine import paths; print(paths.models_dir()); print(paths.config_dir()); print(paths.log_dir())' 2>/dev/null || true)
fi

# step: autostart
if [ -x "$PREFIX/venv/bin/deepinfer" ]; then "$PREFIX/venv/bin/deepinfer" autostart disable >/dev/null 2>&1 || true; fi
rm -f "${XDG_CONFIG_HOME:-$HOME/.config}/autostart/deepinfer.desktop"
say "autostart: removed"

# step: shortcut
rm -f "${XDG_DATA_HOME:-$HOME/.local/share}/applications/deepinfer.desktop"
say "shortcut: removed"

# step: launcher
LAUNCHER="$HOME/.local/bin/deepinfer"
if [ -L "$LAUNCHER" ] && [[ "$(readlink "$LAUNCHER")" == "$PREFIX"/* ]]; then rm -f "$LAUNCHER"; say "launcher: removed"; fi

# step: venv
# only what install.sh made: --prefix may be a folder that also holds the user's data
if [ -f "$PREFIX/.deepinfer-install" ]; then
  rm -rf "$PREFIX/venv" "$PREFIX/.deepinfer-install"
  rmdir "$PREFIX" 2>/dev/null || true
  say "install: removed $PREFIX/venv"
elif [ -e "$PREFIX" ]; then
  echo "warning: $PREFIX has no .deepinfer-install marker; not deleting it" >&2
fi

# step: purge
if [ $PURGE = 1 ]; then
  for d in ${DATA_DIRS[@]+"${DATA_DIRS[@]}"}; do
    if [ -z "$d" ] || [ ! -d "$d" ]; then continue; fi
    case "$d" in
      *[Dd]eep[Ii]nfer*) rm -rf "$d"; say "purged: $d" ;;
      *) say "not deleting $d (a folder you chose via DEEPINFER_*; delete it yourself)" ;;
    esac
  done
elif [ ${#DATA_DIRS[@]} -gt 0 ]; then
  say "kept your models/config/logs: ${DATA_DIRS[*]} (uninstall.sh --purge deletes them)"
fi
