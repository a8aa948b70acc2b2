# SPDX-License-Identifier: Apache-2.0
"""Which libvirt, QEMU and OVMF a root has: its dpkg database, and on the live host what
the tools themselves say where dpkg does not. Read by discovery (what the address planner
may rely on depends on them), so a snapshot carries them: the dpkg database cut down to
these packages, and the tools' answers in its metadata file."""

from __future__ import annotations

import json
import re

from passthrough.guest.root import SNAPSHOT_META
from passthrough.host.root import HostRoot

DPKG_STATUS = "var/lib/dpkg/status"
# component → the Debian packages that carry its version, most telling first
PACKAGES: dict[str, tuple[str, ...]] = {
    "libvirt": ("libvirt-daemon", "libvirt0"),
    "qemu": ("qemu-system-x86", "qemu-system-x86-64"),
    "ovmf": ("ovmf",),
}
_WANTED = {name for names in PACKAGES.values() for name in names}
_TOOLS = {"libvirt": ["virsh", "--version"], "qemu": ["qemu-system-x86_64", "--version"]}


def read_packages(root: HostRoot) -> dict[str, str]:
    """Package → version of the installed packages among :data:`PACKAGES` (dpkg's
    ``install ok installed``; a removed package's leftover entry is no version)."""
    status = root.read(DPKG_STATUS) or ""
    installed: dict[str, str] = {}
    for block in status.split("\n\n"):
        fields = dict(
            (k.strip(), v.strip())
            for k, _, v in (line.partition(":") for line in block.splitlines() if ":" in line)
        )
        name = fields.get("Package")
        if name in _WANTED and "install ok installed" in fields.get("Status", ""):
            installed[name] = fields.get("Version", "")
    return installed


def dpkg_subset(packages: dict[str, str]) -> str:
    """A dpkg status file holding just these installed packages (a snapshot's copy)."""
    return "".join(
        f"Package: {name}\nStatus: install ok installed\nVersion: {version}\n\n"
        for name, version in sorted(packages.items())
    )


def read_tool_versions(root: HostRoot, packages: dict[str, str]) -> dict[str, str]:
    """Component → version string where dpkg does not say: on the live host from
    ``virsh --version`` and ``qemu-system-x86_64 --version``; in a snapshot, what those
    said when it was taken (its metadata file)."""
    missing = [what for what in _TOOLS if not any(n in packages for n in PACKAGES[what])]
    if not missing:
        return {}
    if not root.is_live:
        try:
            meta = json.loads(root.read(SNAPSHOT_META) or "{}")
        except (ValueError, RecursionError):
            return {}
        said = meta.get("tool_versions") if isinstance(meta, dict) else None
        if not isinstance(said, dict):
            return {}
        return {k: v for k, v in said.items() if k in missing and isinstance(v, str)}
    import shutil  # the live host only: a root or snapshot never asks its tools
    import subprocess

    found: dict[str, str] = {}
    for what in missing:
        argv = _TOOLS[what]
        if shutil.which(argv[0]) is None:
            continue
        try:
            out = subprocess.run(argv, capture_output=True, text=True, timeout=10).stdout
        except (OSError, subprocess.TimeoutExpired):
            continue
        m = re.search(r"\d+\.\d+(?:\.\d+)?", out)
        if m:
            found[what] = m[0]
    return found
