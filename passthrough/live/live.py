# SPDX-License-Identifier: Apache-2.0
"""A card's driver now, either way: ``vfio`` as ``bind`` moves it, ``host`` as ``release``
gives it back — for callers without the CLI's prompts (the Ansible module)."""

from __future__ import annotations

from passthrough.host.discover import discover
from passthrough.host.root import HostRoot
from passthrough.journal.state import locked
from passthrough.live.bind import bind_now
from passthrough.live.livedrivers import LiveDrivers
from passthrough.live.release import release_functions, release_now, release_plan

Planned = dict[str, str | None]  # address → the driver it goes to (None: the kernel's default)


def live_move(
    root_path: str, gpus: list[str], state: str, timeout: float, check: bool = False
) -> tuple[Planned, dict[str, str]]:
    """What moves (``check``: nothing else) and what moved: address → its driver now."""
    root = HostRoot(root_path)
    host = discover(root)
    if state == "vfio":
        from passthrough.analysis.policy import judge_all
        from passthrough.host.modalias import vfio_drivers
        from passthrough.plan.select import select

        functions = select(host, judge_all(host), gpus).functions
        drivers = vfio_drivers(root, host.kernel.release, functions)
        planned: Planned = {
            str(f.address): drivers[str(f.address)]
            for f in functions
            if f.driver != drivers[str(f.address)]
        }
        if check or not planned:
            return planned, {}
        with locked(root):
            bound = bind_now(
                root, host, functions, timeout, drivers=drivers, journal=LiveDrivers.load(root)
            )
        return planned, {a: drivers[a] for a in bound}
    functions = release_functions(host, gpus)
    planned = dict(release_plan(LiveDrivers.load(root), functions))
    if check or not planned:
        return planned, {}
    if not root.is_live:  # refuses (a held card first, naming the holder), before the lock
        release_now(root, host, functions, LiveDrivers.load(root), timeout)
    with locked(root):
        return planned, release_now(root, host, functions, LiveDrivers.load(root), timeout)
