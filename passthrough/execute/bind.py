"""Binding idle cards to vfio-pci now, without a reboot.

For each function: unbind it from its driver, set ``driver_override`` to vfio-pci, ask the
kernel to probe it again (``drivers_probe``), and wait for the kernel's ``bind`` uevent
through pyudev — never a sleep. A card whose GPU driver is in use is refused.
"""

from __future__ import annotations

import select
import time
from collections.abc import Callable
from typing import Any

from passthrough.errors import EXIT_HOST_STEP, PassthroughError
from passthrough.host.holders import find_holders, holder_fix
from passthrough.host.root import HostRoot
from passthrough.model import Host, PciFunction

GPU_DRIVERS = {"nvidia", "nouveau", "amdgpu", "radeon", "i915", "xe"}


class BindRefused(PassthroughError):
    pass


class BindFailed(PassthroughError):
    exit_code = EXIT_HOST_STEP


def _in_use(root: HostRoot, host: Host, f: PciFunction) -> str | None:
    if not f.driver or f.driver == "vfio-pci":
        return None
    if f.address in set(host.critical.root_pci) | set(host.critical.nic_pci):
        return "the host needs it (root disk or default-route NIC)"
    if f.driver in GPU_DRIVERS:
        module = root.link_name(f"sys/bus/pci/drivers/{f.driver}/module") or f.driver
        refcnt = root.read_int(f"sys/module/{module}/refcnt")
        if refcnt:
            return f"its driver {f.driver} is in use (module refcnt {refcnt}): stop what uses the GPU, or bind at boot"
        if root.exists(f"{f.sysfs_path}/graphics") or f.boot_vga:
            return "the host console is on it"
    return None


def refuse_held(root: HostRoot, functions: list[PciFunction]) -> None:
    """An unbind waits for every open handle to close: refuse a held card up front."""
    held = find_holders(root, [str(f.address) for f in functions])
    if held:
        everyone = [h for holders in held.values() for h in holders]
        raise BindRefused(
            f"{', '.join(sorted(held))}: held open, an unbind would hang: "
            + "; ".join(h.describe() for h in everyone)
            + f"; {holder_fix(everyone)}"
        )


def _write(root: HostRoot, rel: str, value: str) -> None:
    path = root.real(rel)
    try:
        with open(path, "w") as fh:
            fh.write(value)
    except OSError as exc:
        raise BindFailed(f"writing {value!r} to {path}: {exc.strerror}") from None


Waiter = Callable[[set[str], float], set[str]]


def udev_waiter() -> tuple[Waiter, Callable[[], None]]:
    """Start listening before anything is written; return (wait, stop)."""
    import pyudev

    context = pyudev.Context()
    monitor = pyudev.Monitor.from_netlink(context)
    monitor.filter_by("pci")
    monitor.start()

    def wait(pending: set[str], timeout: float) -> set[str]:
        deadline = time.monotonic() + timeout
        bound: set[str] = set()
        while pending - bound:
            left = deadline - time.monotonic()
            if left <= 0:
                break
            ready, _, _ = select.select([monitor], [], [], left)
            if not ready:
                break
            device: Any = monitor.poll(timeout=0)
            if device is None:
                continue
            if (
                device.action == "bind"
                and device.sys_name in pending
                and device.driver == "vfio-pci"
            ):
                bound.add(device.sys_name)
        return bound

    def stop() -> None:
        nonlocal monitor
        del monitor  # closes the netlink socket

    return wait, stop


def bind_now(
    root: HostRoot,
    host: Host,
    functions: list[PciFunction],
    timeout: float = 10.0,
    waiter: tuple[Waiter, Callable[[], None]] | None = None,
    progress: Callable[[str], None] | None = None,
) -> list[str]:
    """Bind ``functions`` to vfio-pci; returns the addresses that changed driver."""
    say = progress or (lambda _m: None)
    refuse_held(root, functions)
    if not root.is_live:
        raise BindRefused(
            "binding now works on the live host only (--root /); use apply for a root directory"
        )
    for f in functions:
        why = _in_use(root, host, f)
        if why:
            raise BindRefused(f"{f.address}: not bound now: {why}")
    if not root.exists("sys/bus/pci/drivers/vfio-pci"):
        raise BindRefused("vfio-pci is not loaded: run `modprobe vfio-pci` first")
    todo = [f for f in functions if f.driver != "vfio-pci"]
    if not todo:
        return []
    wait, stop = waiter or udev_waiter()
    bound: set[str] = set()
    try:
        # One function at a time, each confirmed by its bind event before the next.
        for f in todo:
            base = f"sys/bus/pci/devices/{f.address}"
            if f.driver:
                say(f"unbind {f.address} from {f.driver}")
                _write(root, f"{base}/driver/unbind", str(f.address))
            _write(root, f"{base}/driver_override", "vfio-pci")
            say(f"probe {f.address} with driver_override=vfio-pci")
            _write(root, "sys/bus/pci/drivers_probe", str(f.address))
            got = wait({str(f.address)}, timeout)
            if str(f.address) not in got:
                raise BindFailed(
                    f"no bind event for {f.address} within {timeout:g}s"
                    + (f" (already bound: {', '.join(sorted(bound))})" if bound else "")
                    + "; check dmesg, and `passthrough scan` for who holds it"
                )
            bound |= got
    finally:
        stop()
    for addr in sorted(bound):
        link = root.link_name(f"sys/bus/pci/devices/{addr}/driver")
        if link != "vfio-pci":
            raise BindFailed(f"{addr}: bind event seen but the driver is {link or 'none'}")
    return sorted(bound)
