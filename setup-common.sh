#!/usr/bin/env bash
# setup-common.sh - functions shared by apt.sh and nvidia-drivers-install.sh (sourced, not run).
# The sourcing script defines usage() and SCRIPT (its name) first, then calls parse_args "$@".

# For tests only: OS_RELEASE_FILE and PCI_DEVICES_DIR replace the files the preflight reads.

export DEBIAN_FRONTEND=noninteractive
APT_OPTS=(-o DPkg::Lock::Timeout=300)  # wait for cloud-init / unattended-upgrades
DRY_RUN=0
UPDATED=0

parse_args() {  # parse_args "$@": sets DRY_RUN; --help; refuses unknown arguments and non-root real runs
  local arg
  for arg in "$@"; do
    case "$arg" in
      -n|--dry-run) DRY_RUN=1 ;;
      -h|--help) usage; exit 0 ;;
      *) echo "$SCRIPT: unknown argument: $arg (see: bash $SCRIPT --help)" >&2; exit 2 ;;
    esac
  done
  if [ "$DRY_RUN" = 0 ] && [ "${SKIP_ROOT_CHECK:-0}" != 1 ] && [ "$(id -u)" != 0 ]; then
    echo "$SCRIPT: must be run as root: sudo bash $SCRIPT (or try: bash $SCRIPT --dry-run)" >&2
    exit 1
  fi
  if [ "$DRY_RUN" = 1 ]; then echo "DRY-RUN: nothing below is executed or written"; fi
  preflight_os
}

die() {  # die MESSAGE: stop the script with MESSAGE on stderr
  echo "$SCRIPT: $*" >&2
  exit 1
}

preflight_os() {  # the course's VMs run Ubuntu 22.04 or 24.04: anything else stops here, dry run or not
  local file="${OS_RELEASE_FILE:-/etc/os-release}" id="" version=""
  [ -r "$file" ] || die "cannot read $file: is this Ubuntu 22.04 or 24.04?"
  id=$(sed -n 's/^ID=//p' "$file" | tr -d '"')
  version=$(sed -n 's/^VERSION_ID=//p' "$file" | tr -d '"')
  case "$id $version" in
    "ubuntu 22.04" | "ubuntu 24.04") echo "ok: Ubuntu $version" ;;
    *) die "this script is for Ubuntu 22.04 or 24.04, and this machine runs '${id:-unknown} ${version:-?}' ($file):" \
           "its package names and driver packages differ; set the machine up by hand" ;;
  esac
}

nvidia_gpu_present() {  # true when a PCI device of NVIDIA's (vendor 0x10de) is present
  local vendor
  for vendor in "${PCI_DEVICES_DIR:-/sys/bus/pci/devices}"/*/vendor; do
    [ -r "$vendor" ] && [ "$(cat "$vendor")" = 0x10de ] && return 0
  done
  return 1
}

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
  if [ "$UPDATED" = 0 ]; then
    # exits even where the caller tests apt_install's status (set -e does not act there)
    run apt-get update "${APT_OPTS[@]}" || die "apt-get update failed (see above): nothing was installed"
    UPDATED=1
  fi
  for pkg in "${missing[@]}"; do  # names this machine's package lists do not know fail here, before anything installs
    if ! apt-cache show "$pkg" >/dev/null 2>&1; then
      echo "$SCRIPT: no package '$pkg' in this machine's package lists" \
           "(check the name; on a dry run, the lists may need: sudo apt-get update)" >&2
      return 1
    fi
  done
  run apt-get install -y "${APT_OPTS[@]}" "${missing[@]}"
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
