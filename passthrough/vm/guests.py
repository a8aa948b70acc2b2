# SPDX-License-Identifier: Apache-2.0
"""The libvirt guests that hold a host's cards, found and stopped before the host reboots, and
started again after (the passthrough_guests module of the collection runs this on the host).

A guest holds a card where its domain XML has a ``<hostdev type='pci'>`` whose source is one
of the card's functions; running or not, it would lose the card, or fail to start, while the
host reboots into vfio-pci. The domain's own XML is read by the one domain reader
(passthrough.vm.domxml), so validate and this never read a hostdev differently.
"""

from __future__ import annotations

import time
from typing import Any

from passthrough.errors import PassthroughError
from passthrough.records import frozen
from passthrough.vm.domxml import Domain


@frozen
class Holder:
    name: str
    active: bool
    functions: tuple[str, ...]  # the card functions it holds, PCI addresses

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "active": self.active, "functions": list(self.functions)}


def holders(conn: Any, functions: list[str]) -> list[Holder]:
    """Every domain of ``conn`` (defined or running) holding one of ``functions``."""
    wanted = {f.lower() for f in functions}
    found = []
    for dom in conn.listAllDomains(0):
        held = [
            str(h.source)
            for h in Domain.parse(dom.XMLDesc(0)).pci_hostdevs
            if h.source is not None and str(h.source) in wanted
        ]
        if held:
            found.append(Holder(dom.name(), bool(dom.isActive()), tuple(sorted(held))))
    return sorted(found, key=lambda h: h.name)


def stop(conn: Any, names: list[str], timeout: float) -> list[str]:
    """Shut the running ones of ``names`` down (ACPI, as a person would), waiting up to
    ``timeout`` seconds for them all; what is still running then is refused, not destroyed:
    pulling the power on a guest is the user's decision, not the play's."""
    doms = [d for d in (conn.lookupByName(n) for n in names) if d.isActive()]
    for dom in doms:
        dom.shutdown()
    deadline = time.monotonic() + timeout
    while any(d.isActive() for d in doms) and time.monotonic() < deadline:
        time.sleep(0.5)
    left = [d.name() for d in doms if d.isActive()]
    if left:
        raise PassthroughError(
            f"{', '.join(left)} did not shut down in {timeout:g}s: stop them by hand, "
            "then re-run (the host was not rebooted)"
        )
    return [d.name() for d in doms]


def start(conn: Any, names: list[str]) -> list[str]:
    """Start those of ``names`` that are not running (the guests ``stop`` stopped)."""
    started = []
    for name in names:
        dom = conn.lookupByName(name)
        if not dom.isActive():
            dom.create()
            started.append(name)
    return started
