# SPDX-License-Identifier: Apache-2.0
"""Host roots built from a compact description: sample hosts and test fixtures.

A description (YAML, see ``hosts/*.yaml``; its schema in :mod:`.description`) names the
CPU, kernel, distro (``distros.yaml``), firmware and the PCI tree; :func:`build` writes a
real directory tree as the kernel shows it — relative symlinks where sysfs has links, a
``config`` file per function so that ``lspci -A linux-sysfs`` reads it too — plus the few
proc/etc/boot files discovery reads (:mod:`.hostfiles`, :mod:`.boot`).
:func:`umockdev_record` writes the same PCI devices as a umockdev record.
"""

from __future__ import annotations

from passthrough.fakehost.description import (
    CLASS_ALIASES,
    HOSTS_DIR,
    Description,
    Node,
    load,
    sample_names,
)
from passthrough.fakehost.distros import DISTROS
from passthrough.fakehost.sysfs import build, modalias, uevent
from passthrough.fakehost.umockdev import umockdev_record

__all__ = [
    "CLASS_ALIASES",
    "DISTROS",
    "HOSTS_DIR",
    "Description",
    "Node",
    "build",
    "load",
    "modalias",
    "sample_names",
    "uevent",
    "umockdev_record",
]
