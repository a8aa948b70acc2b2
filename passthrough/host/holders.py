# SPDX-License-Identifier: Apache-2.0
"""Who holds a card's device nodes open: the processes an unbind would wait on forever.

A process with ``/dev/nvidiaN`` (the card's minor, from ``/proc/driver/nvidia/gpus``) or the
card's ``/dev/dri/cardN`` / ``renderDN`` open keeps the driver busy, and writing ``unbind``
then blocks until it lets go (nvidia-persistenced, dcgm-exporter, Xorg, a CUDA job). Read
through the root reader from ``proc/<pid>/fd``, ``comm`` and ``cgroup``, so a test tree
answers the same way as the live host.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable

from passthrough.host.root import HostRoot
from passthrough.model import CheckResult, Level
from passthrough.records import frozen

_MINOR = re.compile(r"^Device Minor:\s*(\d+)\s*$", re.MULTILINE)


@frozen(slots=True)
class Holder:
    """A process that holds a device node open."""

    pid: int
    comm: str
    unit: str | None  # the host's own system service it runs in, when its cgroup names one
    node: str  # the device node it holds, e.g. /dev/nvidia0
    container: str | None = None  # the container it runs in (never the host's to stop)

    def describe(self) -> str:
        unit = f", unit {self.unit}" if self.unit else ""
        inside = f", in {self.container}" if self.container else ""
        return f"{self.comm} (pid {self.pid}{unit}{inside}) holds {self.node}"


def device_nodes(root: HostRoot, address: str) -> set[str]:
    """The device nodes that belong to the function at ``address`` alone."""
    nodes = {f"/dev/dri/{n}" for n in root.listdir(f"sys/bus/pci/devices/{address}/drm")}
    info = root.read(f"proc/driver/nvidia/gpus/{address}/information")
    match = _MINOR.search(info or "")
    if match:
        nodes.add(f"/dev/nvidia{match.group(1)}")
    return {n for n in nodes if n.startswith(("/dev/nvidia", "/dev/dri/card", "/dev/dri/render"))}


def vfio_nodes(root: HostRoot, address: str) -> set[str]:
    """The nodes a guest (QEMU) holds a function on vfio by: its group's ``/dev/vfio/N``
    and its cdev ``/dev/vfio/devices/vfioN``. A group node is shared by the group's
    functions: whoever holds it holds them all."""
    dev = f"sys/bus/pci/devices/{address}"
    nodes = {
        f"/dev/vfio/devices/{n}" for n in root.listdir(f"{dev}/vfio-dev") if n.startswith("vfio")
    }
    group = root.link_name(f"{dev}/iommu_group")
    if group is not None and group.isdigit():
        nodes.add(f"/dev/vfio/{group}")
    return nodes


# cgroup path components that put a process in a container, and how to name it. A unit
# name inside one (``/lxc/101/ns/system.slice/ssh.service``) is the container's own: stopping
# the host's unit of that name would stop the wrong service and leave the holder running.
_CONTAINERS: tuple[tuple[re.Pattern[str], str], ...] = (
    (re.compile(r"lxc\.(?:payload|monitor)\.(.+)"), "LXC container {}"),
    (re.compile(r"systemd-nspawn@(.+)\.service"), "systemd-nspawn container {}"),
    (re.compile(r"docker-([0-9a-f]+)\.scope"), "Docker container {:.12}"),
    (re.compile(r"libpod-(?:conmon-)?([0-9a-f]+)\.scope"), "Podman container {:.12}"),
    (re.compile(r"machine-(.+)\.scope"), "machine {}"),
    (re.compile(r"(kubepods.*)"), "Kubernetes pod ({})"),
)
# a parent directory whose child names the container: /lxc/101, /docker/<id>, /libpod_parent/…
_PARENTS = {
    "lxc": "LXC container {}",
    "docker": "Docker container {:.12}",
    "libpod_parent": "Podman container {:.12}",
    "machine.slice": "machine {}",
}


def _container(parts: list[str]) -> str | None:
    """The container a cgroup path (split on /) lies in, named; None on the host's own.
    A libvirt QEMU guest's scope (``machine.slice/machine-qemu\\x2d1\\x2dNAME.scope``) is
    no container: the process in it is the guest's emulator, on the host, and the way to
    make it let go is to shut that guest down."""
    for i, part in enumerate(parts):
        if part.startswith("machine-qemu"):
            return None
        if (
            part == "machine.slice"
            and parts[i + 1 : i + 2]
            and parts[i + 1].startswith("machine-qemu")
        ):
            return None
        for pattern, name in _CONTAINERS:
            if m := pattern.fullmatch(part):
                return name.format(m.group(1))
        if part in _PARENTS and i + 1 < len(parts):
            child = parts[i + 1]
            nested = _container([child])
            return nested or _PARENTS[part].format(child.removeprefix("libpod-"))
    return None


def _placement(cgroup: str | None) -> tuple[str | None, str | None]:
    """(the host's system service a process runs in, the container it runs in). A unit is
    one only directly under the host's ``system.slice`` (through its ``system-*.slice``
    sub-slices, as templated units are): one under a user's manager (``user@UID.service``)
    is that user's session, and ``systemctl stop`` of the manager would end it."""
    unit: str | None = None
    for line in (cgroup or "").splitlines():
        parts = [p for p in line.rpartition(":")[2].split("/") if p]
        container = _container(parts)
        if container is not None:
            return None, container
        if unit is None and parts[:1] == ["system.slice"]:
            for part in parts[1:]:
                if part.endswith(".service"):
                    unit = part
                    break
                if not part.endswith(".slice"):
                    break
    return unit, None


def find_holders(
    root: HostRoot,
    addresses: Iterable[str],
    nodes: Callable[[HostRoot, str], set[str]] = device_nodes,
) -> dict[str, list[Holder]]:
    """For each address, the processes holding one of its device nodes (``nodes``: the
    host driver's by default, :func:`vfio_nodes` for a guest's hold) (none: absent)."""
    owner = {node: addr for addr in addresses for node in nodes(root, addr)}
    found: dict[str, list[Holder]] = {}
    if not owner:
        return found
    for pid in sorted((p for p in root.listdir("proc") if p.isdigit()), key=int):
        for fd in root.listdir(f"proc/{pid}/fd"):
            node = root.readlink(f"proc/{pid}/fd/{fd}")
            if node not in owner:
                continue
            comm = (root.read(f"proc/{pid}/comm") or "?").strip() or "?"
            unit, container = _placement(root.read(f"proc/{pid}/cgroup"))
            holder = Holder(int(pid), comm, unit, node, container)
            if holder not in found.setdefault(owner[node], []):
                found[owner[node]].append(holder)
    return found


def units_of(holders: Iterable[Holder]) -> list[str]:
    return sorted({h.unit for h in holders if h.unit})


def stop_steps(holders: list[Holder]) -> str:
    """How to make them let go: stop their units, end the processes in none."""
    units = units_of(holders)
    loose = sorted({f"{h.comm} (pid {h.pid})" for h in holders if not h.unit and not h.container})
    inside = sorted({f"{h.comm} (pid {h.pid}) in {h.container}" for h in holders if h.container})
    steps = [f"systemctl stop {' '.join(units)}"] if units else []
    if loose:
        steps.append("end " + ", ".join(loose))
    if inside:
        steps.append("stop " + ", ".join(inside) + " from inside it")
    return "; ".join(steps)


def holder_fix(holders: list[Holder]) -> str:
    return stop_steps(holders) + " before binding now (or bind at boot: `passthrough apply`)"


def holder_checks(found: dict[str, list[Holder]]) -> list[CheckResult]:
    """One ``gpu-held`` warning per held card, naming the holders and the fix."""
    return [
        CheckResult(
            "gpu-held",
            Level.WARN,
            f"{addr}: " + "; ".join(h.describe() for h in holders),
            holder_fix(holders),
        )
        for addr, holders in sorted(found.items())
    ]
