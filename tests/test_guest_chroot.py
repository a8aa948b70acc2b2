# SPDX-License-Identifier: Apache-2.0
"""The guest role for real, against a debootstrapped Debian 12 through Ansible's chroot
connection: containerd comes from Debian; the NVIDIA Container Toolkit comes from a local
apt repository of STAND-IN packages (NVIDIA's repository cannot be reached here), so the
repository, pinning and configuration logic of the role still runs for real.

The stand-in `nvidia-ctk` only writes what the real one would write for the two commands
the role uses (a containerd runtime drop-in, a CDI spec); it is named as a stand-in
everywhere it appears."""

from __future__ import annotations

import hashlib
import shutil
import tarfile
from pathlib import Path

import pytest

from passthrough.provision.runner import run, summary_table

from .conftest import run_ok

# the debootstrap tier: minutes on a cold cache (docs/testing.md: the fast loop skips it)
pytestmark = pytest.mark.slow

STAND_IN_CTK = """#!/bin/sh
# STAND-IN for nvidia-ctk (test only): writes what the real tool writes for these commands.
set -e
case "$1 $2" in
  "runtime configure")
    for arg in "$@"; do case "$arg" in --config=*) out="${arg#--config=}";; esac; done
    mkdir -p "$(dirname "$out")"
    cat > "$out" <<'TOML'
version = 2

[plugins."io.containerd.grpc.v1.cri".containerd.runtimes.nvidia]
  runtime_type = "io.containerd.runc.v2"
  [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.nvidia.options]
    BinaryName = "/usr/bin/nvidia-container-runtime"
TOML
    ;;
  "cdi generate")
    for arg in "$@"; do case "$arg" in --output=*) out="${arg#--output=}";; esac; done
    mkdir -p "$(dirname "$out")"
    printf 'cdiVersion: 0.5.0\\nkind: nvidia.com/gpu\\ndevices: []\\n# stand-in\\n' > "$out"
    ;;
  *) echo "stand-in nvidia-ctk: unsupported: $*" >&2; exit 2;;
esac
"""

PACKAGES = {
    "libnvidia-container1": [],
    "libnvidia-container-tools": ["libnvidia-container1 (= {v})"],
    "nvidia-container-toolkit-base": [],
    "nvidia-container-toolkit": [
        "nvidia-container-toolkit-base (= {v})",
        "libnvidia-container-tools (= {v})",
    ],
}


def _build_repo(repo: Path) -> None:
    """Stand-in .debs at three versions: the pin must pick 1.20.0-1, not the newer one."""
    repo.mkdir(parents=True)
    entries = []
    for version in ("1.19.0-1", "1.20.0-1", "1.21.0-1"):
        for name, deps in PACKAGES.items():
            work = repo.parent / f"build-{name}-{version}"
            (work / "DEBIAN").mkdir(parents=True)
            depends = ", ".join(d.format(v=version) for d in deps)
            control = (
                f"Package: {name}\nVersion: {version}\nArchitecture: amd64\n"
                "Maintainer: passthrough tests <stand-in@localhost>\n"
                + (f"Depends: {depends}\n" if depends else "")
                + f"Description: STAND-IN for {name} (test only)\n"
            )
            (work / "DEBIAN/control").write_text(control)
            if name == "nvidia-container-toolkit-base":
                (work / "usr/bin").mkdir(parents=True)
                ctk = work / "usr/bin/nvidia-ctk"
                ctk.write_text(STAND_IN_CTK)
                ctk.chmod(0o755)
            deb = repo / f"{name}_{version}_amd64.deb"
            run_ok(["dpkg-deb", "--root-owner-group", "--build", str(work), str(deb)])
            data = deb.read_bytes()
            entries.append(
                control.rstrip("\n")
                + f"\nFilename: ./{deb.name}\nSize: {len(data)}\nSHA256: {hashlib.sha256(data).hexdigest()}\n"
            )
            shutil.rmtree(work)
    (repo / "Packages").write_text("\n".join(entries))


def _inventory(tmp_path: Path, root: Path) -> Path:
    inv = tmp_path / "inventory.yml"
    inv.write_text(
        "all:\n  children:\n    gpu_guests:\n      hosts:\n        debian-guest:\n"
        "          ansible_connection: community.general.chroot\n"
        f"          ansible_host: {root}\n"
        "          ansible_python_interpreter: /usr/bin/python3\n"
    )
    return inv


EXTRA = {
    "passthrough_guest_driver_install": False,  # DKMS needs the guest's own kernel running
    "passthrough_guest_toolkit_repo_url": "file:/srv/stand-in-repo",
    "passthrough_guest_toolkit_repo_options": "trusted=yes",
    "passthrough_guest_toolkit_key_url": "",
    "passthrough_guest_restart_runtime": False,  # no init system inside a chroot
    "passthrough_guest_verify": False,  # no GPU here
    # The role's first and last tasks check the guest's GPU: no GPU here, so they read the
    # REAL H100 guest capture (and its recorded tool outputs) copied into the chroot, through
    # the chroot's own python3, which has no passthrough package.
    "passthrough_guest_check_root": "/srv/h100-guest/root",
    "passthrough_guest_check_commands": "/srv/h100-guest/commands",
}
H100_GUEST = Path(__file__).parent / "fixtures/h100-guest"


def _h100_capture(root: Path) -> None:
    dest = root / "srv/h100-guest"
    dest.mkdir(parents=True)
    with tarfile.open(H100_GUEST / "root.tar.gz") as tar:
        tar.extractall(dest, filter="tar")
    shutil.copytree(H100_GUEST / "commands", dest / "commands")


def _chroot(root: Path, *argv: str) -> str:
    return run_ok(["chroot", str(root), *argv]).stdout


def test_guest_role_in_a_debian_chroot(debian_tree: Path, tmp_path: Path) -> None:
    root = tmp_path / "guest"
    run_ok(["cp", "-a", str(debian_tree), str(root)])
    shutil.copy("/etc/resolv.conf", root / "etc/resolv.conf")  # apt reaches Debian's mirror
    _build_repo(root / "srv/stand-in-repo")
    _h100_capture(root)
    inv = _inventory(tmp_path, root)
    first = run(str(inv), "guest.yml", extravars=EXTRA)
    assert first.ok, summary_table(first)
    assert first.hosts["debian-guest"].changed >= 5
    versions = _chroot(
        root,
        "dpkg-query",
        "-W",
        "-f",
        "${Package} ${Version}\\n",
        "containerd",
        "nvidia-container-toolkit",
        "nvidia-container-toolkit-base",
    )
    assert "nvidia-container-toolkit 1.20.0-1" in versions  # pinned, though 1.21.0-1 is offered
    assert "nvidia-container-toolkit-base 1.20.0-1" in versions
    assert "containerd 1.6" in versions  # the real package from Debian
    pin = (root / "etc/apt/preferences.d/nvidia-container-toolkit").read_text()
    assert "Pin: version 1.20.0-1" in pin
    source = (root / "etc/apt/sources.list.d/nvidia-container-toolkit.list").read_text()
    assert "deb [trusted=yes] file:/srv/stand-in-repo /" in source
    config = (root / "etc/containerd/config.toml").read_text()
    assert config.startswith('imports = ["/etc/containerd/conf.d/*.toml"]')
    # the real containerd reads its configuration with the drop-in merged in
    dump = _chroot(root, "containerd", "config", "dump")
    assert "runtimes.nvidia]" in dump and "/usr/bin/nvidia-container-runtime" in dump
    assert (root / "run/cdi/nvidia.yaml").exists()  # /var/run is a link to /run in Debian
    second = run(str(inv), "guest.yml", extravars=EXTRA)
    assert second.ok and second.hosts["debian-guest"].changed == 0, summary_table(second)


def test_a_failed_package_install_stops_with_the_reason(debian_tree: Path, tmp_path: Path) -> None:
    root = tmp_path / "guest"
    run_ok(["cp", "-a", str(debian_tree), str(root)])
    shutil.copy("/etc/resolv.conf", root / "etc/resolv.conf")
    _build_repo(root / "srv/stand-in-repo")
    _h100_capture(root)
    inv = _inventory(tmp_path, root)
    result = run(
        str(inv), "guest.yml", extravars={**EXTRA, "passthrough_guest_toolkit_version": "9.9.9"}
    )
    assert not result.ok
    reason = result.hosts["debian-guest"].reason or ""
    assert reason.startswith("Install the NVIDIA Container Toolkit:") and "9.9.9-1" in reason
