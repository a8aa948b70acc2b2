# SPDX-License-Identifier: Apache-2.0
"""The distro table (``distros.yaml``): what each install looks like to discovery."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from passthrough.fakehost.schema import Keys, MapOf, OneOf, check
from passthrough.model import BootloaderKind, InitramfsKind
from passthrough.records import frozen

TABLE = Path(__file__).with_name("distros.yaml")

# "none": a host whose boot tooling discovery cannot find (what the checks must report);
# "direct": no bootloader and no kernel in /boot, the kernel started by what starts the
# machine (QEMU's -kernel, Firecracker: the lent GPU guests are such machines);
# "systemd-boot-entries": systemd-boot with hand-written loader entries and no
# /etc/kernel/cmdline (Arch's usual setup), discovered as systemd-boot
BOOTLOADERS = (*(k.value for k in BootloaderKind), "none", "direct", "systemd-boot-entries")
INITRAMFS = (*(k.value for k in InitramfsKind), "none")
GRUB_MKCONFIG = ("debian", "upstream", "grub2")

_DISTRO = Keys(
    {
        "os_release": MapOf((str,), (str,)),
        "release": (str,),
        "bootloader": OneOf(BOOTLOADERS),
        "initramfs": OneOf(INITRAMFS),
        "config": MapOf((str,), (str,)),
        # which grub-mkconfig the host has: Debian's (reads grub.d), upstream's, or
        # upstream's under the name grub2-mkconfig with /boot/grub2 (openSUSE)
        "grub_mkconfig": OneOf(GRUB_MKCONFIG),
    },
    required=("os_release", "release", "bootloader", "initramfs", "config"),
)
_TABLE = Keys(
    {"base_config": MapOf((str,), (str,)), "distros": MapOf((str,), (dict,))},
    required=("base_config", "distros"),
)


@frozen
class DistroProfile:
    os_release: dict[str, str]
    release: str
    bootloader: str
    initramfs: str
    config: dict[str, str]  # CONFIG_* that differ from BASE_CONFIG
    grub_mkconfig: str = "debian"


def _load() -> tuple[dict[str, str], dict[str, DistroProfile]]:
    data: Any = yaml.safe_load(TABLE.read_text())
    check(data, _TABLE, str(TABLE))
    distros = {}
    for name, entry in data["distros"].items():
        check(entry, _DISTRO, f"{TABLE}: distros.{name}")
        distros[name] = DistroProfile(**entry)
    return data["base_config"], distros


BASE_CONFIG, DISTROS = _load()
