# Shared helpers for scripts/*; sourced, never run.
# shellcheck shell=bash

GPUNODE_ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
GPUNODE_CACHE=${GPUNODE_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/gpunode}
GPUNODE_VENV=${GPUNODE_VENV:-$GPUNODE_ROOT/.venv}
GPUNODE_IMAGE_REPO=${GPUNODE_IMAGE_REPO:-localhost/gpunode-node}
export GPUNODE_ROOT GPUNODE_CACHE GPUNODE_VENV GPUNODE_IMAGE_REPO

_t0=${_t0:-$(date +%s)}

step() { printf '\n\033[1m==> %s\033[0m  (+%ss)\n' "$*" "$(( $(date +%s) - _t0 ))"; }
info() { printf '    %s\n' "$*"; }
die() { printf '\033[31mERROR:\033[0m %s\n' "$*" >&2; exit 2; }

need_root() {
  [ "$(id -u)" = 0 ] || die "run as root: podman system containers and debootstrap need it on this machine kind"
}

# apt-get install only what is missing, so a second run does no network work.
apt_ensure() {
  local missing=() p
  for p in "$@"; do
    [ "$(dpkg-query -W -f='${Status}' "$p" 2>/dev/null)" = "install ok installed" ] || missing+=("$p")
  done
  [ ${#missing[@]} -eq 0 ] && return 0
  info "apt-get install ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq >/dev/null
  apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
}

# Wait up to 30 s for systemd in container $1 to finish booting; prints its state (running, degraded, or
# whatever it was stuck at when time ran out).
wait_systemd() {
  local state=""
  for _ in $(seq 1 30); do
    state=$(podman exec "$1" systemctl is-system-running 2>/dev/null || true)
    case "$state" in running|degraded) break ;; esac
    sleep 1
  done
  printf '%s\n' "$state"
}

# newest_file GLOB...: the most recently written of the files the expanded globs name, or nothing. (Not
# `ls | head`: under pipefail an early-exiting reader can fail the pipe.)
newest_file() {
  local f best=""
  for f in "$@"; do
    [ -e "$f" ] || continue
    { [ -z "$best" ] || [ "$f" -nt "$best" ]; } && best=$f
  done
  [ -z "$best" ] || printf '%s\n' "$best"
}

# build_hostcheck_wheel DIR: the hostcheck wheel into DIR, without an index (the running Python's setuptools
# builds it) and from a copy of the sources, so the checkout gets no build/ or egg-info.
build_hostcheck_wheel() {
  local src
  src=$(mktemp -d)
  cp -R "$GPUNODE_ROOT/pyproject.toml" "$GPUNODE_ROOT/README.md" "$GPUNODE_ROOT/hostcheck" "$src/"
  PIP_NO_INDEX=1 python -m pip wheel -q --disable-pip-version-check --no-deps --no-build-isolation -w "$1" "$src" ||
    { rm -rf "$src"; return 1; }
  rm -rf "$src"
}

# molecule and ansible-lint call ansible-config and friends by name.
export PATH="$GPUNODE_VENV/bin:$PATH"
