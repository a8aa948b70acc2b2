# SPDX-License-Identifier: Apache-2.0
"""Giving cards back to their host drivers now, without a reboot: the live opposite of bind.

For each function on a vfio driver: unbind it, clear ``driver_override``, and hand it to the
host driver it had before ``bind`` took it (its ``bind`` file, from the live-driver journal)
or, where none is known, let the kernel pick its default driver (``drivers_probe``); then
wait for the kernel's ``bind`` uevent through pyudev, one function at a time. A card that a
guest or a process holds open (its ``/dev/vfio`` group or cdev) is refused, the holder named.
``bind`` undoes it.
"""

from __future__ import annotations

from collections.abc import Callable

from passthrough.host.holders import find_holders, stop_steps, vfio_nodes
from passthrough.host.root import HostRoot
from passthrough.live.bind import (
    ANY_HOST_DRIVER,
    BindFailed,
    BindRefused,
    Waiter,
    on_vfio,
    sysfs_write,
    udev_waiter,
)
from passthrough.live.livedrivers import LiveDrivers
from passthrough.model import Host, PciFunction


def refuse_held_vfio(root: HostRoot, functions: list[PciFunction]) -> None:
    """A guest holds its card through the group or the cdev: an unbind would wait for it."""
    addresses = [str(f.address) for f in functions]
    held = find_holders(root, addresses, nodes=vfio_nodes)
    if held:
        everyone = [h for holders in held.values() for h in holders]
        # a group node is every member's: name each function whose node is held
        taken = {h.node for h in everyone}
        named = [a for a in addresses if vfio_nodes(root, a) & taken]
        raise BindRefused(
            f"{', '.join(named)}: held open, not released: "
            + "; ".join(h.describe() for h in everyone)
            + f"; shut the guest down first (virsh shutdown; else {stop_steps(everyone)}), "
            "then release"
        )


def release_functions(host: Host, gpus: list[str]) -> list[PciFunction]:
    """The functions of the cards named (default: every NVIDIA card), bridges left out:
    release takes back what bind gave, whatever the safety policy says of the card now."""
    from passthrough.analysis.cards import choose_cards
    from passthrough.analysis.policy import judge_all

    # no card named and none on the host: nothing to give back, not a usage error
    cards = choose_cards(judge_all(host), gpus, default="nvidia", required=False)
    return [f for v in cards for f in v.gpu.functions if not f.is_bridge_like]


def release_plan(journal: LiveDrivers, functions: list[PciFunction]) -> dict[str, str | None]:
    """Each function on a vfio driver → the host driver it goes back to (None: the
    kernel's default, by drivers_probe)."""
    plan: dict[str, str | None] = {}
    for f in functions:
        if on_vfio(f.driver):
            before = journal.host_driver(str(f.address))
            plan[str(f.address)] = before if before and not on_vfio(before) else None
    return plan


def release_now(
    root: HostRoot,
    host: Host,
    functions: list[PciFunction],
    journal: LiveDrivers,
    timeout: float = 10.0,
    waiter: tuple[Waiter, Callable[[], None]] | None = None,
    progress: Callable[[str], None] | None = None,
) -> dict[str, str]:
    """Give ``functions`` back to their host drivers (``journal``: where bind noted them);
    returns address → the driver that took each one that moved."""
    say = progress or (lambda _m: None)
    refuse_held_vfio(root, functions)
    if not root.is_live:
        raise BindRefused("releasing now works on the live host only (--root /)")
    plan = release_plan(journal, functions)
    gone = sorted({d for d in plan.values() if d and not root.exists(f"sys/bus/pci/drivers/{d}")})
    if gone:
        raise BindRefused(
            f"{', '.join(gone)} {'is' if len(gone) == 1 else 'are'} not loaded: run "
            f"`modprobe {' '.join(gone)}` first"
        )
    if not plan:
        return {}
    wait, stop = waiter or udev_waiter()
    taken: dict[str, str] = {}
    try:
        for f in functions:
            addr = str(f.address)
            if addr not in plan:
                continue
            target = plan[addr]
            base = f"sys/bus/pci/devices/{addr}"
            journal.begin(addr, "to-host", target)
            say(f"unbind {addr} from {f.driver}")
            sysfs_write(root, f"{base}/driver/unbind", addr)
            # an empty override: the kernel matches by ID again (drivers/pci/pci-sysfs.c)
            sysfs_write(root, f"{base}/driver_override", "\n")
            if target:
                say(f"bind {addr} to {target}")
                sysfs_write(root, f"sys/bus/pci/drivers/{target}/bind", addr)
            else:
                say(f"probe {addr} for its default driver")
                sysfs_write(root, "sys/bus/pci/drivers_probe", addr)
            got = wait({addr: target or ANY_HOST_DRIVER}, timeout)
            if addr not in got:
                raise BindFailed(
                    f"no bind event for {addr} within {timeout:g}s: "
                    + (f"{target} did not take it" if target else "no host driver took it")
                    + (f" (already released: {', '.join(sorted(taken))})" if taken else "")
                    + "; it is on no driver now: `passthrough bind` takes it back to vfio"
                )
            driver = root.link_name(f"{base}/driver")
            if driver is None or on_vfio(driver):
                raise BindFailed(f"{addr}: bind event seen but the driver is {driver or 'none'}")
            taken[addr] = driver
            journal.done(addr, "host")
    finally:
        stop()
    return taken
