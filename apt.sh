#!/usr/bin/env bash
# apt.sh - first step of the course GPU VM setup (Ubuntu 22.04 / 24.04).
#   1. Keeps unattended-upgrades away from NVIDIA driver and kernel packages, so that
#      a nightly upgrade cannot leave the loaded driver and its libraries out of step.
#      This is a separate drop-in file; /etc/apt/apt.conf.d/50unattended-upgrades and
#      any other setting of yours is left alone.
#   2. apt-get update + installs the few base packages below that are still missing.
# Run:   sudo bash apt.sh             then: sudo bash nvidia-drivers-install.sh
#        bash apt.sh --dry-run        print every action, change nothing (no root needed)
#        bash apt.sh --help
# Safe to run again: files are rewritten only if their content differs, installed
# packages are skipped.
# For tests only: ROOT=DIR prefixes every path the script writes; SKIP_ROOT_CHECK=1
# skips the root check (the effective uid is read with `id -u`).
set -euo pipefail

usage() {
  cat <<'EOF'
Usage: sudo bash apt.sh [--dry-run]
  --dry-run, -n  print every action (DRY-RUN: ...) and change nothing; no root needed
  --help, -h     this help
Blacklists nvidia-/linux- packages in unattended-upgrades (drop-in file), runs
apt-get update and installs the missing base packages of the course.
EOF
}

DRY_RUN=0
for arg in "$@"; do
  case "$arg" in
    -n|--dry-run) DRY_RUN=1 ;;
    -h|--help) usage; exit 0 ;;
    *) echo "apt.sh: unknown argument: $arg (see: bash apt.sh --help)" >&2; exit 2 ;;
  esac
done

if [ "$DRY_RUN" = 0 ] && [ "${SKIP_ROOT_CHECK:-0}" != 1 ] && [ "$(id -u)" != 0 ]; then
  echo "apt.sh: must be run as root: sudo bash apt.sh (or try: bash apt.sh --dry-run)" >&2
  exit 1
fi

# apt.conf(5): list entries given again in a later file are appended, not replaced, so
# this drop-in adds to whatever Package-Blacklist 50unattended-upgrades already has.
# unattended-upgrades treats each entry as a Python regex tested with re.match, i.e.
# anchored at the start of the package name: "nvidia-" already means "starts with".
# The explicit "^" keeps that meaning should a version ever use re.search, where
# "linux-" would also match e.g. "util-linux-extra". libnvidia-* (user-space driver
# libraries) is listed too: upgraded alone it gives "Driver/library version mismatch".
BLACKLIST_FILE="${ROOT:-}/etc/apt/apt.conf.d/51course-nvidia-linux-blacklist"
BLACKLIST_CONTENT='// Written by the course apt.sh: no unattended upgrades of the NVIDIA driver
// or the kernel (upgrade them by hand, then reboot). Delete this file to undo.
Unattended-Upgrade::Package-Blacklist {
    "^nvidia-";
    "^libnvidia-";
    "^linux-";
};'

# Base packages. The first five are the original article's (apt-transport-https is
# a transitional package since apt 1.5, kept because it costs nothing); then:
# python3-venv + python3-pip for the course virtualenv (PEP 668: no system-wide pip),
# git to clone the course, build-essential for DKMS (driver build) and Triton's JIT.
PACKAGES=(apt-transport-https ca-certificates curl software-properties-common pwgen
          python3-venv python3-pip git build-essential)

export DEBIAN_FRONTEND=noninteractive
APT_OPTS=(-o DPkg::Lock::Timeout=300)  # wait for cloud-init / unattended-upgrades

run() {  # run a command, or only print it in dry-run mode
  if [ "$DRY_RUN" = 1 ]; then echo "DRY-RUN: $*"; else echo "+ $*"; "$@"; fi
}

is_installed() {
  # shellcheck disable=SC2016  # ${Status} is a dpkg-query field, not a shell variable
  [ "$(dpkg-query -W -f='${Status}' "$1" 2>/dev/null)" = "install ok installed" ]
}

write_file() {  # write_file PATH CONTENT: (re)write PATH only if its content differs
  local path=$1 content=$2 tmp
  if [ -f "$path" ] && [ "$(cat "$path")" = "$content" ]; then
    echo "ok: $path is up to date"
  elif [ "$DRY_RUN" = 1 ]; then
    echo "DRY-RUN: write $path"
    printf '%s\n' "$content" | sed 's/^/    /'
  else
    echo "+ write $path"
    mkdir -p "$(dirname "$path")"
    tmp=$(mktemp "$(dirname "$path")/.tmp.XXXXXX")
    printf '%s\n' "$content" >"$tmp"
    chmod 0644 "$tmp"
    mv -f "$tmp" "$path"
  fi
}

if [ "$DRY_RUN" = 1 ]; then echo "DRY-RUN: nothing below is executed or written"; fi

write_file "$BLACKLIST_FILE" "$BLACKLIST_CONTENT"

missing=()
for pkg in "${PACKAGES[@]}"; do
  if is_installed "$pkg"; then echo "ok: $pkg is already installed"; else missing+=("$pkg"); fi
done
if [ "${#missing[@]}" -gt 0 ]; then
  run apt-get update "${APT_OPTS[@]}"
  run apt-get install -y "${APT_OPTS[@]}" "${missing[@]}"
else
  echo "ok: all base packages are installed (apt-get update not needed)"
fi

echo "apt.sh done. Next: sudo bash nvidia-drivers-install.sh"
