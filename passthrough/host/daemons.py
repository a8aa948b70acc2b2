# SPDX-License-Identifier: Apache-2.0
"""The libvirt daemons' systemd units under a root: the locked-memory limit they run under.

A unit is read as systemd loads it: the first of ``etc``, ``run``, ``lib``/``usr/lib``
``systemd/system/<unit>`` (a link to /dev/null masks it), then the drop-ins
(``<unit>.d/*.conf`` and the ``service.d/*.conf`` every service gets), a name in ``etc``
hiding the same name in ``run`` and ``lib``, applied in file-name order. Later assignments
win; an empty one resets. Only ``[Service]`` keys that decide the limit are kept:
``LimitMEMLOCK``, ``User`` and ``CapabilityBoundingSet``.
"""

from __future__ import annotations

import re

from passthrough.host.root import HostRoot
from passthrough.model import LibvirtDaemon

UNITS = ("libvirtd.service", "virtqemud.service")
# the sockets that start them on demand (an enabled socket is a daemon in use)
_SOCKETS = {
    "libvirtd.service": ("libvirtd.socket", "libvirtd-ro.socket", "libvirtd-admin.socket"),
    "virtqemud.service": ("virtqemud.socket", "virtqemud-ro.socket", "virtqemud-admin.socket"),
}
_DIRS = ("etc/systemd/system", "run/systemd/system", "lib/systemd/system", "usr/lib/systemd/system")
_SUFFIX = {
    "": 1,
    "K": 1 << 10,
    "M": 1 << 20,
    "G": 1 << 30,
    "T": 1 << 40,
    "P": 1 << 50,
    "E": 1 << 60,
}
_SIZE = re.compile(r"^([0-9]{1,20})\s*([KMGTPE]?)$", re.IGNORECASE)
CAP = "CAP_SYS_RESOURCE"


def _size(text: str) -> int | None:
    """systemd's resource limit value (base 1024); None: infinity or unreadable."""
    m = _SIZE.match(text.strip())
    return int(m[1]) * _SUFFIX[m[2].upper()] if m else None


def _service_keys(text: str) -> list[tuple[str, str]]:
    out: list[tuple[str, str]] = []
    section = ""
    for raw in text.replace("\\\n", " ").splitlines():
        line = raw.strip()
        if not line or line[0] in "#;":
            continue
        if line.startswith("["):
            section = line.strip("[]")
        elif section == "Service" and "=" in line:
            key, _, value = line.partition("=")
            out.append((key.strip(), value.strip()))
    return out


def _files(root: HostRoot, unit: str) -> tuple[str, list[str]] | None:
    """The unit's main file and its drop-ins, in the order systemd applies them."""
    main = next((f"{d}/{unit}" for d in _DIRS if root.exists(f"{d}/{unit}")), None)
    if main is None or (root.readlink(main) or "") == "/dev/null":
        return None
    dropins: dict[str, str] = {}
    for d in reversed(_DIRS):  # etc last: its names hide the others
        for folder in (f"{d}/service.d", f"{d}/{unit}.d"):
            if root.isdir(folder):
                for name in root.listdir(folder):
                    if name.endswith(".conf"):
                        dropins[name] = f"{folder}/{name}"
    return main, [dropins[n] for n in sorted(dropins)]


def _enabled(root: HostRoot, unit: str) -> bool:
    base = "etc/systemd/system"
    names = (unit, *_SOCKETS.get(unit, ()))
    if not root.isdir(base):
        return False
    for wants in root.listdir(base):
        if wants.endswith(".wants") and any(_present(root, f"{base}/{wants}/{n}") for n in names):
            return True
    return False


def _present(root: HostRoot, rel: str) -> bool:
    # the link itself enables the unit; its target need not be in the root (a snapshot
    # keeps only what discovery read)
    return root.readlink(rel) is not None or root.exists(rel)


def read_daemon(root: HostRoot, unit: str) -> LibvirtDaemon | None:
    found = _files(root, unit)
    if found is None:
        return None
    main, dropins = found
    memlock_text, memlock_from, user = "", "", ""
    bounding: set[str] | None = None  # None: every capability
    for path in (main, *dropins):
        for key, value in _service_keys(root.read(path) or ""):
            if key == "LimitMEMLOCK":
                memlock_text, memlock_from = value, "/" + path
            elif key == "User":
                user = value
            elif key == "CapabilityBoundingSet":
                bounding = _bounding(bounding, value)
    hard = memlock_text.rpartition(":")[2] if memlock_text else ""
    memlock = _size(hard) if hard else None
    why = ""
    if user not in ("", "root", "0"):
        why = f"as User={user}"
    elif bounding is not None and CAP not in bounding:
        why = f"without {CAP} (CapabilityBoundingSet)"
    return LibvirtDaemon(
        unit=unit,
        path="/" + main,
        memlock=memlock,
        memlock_text=memlock_text,
        memlock_from=memlock_from,
        can_raise=not why,
        why_capped=why,
        enabled=_enabled(root, unit),
    )


def _bounding(current: set[str] | None, value: str) -> set[str] | None:
    """CapabilityBoundingSet=: a list is ORed into what earlier lines allowed, a ``~`` list
    is taken away, an empty value resets to every capability."""
    if not value:
        return None
    if value.startswith("~"):
        names = set(value[1:].split())
        return None if current is None and not names else _minus(current, names)
    names = set(value.split())
    return names if current is None else current | names


def _minus(current: set[str] | None, names: set[str]) -> set[str]:
    # "every capability but these": CAP_SYS_RESOURCE stays unless it is named
    return (current if current is not None else {CAP}) - names


def read_daemons(root: HostRoot) -> tuple[LibvirtDaemon, ...]:
    """Each libvirt daemon unit the root has (libvirtd, virtqemud)."""
    return tuple(d for d in (read_daemon(root, u) for u in UNITS) if d is not None)
