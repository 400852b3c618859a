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

SCRIPT=nvidia-drivers-install.sh
# shellcheck source-path=SCRIPTDIR source=setup-common.sh
source "$(dirname "${BASH_SOURCE[0]}")/setup-common.sh"
parse_args "$@"

# Default driver: the R580 production branch (the article's 510 is long end-of-life).
# R580 drives Hopper H100/H200, Ada (RTX 6000 Ada, L40S, L4), Ampere A100/A6000 and is
# what CUDA 13 requires. "-server": Canonical's datacenter (Enterprise Ready Driver) line,
# versioned like nvidia-fabricmanager for NVSwitch/HGX machines. "-open": NVIDIA's open
# kernel modules, its default since R560 for Turing and newer (and the only choice on
# Blackwell). On Volta or older use NVIDIA_DRIVER_PACKAGE=nvidia-driver-580-server.
DRIVER_PKG="${NVIDIA_DRIVER_PACKAGE:-nvidia-driver-580-server-open}"
if ! [[ "$DRIVER_PKG" =~ ^nvidia-driver-[0-9]+(-server)?(-open)?$ ]]; then
  die "NVIDIA_DRIVER_PACKAGE='$DRIVER_PKG' is not a driver package name such as nvidia-driver-580," \
      "nvidia-driver-580-open or nvidia-driver-580-server-open"
fi
nvidia_gpu_present || die "no NVIDIA GPU on this machine's PCI bus: there is nothing for the driver to drive"
# Secure Boot refuses kernel modules it cannot verify: a driver built here by DKMS must be signed with a
# key enrolled at the next boot (the package asks for a password and the firmware for it once).
if command -v mokutil >/dev/null 2>&1 && mokutil --sb-state 2>/dev/null | grep -q "SecureBoot enabled"; then
  echo "WARNING: Secure Boot is on: the driver's kernel module must be signed. If the install asks for a" \
       "password, choose one and enter it at the blue 'Enroll MOK' screen after the reboot, or the driver" \
       "will not load (nvidia-smi: no devices). Or turn Secure Boot off in the VM's firmware settings." >&2
fi
# nvitop: pip refuses system-wide installs on Ubuntu 24.04 (PEP 668), and pipx (1.4 on
# 24.04) puts apps in root's home only, so it gets a venv of its own plus a symlink.
NVITOP_SPEC="${NVITOP_SPEC:-nvitop}"
NVITOP_VENV="${ROOT:-}/opt/nvitop"
NVITOP_LINK="${ROOT:-}/usr/local/bin/nvitop"

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

# 2. The driver, unless nvidia-smi already talks to one: a working driver (a cloud image's own, say)
#    is replaced only when NVIDIA_DRIVER_PACKAGE names another package explicitly.
REBOOT=1
if nvidia-smi >/dev/null 2>&1 && { [ -z "${NVIDIA_DRIVER_PACKAGE:-}" ] || is_installed "$DRIVER_PKG"; }; then
  echo "ok: an NVIDIA driver is installed and nvidia-smi works: driver left as it is" \
       "(set NVIDIA_DRIVER_PACKAGE to install another)"
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
