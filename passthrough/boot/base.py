# SPDX-License-Identifier: Apache-2.0
"""What every bootloader class shares, and the names read from a root that we pass on."""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from typing import ClassVar

from passthrough.actions import Action
from passthrough.errors import PassthroughError
from passthrough.host.root import HostRoot
from passthrough.kargs import ArgChange, needed
from passthrough.model import BootloaderKind, Host

# what a kernel release (``uname -r``) or a loader entry's file name can look like: it goes
# into a command line and a path, so anything else is refused where it is read
RELEASE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._+~-]{0,127}")
# the arguments a host needs, drawn from the arguments a configuration holds (kargs.desired)
TargetOf = Callable[[list[str]], ArgChange]
ENTRY_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._+~@:-]{0,250}\.conf")


class UnknownBootloader(PassthroughError):
    def __init__(self, args: Sequence[str], direct: bool = False) -> None:
        if direct:  # read_boot found no bootloader and no kernel on the disk
            super().__init__(
                "this host has no bootloader and no kernel image in /boot: what starts it "
                "(its hypervisor's kernel command line) sets the arguments, so nothing here is "
                f"changed; add them there: {' '.join(args)}"
            )
            return
        super().__init__(
            "cannot tell which bootloader this host uses, so kernel arguments are not changed; "
            f"add them with your bootloader's tool: {' '.join(args)}"
        )


class BadName(PassthroughError):
    """A name read from the root that cannot be what it claims (exit 2, nothing changed)."""

    def __init__(self, what: str, name: str) -> None:
        super().__init__(f"{what} {name!r} read from the root cannot be one; nothing was changed")


def checked_release(release: str | None) -> str | None:
    if release is not None and RELEASE.fullmatch(release) is None:
        raise BadName("kernel release", release)
    return release


def checked_entry(name: str) -> str:
    if ENTRY_NAME.fullmatch(name) is None:
        raise BadName("loader entry file name", name)
    return name


class Bootloader:
    name: ClassVar[BootloaderKind] = BootloaderKind.UNKNOWN

    def __init__(self, root: HostRoot, host: Host) -> None:
        self.root = root
        self.host = host

    def configured(self) -> list[str]:
        raise NotImplementedError

    def actions(self, change: ArgChange) -> list[Action]:
        raise NotImplementedError

    def change_for(
        self, configured: list[str], target_of: TargetOf
    ) -> tuple[ArgChange, list[Action], list[str]]:
        """The change ``configured`` needs to reach its target (``target_of`` draws it from
        the arguments it is for), its actions and notes for the plan. One configuration
        here; loaders with several (loader entries) draw one change each."""
        change = needed(configured, target_of(configured))
        return change, ([] if change.is_empty() else self.actions(change)), []
