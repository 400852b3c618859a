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

SCRIPT=apt.sh
# shellcheck source-path=SCRIPTDIR source=setup-common.sh
source "$(dirname "${BASH_SOURCE[0]}")/setup-common.sh"
parse_args "$@"

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

write_file "$BLACKLIST_FILE" "$BLACKLIST_CONTENT"

apt_install "${PACKAGES[@]}"

echo "apt.sh done. Next: sudo bash nvidia-drivers-install.sh"
