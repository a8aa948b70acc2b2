"""Which libvirt, QEMU and OVMF a host has: what the address planner may use depends on them.

Read from the host root's dpkg database, and on the live host from the tools themselves;
what neither says is assumed (Debian 12) and marked so.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from dataclasses import dataclass
from typing import Any

from passthrough.host.root import HostRoot


def dotted(v: tuple[int, int]) -> str:
    """(9, 0) → ``9.0``; (2022, 11) → ``2022.11``."""
    return f"{v[0]}.{v[1]:02d}" if v[0] > 1000 else f"{v[0]}.{v[1]}"


@dataclass(frozen=True)
class Versions:
    libvirt: tuple[int, int]
    qemu: tuple[int, int]
    ovmf: tuple[int, int]
    source: str = "given"
    # the names (libvirt, qemu, ovmf) whose version was not found: a default stands in
    assumed: tuple[str, ...] = ()

    def is_assumed(self, name: str) -> bool:
        return name in self.assumed

    def as_json(self) -> dict[str, Any]:
        return {
            "libvirt": dotted(self.libvirt),
            "qemu": dotted(self.qemu),
            "ovmf": dotted(self.ovmf),
            "source": self.source,
            "assumed": bool(self.assumed),
        }


# Debian 12, what this project's CI runs: the default when the host root does not say.
ASSUMED = "assumed (Debian 12)"
DEFAULT_VERSIONS = Versions((9, 0), (7, 2), (2022, 11), ASSUMED, ("libvirt", "qemu", "ovmf"))

_DPKG = {
    "libvirt": ("libvirt-daemon", "libvirt0"),
    "qemu": ("qemu-system-x86", "qemu-system-x86-64"),
    "ovmf": ("ovmf",),
}


def _two(text: str | None) -> tuple[int, int] | None:
    m = re.match(r"(?:\d+:)?(\d+)\.(\d+)", text or "")
    return (int(m[1]), int(m[2])) if m else None


def _dpkg_versions(root: HostRoot) -> dict[str, tuple[int, int]]:
    status = root.read("var/lib/dpkg/status") or ""
    installed: dict[str, str] = {}
    for block in status.split("\n\n"):
        fields = dict(
            (k.strip(), v.strip())
            for k, _, v in (line.partition(":") for line in block.splitlines() if ":" in line)
        )
        if "install ok installed" in fields.get("Status", "") and "Package" in fields:
            installed[fields["Package"]] = fields.get("Version", "")
    found: dict[str, tuple[int, int]] = {}
    for what, names in _DPKG.items():
        for name in names:
            v = _two(installed.get(name))
            if v is not None:
                found[what] = v
                break
    return found


def _live_versions() -> dict[str, tuple[int, int]]:
    """On the live host: ``virsh --version`` and ``qemu-system-x86_64 --version``."""
    found: dict[str, tuple[int, int]] = {}
    for what, argv in (
        ("libvirt", ["virsh", "--version"]),
        ("qemu", ["qemu-system-x86_64", "--version"]),
    ):
        if shutil.which(argv[0]) is None:
            continue
        try:
            out = subprocess.run(argv, capture_output=True, text=True, timeout=10).stdout
        except (OSError, subprocess.TimeoutExpired):
            continue
        m = re.search(r"(\d+)\.(\d+)", out)
        if m:
            found[what] = (int(m[1]), int(m[2]))
    return found


def read_versions(root: str) -> Versions:
    """libvirt, QEMU and OVMF versions from the host root's dpkg database, then (live host
    only) the tools themselves; what neither says comes from :data:`DEFAULT_VERSIONS`."""
    hr = HostRoot(root)
    found = _dpkg_versions(hr)
    source = "dpkg status" if found else ""
    if hr.is_live and len(found) < 3:
        live = {k: v for k, v in _live_versions().items() if k not in found}
        if live:
            found.update(live)
            source = f"{source} + tools" if source else "virsh/qemu --version"
    missing = [k for k in ("libvirt", "qemu", "ovmf") if k not in found]
    if missing:
        source = (source + "; " if source else "") + f"{ASSUMED}: " + ", ".join(missing)
    return Versions(
        libvirt=found.get("libvirt", DEFAULT_VERSIONS.libvirt),
        qemu=found.get("qemu", DEFAULT_VERSIONS.qemu),
        ovmf=found.get("ovmf", DEFAULT_VERSIONS.ovmf),
        source=source,
        assumed=tuple(missing),
    )
