# SPDX-License-Identifier: Apache-2.0
"""Binding idle cards to their vfio driver now, without a reboot.

For each function: unbind it from its driver, set ``driver_override`` to its vfio driver
(vfio-pci, or the variant driver the running kernel's ``modules.alias`` gives it), ask the
kernel to probe it again (``drivers_probe``), and wait for the kernel's ``bind`` uevent
through pyudev — never a sleep. A card whose GPU driver is in use is refused.
"""

from __future__ import annotations

import select
import time
from collections.abc import Callable
from typing import Any

from passthrough.errors import EXIT_HOST_STEP, PassthroughError
from passthrough.host.holders import find_holders, holder_fix, units_of
from passthrough.host.modalias import PLAIN, vfio_drivers
from passthrough.host.root import HostRoot
from passthrough.live.livedrivers import LiveDrivers
from passthrough.model import Host, PciFunction

GPU_DRIVERS = {"nvidia", "nouveau", "amdgpu", "radeon", "i915", "xe"}


class BindRefused(PassthroughError):
    pass


class BindFailed(PassthroughError):
    exit_code = EXIT_HOST_STEP


def _in_use(root: HostRoot, host: Host, f: PciFunction, want: str) -> str | None:
    if not f.driver or f.driver == want:
        return None
    if f.driver == PLAIN:
        # a guest may hold it through vfio-pci: an unbind would wait for the guest to stop
        return f"it is on vfio-pci (a guest may be using it), not {want}: bind it at boot (passthrough apply)"
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
            + ("; `bind --stop-holders` stops and restarts the units" if units_of(everyone) else "")
        )


def on_vfio(driver: str | None) -> bool:
    """vfio-pci or a vfio variant driver (``nvgrace_gpu_vfio_pci``, ``mlx5_vfio_pci``...)."""
    return driver is not None and (driver == PLAIN or driver.endswith("vfio_pci"))


def sysfs_write(root: HostRoot, rel: str, value: str) -> None:
    path = root.real(rel)
    try:
        with open(path, "w") as fh:
            fh.write(value)
    except OSError as exc:
        raise BindFailed(f"writing {value!r} to {path}: {exc.strerror}") from None


# (address → the driver it must bind to, timeout) → the addresses seen bound to it
Waiter = Callable[[dict[str, str], float], set[str]]
# what release waits for where the kernel picks the driver: any driver but a vfio one
ANY_HOST_DRIVER = "*"


def awaited(want: str | None, driver: str | None) -> bool:
    """Whether a bind event of ``driver`` is the one a waiter for ``want`` waits for."""
    if want == ANY_HOST_DRIVER:
        return driver is not None and not on_vfio(driver)
    return want is not None and want == driver


def udev_waiter() -> tuple[Waiter, Callable[[], None]]:
    """Start listening before anything is written; return (wait, stop)."""
    import pyudev

    context = pyudev.Context()
    monitor = pyudev.Monitor.from_netlink(context)
    monitor.filter_by("pci")
    monitor.start()

    def wait(pending: dict[str, str], timeout: float) -> set[str]:
        deadline = time.monotonic() + timeout
        bound: set[str] = set()
        while set(pending) - bound:
            left = deadline - time.monotonic()
            if left <= 0:
                break
            ready, _, _ = select.select([monitor], [], [], left)
            if not ready:
                break
            device: Any = monitor.poll(timeout=0)
            if device is None:
                continue
            if device.action == "bind" and awaited(pending.get(device.sys_name), device.driver):
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
    drivers: dict[str, str] | None = None,
    journal: LiveDrivers | None = None,
) -> list[str]:
    """Bind ``functions`` to their vfio driver (``drivers``: address → driver; by default
    what the running kernel's modules.alias gives each); returns the addresses that changed
    driver. ``journal`` (the CLI's) remembers each function's host driver before the move,
    for ``release``."""
    say = progress or (lambda _m: None)
    refuse_held(root, functions)
    if not root.is_live:
        raise BindRefused(
            "binding now works on the live host only (--root /); use apply for a root directory"
        )
    if drivers is None:
        drivers = vfio_drivers(root, host.kernel.release, functions)
    want = {str(f.address): drivers.get(str(f.address), PLAIN) for f in functions}
    for f in functions:
        why = _in_use(root, host, f, want[str(f.address)])
        if why:
            raise BindRefused(f"{f.address}: not bound now: {why}")
    missing = sorted({d for d in want.values() if not root.exists(f"sys/bus/pci/drivers/{d}")})
    if missing:
        raise BindRefused(
            f"{', '.join(missing)} {'is' if len(missing) == 1 else 'are'} not loaded: run "
            f"`modprobe {' '.join(missing)}` first"
        )
    todo = [f for f in functions if f.driver != want[str(f.address)]]
    if not todo:
        return []
    wait, stop = waiter or udev_waiter()
    bound: set[str] = set()
    try:
        # One function at a time, each confirmed by its bind event before the next.
        for f in todo:
            addr = str(f.address)
            base = f"sys/bus/pci/devices/{addr}"
            if journal is not None:
                journal.begin(addr, "to-vfio", None if on_vfio(f.driver) else f.driver)
            if f.driver:
                say(f"unbind {addr} from {f.driver}")
                sysfs_write(root, f"{base}/driver/unbind", addr)
            sysfs_write(root, f"{base}/driver_override", want[addr])
            say(f"probe {addr} with driver_override={want[addr]}")
            sysfs_write(root, "sys/bus/pci/drivers_probe", addr)
            got = wait({addr: want[addr]}, timeout)
            if addr not in got:
                raise BindFailed(
                    f"no bind event for {addr} within {timeout:g}s"
                    + (f" (already bound: {', '.join(sorted(bound))})" if bound else "")
                    + "; check dmesg, and `passthrough scan` for who holds it"
                )
            bound |= got
            if journal is not None:
                journal.done(addr, "vfio")
    finally:
        stop()
    for addr in sorted(bound):
        link = root.link_name(f"sys/bus/pci/devices/{addr}/driver")
        if link != want[addr]:
            raise BindFailed(f"{addr}: bind event seen but the driver is {link or 'none'}")
    return sorted(bound)
