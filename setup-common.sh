#!/usr/bin/env bash
# setup-common.sh - functions shared by apt.sh and nvidia-drivers-install.sh (sourced, not run).
# The sourcing script defines usage() and SCRIPT (its name) first, then calls parse_args "$@".

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
  if [ "$UPDATED" = 0 ]; then run apt-get update "${APT_OPTS[@]}"; UPDATED=1; fi
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
