# SPDX-License-Identifier: Apache-2.0
"""Discovery: everything the toolkit knows about a host, read from a root."""

from __future__ import annotations

import os
import sys
from collections.abc import Callable

from passthrough.errors import NotAHostRoot, PassthroughError, echo_path
from passthrough.host import facts
from passthrough.host.boot import read_boot
from passthrough.host.critical import read_critical
from passthrough.host.daemons import read_daemons
from passthrough.host.packages import read_packages, read_tool_versions
from passthrough.host.pci import Namer, read_functions, with_names
from passthrough.host.pciids import find_pci_ids, lookup
from passthrough.host.root import HostRoot
from passthrough.model import Host, IommuGroup, PciFunction
from passthrough.records import paused_gc


def _debug(message: str, *args: object) -> None:
    """-v/-vv (cli/common.py verbosity). Without logging imported nothing can have set it
    up to show a debug line, so a scan pays neither the import nor the call."""
    if "logging" in sys.modules:
        import logging

        logging.getLogger(__name__).debug(message, *args)


PciSource = Callable[[HostRoot], list[PciFunction]]


def root_pci_source(root: HostRoot) -> list[PciFunction]:
    """PCI functions from sysfs files, names from the root's pci.ids.

    The IDs come from one pass over the ``uevent`` files, so the database is read once
    for just those IDs and names go straight into the frozen records.
    """
    rel = find_pci_ids(root)
    data = root.read_bytes(rel) if rel else None
    if data is None:
        return read_functions(root)
    db: dict[tuple[int, int | None], str] = {}

    def namer_factory(ids: set[tuple[int, int]]) -> Namer:
        db.update(lookup(data, ids))
        return lambda v, d: (db.get((v, None)), db.get((v, d)))

    functions = read_functions(root, namer_factory)
    missing = {(f.vendor_id, f.device_id) for f in functions if f.device_name is None}
    missing = {i for i in missing if i not in db}
    if missing:  # a root without uevent files: names in a second pass
        functions = with_names(functions, lookup(data, missing))
    return functions


def group_functions(functions: list[PciFunction]) -> tuple[IommuGroup, ...]:
    members: dict[int, list[PciFunction]] = {}
    for f in functions:
        if f.iommu_group is not None:
            members.setdefault(f.iommu_group, []).append(f)
    return tuple(
        IommuGroup(number=n, members=tuple(sorted(f.address for f in fs)))
        for n, fs in sorted(members.items())
    )


def discover(root: HostRoot | str, pci_source: PciSource | None = None) -> Host:
    """Read a host through the caller's root reader (the one it goes on to plan, verify or
    bind with; a snapshot's records what is read), or a path to open one on.
    ``pci_source`` replaces the sysfs reader (pyudev on a live host)."""
    if isinstance(root, str):
        root = HostRoot(root)
    if not root.isdir("sys/bus/pci") and not root.isdir("proc"):
        raise NotAHostRoot(root.path, "does not look like a host root (no sys/bus/pci, no proc)")
    with paused_gc():
        return _discover(root, pci_source)


def _discover(root: HostRoot, pci_source: PciSource | None) -> Host:
    functions = (pci_source or root_pci_source)(root)
    kernel = facts.read_kernel(root)
    packages = read_packages(root)
    _debug(
        "read %s: %d PCI functions, kernel %s, %d problems",
        root.path,
        len(functions),
        kernel.release or "unknown",
        len(root.problems),
    )
    return Host(
        root=root.path,
        cpu=facts.read_cpu(root),
        kvm=root.exists("dev/kvm"),
        iommu=facts.read_iommu(root, kernel, functions),
        kernel=kernel,
        distro=facts.read_distro(root),
        boot=read_boot(root, kernel),
        critical=read_critical(root),
        dmi=facts.read_dmi(root),
        functions=tuple(functions),
        groups=group_functions(functions),
        problems=tuple(root.problems),
        numa_cpus=facts.read_numa(root),
        memory_mib=facts.read_memory_mib(root),
        machine=facts.read_machine(root, functions),
        packages=packages,
        tool_versions=read_tool_versions(root, packages),
        libvirt_daemons=read_daemons(root),
    )


def pci_source_for(root: str, use_udev: str = "auto") -> PciSource | None:
    """pyudev's enumeration on the live root (names from the hwdb), or None for the root's
    sysfs files: a fixture, a snapshot, or a live machine without pyudev (a GPU guest
    with no pip) — unless ``use_udev="yes"`` insists on it."""
    live = os.path.realpath(root) == "/"
    if use_udev == "no" or (use_udev == "auto" and not live):
        return None
    if not live and "UMOCKDEV_DIR" not in os.environ:
        # udev knows this machine's devices, not the root's: the report would mix the two
        raise PassthroughError(
            f"--udev yes with --root {echo_path(root)}: udev enumerates this machine's devices, not "
            "the root's (only with --root /, or under umockdev-run with the root's record)"
        )
    try:
        import pyudev  # noqa: F401
    except ImportError:
        if use_udev == "yes":
            raise
        return None
    from passthrough.host.udev import udev_pci_source

    return udev_pci_source
