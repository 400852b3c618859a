#!/usr/bin/env bash
# nvidia-drivers-install.sh - second step of the course GPU VM setup (after apt.sh).
#   1. linux-headers-<version> for every installed kernel (`linux-version list`), so
#      DKMS can build the NVIDIA module for each kernel you may boot;
#   2. the NVIDIA driver (default below; override: NVIDIA_DRIVER_PACKAGE=nvidia-driver-580);
#   3. htop, python3-pip, python3-venv, git;
#   4. nvitop in its own venv /opt/nvitop, linked as /usr/local/bin/nvitop.
# Run:   sudo bash nvidia-drivers-install.sh        then reboot: sudo reboot
#        bash nvidia-drivers-install.sh --dry-run   print every action, change nothing
#        bash nvidia-drivers-install.sh --help
# Safe to run again: installed packages are skipped, a driver that is installed and
# answers nvidia-smi is left alone. (The course's Python packages come from pyproject.)
# For tests only: ROOT=DIR prefixes every path the script writes; SKIP_ROOT_CHECK=1
# skips the root check (the effective uid is read with `id -u`).
set -euo pipefail

usage() {
  cat <<'EOF'
Usage: sudo bash nvidia-drivers-install.sh [--dry-run]
  --dry-run, -n  print every action (DRY-RUN: ...) and change nothing; no root needed
  --help, -h     this help
Environment: NVIDIA_DRIVER_PACKAGE (default nvidia-driver-580-server-open),
             NVITOP_SPEC (pip requirement for nvitop, default: nvitop)
EOF
}

DRY_RUN=0
for arg in "$@"; do
  case "$arg" in
    -n|--dry-run) DRY_RUN=1 ;;
    -h|--help) usage; exit 0 ;;
    *) echo "nvidia-drivers-install.sh: unknown argument: $arg (see --help)" >&2; exit 2 ;;
  esac
done

if [ "$DRY_RUN" = 0 ] && [ "${SKIP_ROOT_CHECK:-0}" != 1 ] && [ "$(id -u)" != 0 ]; then
  echo "nvidia-drivers-install.sh: must be run as root: sudo bash $0 (or try --dry-run)" >&2
  exit 1
fi

# Default driver: the R580 production branch (the article's 510 is long end-of-life).
# R580 drives Hopper H100/H200, Ada (RTX 6000 Ada, L40S, L4), Ampere A100/A6000 and is
# what CUDA 13 requires. "-server": Canonical's datacenter (Enterprise Ready Driver) line,
# versioned like nvidia-fabricmanager for NVSwitch/HGX machines. "-open": NVIDIA's open
# kernel modules, its default since R560 for Turing and newer (and the only choice on
# Blackwell). On Volta or older use NVIDIA_DRIVER_PACKAGE=nvidia-driver-580-server.
DRIVER_PKG="${NVIDIA_DRIVER_PACKAGE:-nvidia-driver-580-server-open}"
# nvitop: pip refuses system-wide installs on Ubuntu 24.04 (PEP 668), and pipx (1.4 on
# 24.04) puts apps in root's home only, so it gets a venv of its own plus a symlink.
NVITOP_SPEC="${NVITOP_SPEC:-nvitop}"
NVITOP_VENV="${ROOT:-}/opt/nvitop"
NVITOP_LINK="${ROOT:-}/usr/local/bin/nvitop"

export DEBIAN_FRONTEND=noninteractive
APT_OPTS=(-o DPkg::Lock::Timeout=300)  # wait for cloud-init / unattended-upgrades
UPDATED=0

run() {  # run a command, or only print it in dry-run mode
  if [ "$DRY_RUN" = 1 ]; then echo "DRY-RUN: $*"; else echo "+ $*"; "$@"; fi
}

is_installed() {
  # shellcheck disable=SC2016  # ${Status} is a dpkg-query field, not a shell variable
  [ "$(dpkg-query -W -f='${Status}' "$1" 2>/dev/null)" = "install ok installed" ]
}

apt_install() {  # apt_install PKG...: install those not installed yet (one apt-get update first)
  local missing=() pkg
  for pkg in "$@"; do
    if is_installed "$pkg"; then echo "ok: $pkg is already installed"; else missing+=("$pkg"); fi
  done
  if [ "${#missing[@]}" -eq 0 ]; then return 0; fi
  if [ "$UPDATED" = 0 ]; then run apt-get update "${APT_OPTS[@]}"; UPDATED=1; fi
  run apt-get install -y "${APT_OPTS[@]}" "${missing[@]}"
}

if [ "$DRY_RUN" = 1 ]; then echo "DRY-RUN: nothing below is executed or written"; fi

# 1. Kernel headers for every installed kernel (linux-version comes with linux-base).
command -v linux-version >/dev/null 2>&1 || apt_install linux-base
KERNELS=()
if command -v linux-version >/dev/null 2>&1; then mapfile -t KERNELS < <(linux-version list); fi
# Fallback (dry run without linux-base, or no kernel image in /boot): the running kernel.
if [ "${#KERNELS[@]}" -eq 0 ]; then KERNELS=("$(uname -r)"); fi
RUNNING=$(uname -r)
for kernel in "${KERNELS[@]}"; do
  if [ "$kernel" = "$RUNNING" ]; then apt_install "linux-headers-$kernel"; continue; fi
  # An old kernel's headers may be gone from the archive: warn and go on.
  apt_install "linux-headers-$kernel" ||
    echo "WARNING: no linux-headers-$kernel: the driver will not be built for $kernel" >&2
done

# 2. The driver, unless it is installed and nvidia-smi already talks to it.
REBOOT=1
if is_installed "$DRIVER_PKG" && nvidia-smi >/dev/null 2>&1; then
  echo "ok: $DRIVER_PKG is installed and nvidia-smi works: driver left as it is"
  REBOOT=0
else
  apt_install "$DRIVER_PKG"
fi

# 3. Tools.
apt_install htop python3-pip python3-venv git

# 4. nvitop in /opt/nvitop.
if [ -x "$NVITOP_VENV/bin/nvitop" ]; then
  echo "ok: nvitop is already installed in $NVITOP_VENV"
else
  run python3 -m venv "$NVITOP_VENV"
  run "$NVITOP_VENV/bin/python" -m pip install "$NVITOP_SPEC"
fi
if [ "$(readlink "$NVITOP_LINK" 2>/dev/null || true)" = "$NVITOP_VENV/bin/nvitop" ]; then
  echo "ok: $NVITOP_LINK is in place"
else
  run mkdir -p "$(dirname "$NVITOP_LINK")"
  run ln -sfn "$NVITOP_VENV/bin/nvitop" "$NVITOP_LINK"
fi

if [ "$REBOOT" = 0 ]; then
  echo "Done. The NVIDIA driver is already running: no reboot needed. Try: nvitop"
elif [ "$DRY_RUN" = 1 ]; then
  echo "DRY-RUN: a reboot would be needed to load the driver. Reboot now: sudo reboot"
else
  echo "Done. Reboot now: sudo reboot   (then check: nvidia-smi; nvitop)"
fi
