# SPDX-License-Identifier: Apache-2.0
"""Stopping a guest that holds a vGPU: never with SIGKILL.

A QEMU killed with SIGKILL while its vGPU starts can leave the VF wedged until SR-IOV is
cycled on the whole card (every other guest on it stopped). So a vGPU guest is stopped with
a clean shutdown and a grace period, then with SIGTERM alone, and never with a plain
``destroy`` (SIGTERM, then SIGKILL after 10 s).

The SIGTERM: on this machine's system libvirtd (``qemu:///system``), passthrough sends it to
the domain's QEMU itself (its pid from libvirt's pid file, checked against the process's
``guest=NAME`` argument) and waits; libvirt sees QEMU go. Nothing sends SIGKILL: a QEMU still
there afterwards is left running and named. Elsewhere (a remote or session URI) it is
libvirt's graceful destroy (``VIR_DOMAIN_DESTROY_GRACEFUL``), which sends SIGTERM first; but
libvirt 9.0, tried here on a QEMU that could not act on SIGTERM, still ended it after about
15 s (its own SIGTERM wait) with no error returned, so that path cannot promise "no SIGKILL"
and says so.

What holds a vGPU, from the domain's XML and the host's sysfs: an mdev hostdev
(``type='mdev'``), or a PCI hostdev with ``managed='no'`` whose device is on the nvidia
driver (a vendor-VFIO VF; a whole card handed over sits on vfio-pci). Where the host's
driver cannot be read (a remote URI), a ``managed='no'`` PCI hostdev without
``<driver name='vfio'/>`` counts as one: the gentle stop costs only time.
"""

from __future__ import annotations

import os
import signal
import time
import xml.etree.ElementTree as ET
from collections.abc import Callable
from pathlib import Path
from typing import Any

from passthrough.errors import EXIT_BACKEND, InvalidPciAddress, PassthroughError
from passthrough.host.root import HostRoot
from passthrough.pciaddr import PciAddress

GRACE = 60  # seconds a vGPU guest is given to shut down before SIGTERM
TERM_WAIT = 30  # seconds QEMU is given to exit after SIGTERM (then it is left running, named)
Driver = Callable[[str], str | None]  # PCI address -> its host driver (None: not known)


def _pci(address: ET.Element) -> str | None:
    """A hostdev's source address as libvirt reads it; None where libvirt would refuse it."""
    try:
        return str(PciAddress.from_libvirt(address.attrib))
    except InvalidPciAddress:
        return None


def vgpu_hostdevs(xml: str, driver_of: Driver) -> list[str]:
    """The domain's hostdevs that hold a vGPU, each as a few words (empty: none)."""
    try:
        doc = ET.fromstring(xml)
    except ET.ParseError:
        return []
    found = []
    for hd in doc.iterfind("devices/hostdev"):
        src = hd.find("source/address")
        if src is None:
            continue
        if hd.get("type") == "mdev":
            found.append(f"mdev {src.get('uuid')}")
            continue
        if hd.get("type") != "pci" or hd.get("managed", "no") != "no":
            continue
        address = _pci(src)
        if address is None:
            continue
        driver = driver_of(address)
        vfio = any(d.get("name") == "vfio" for d in hd.iterfind("driver"))
        if driver == "nvidia" or (driver is None and not vfio):
            found.append(f"VF {address}" + (" (nvidia driver)" if driver else ""))
    return found


def root_driver(root: HostRoot) -> Driver:
    """The driver of a PCI device under ``root``; None where there is no such device."""

    def driver(address: str) -> str | None:
        if not root.exists(f"sys/bus/pci/devices/{address}"):
            return None
        return root.link_name(f"sys/bus/pci/devices/{address}/driver") or "no driver"

    return driver


def local_driver(address: str) -> str | None:
    """The driver of a PCI device on this machine."""
    return root_driver(HostRoot("/"))(address)


class StillRunning(PassthroughError):
    """A vGPU guest SIGTERM did not stop: not killed (libvirt failing underneath, exit 4)."""

    exit_code = EXIT_BACKEND


def qemu_pid(name: str, run: str = "/run/libvirt/qemu") -> int | None:
    """The pid of the system libvirtd's QEMU for domain ``name``, where its pid file names a
    live process started for that guest (``-name guest=NAME,...``); None otherwise."""
    try:
        pid = int(Path(run, f"{name}.pid").read_text(encoding="ascii").strip())
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except (OSError, ValueError):
        return None
    return pid if any(a.startswith(f"guest={name},".encode()) for a in argv) else None


def _sigterm(dom: Any, pid: int, wait: float, poll: float) -> bool | None:
    """SIGTERM to QEMU, then up to ``wait`` seconds for libvirt to see it gone (None: this
    user may not signal it)."""
    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        return True
    except PermissionError:
        return None
    started = time.monotonic()
    while time.monotonic() - started < wait:
        if not dom.isActive():
            return True
        time.sleep(poll)
    return not dom.isActive()


def stop_gently(
    dom: Any,
    libvirt: Any,
    grace: float,
    force: bool,
    held: list[str],
    pid: int | None = None,
    term_wait: float = TERM_WAIT,
    poll: float = 0.5,
) -> str:
    """Shutdown and up to ``grace`` seconds (``force``: none), then SIGTERM alone: to
    ``pid`` (QEMU on this machine) with ``term_wait`` seconds to go, or libvirt's graceful
    destroy where there is no pid. One line says what happened; StillRunning where QEMU
    outlived the SIGTERM (it is left running)."""
    what = f"{dom.name()} holds a vGPU ({', '.join(held)})"
    started = time.monotonic()
    refused = ""
    if not force:
        try:
            dom.shutdown()
        except libvirt.libvirtError as exc:
            refused = f" (shutdown refused: {exc.get_error_message()})"
        while time.monotonic() - started < grace:
            if not dom.isActive():
                return f"{what}: shut down cleanly in {time.monotonic() - started:.0f} s"
            time.sleep(poll)
    how = "--force" if force else f"no clean shutdown in {grace:g} s{refused}"
    keep = (
        "not killed, since SIGKILL can wedge the VF; stop it from inside the guest, or "
        "`virsh destroy` it knowing the card may need SR-IOV cycled"
    )
    gone = None if pid is None else _sigterm(dom, pid, term_wait, poll)
    if gone:
        return f"{what}: {how}, stopped with SIGTERM to QEMU (pid {pid}; no SIGKILL)"
    if gone is False:
        raise StillRunning(
            f"{what}: {how}, and QEMU (pid {pid}) outlived SIGTERM by {term_wait:g} s: {keep}"
        )
    try:
        dom.destroyFlags(libvirt.VIR_DOMAIN_DESTROY_GRACEFUL)
    except libvirt.libvirtError as exc:
        if not dom.isActive():
            return f"{what}: {how}; it stopped while SIGTERM was being sent"
        raise StillRunning(
            f"{what}: {how}, and SIGTERM did not stop it ({exc.get_error_message()}): {keep}"
        ) from None
    return (
        f"{what}: {how}, stopped by libvirt's graceful destroy (SIGTERM; libvirt may still "
        "SIGKILL a QEMU that outlives it, there is no pid to signal here)"
    )
