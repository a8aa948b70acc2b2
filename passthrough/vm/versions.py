# SPDX-License-Identifier: Apache-2.0
"""Which libvirt, QEMU and OVMF a host has: what the address planner may use depends on them.

Read as ``host/versions.py`` reads them; this module takes them from a discovered host or a
root.
"""

from __future__ import annotations

from passthrough.host.packages import read_packages, read_tool_versions
from passthrough.host.root import HostRoot

# the types and tables live beside discovery (check reads them too); guests import them here
from passthrough.host.versions import DEFAULT_VERSIONS as DEFAULT_VERSIONS
from passthrough.host.versions import Versions as Versions
from passthrough.host.versions import dotted as dotted
from passthrough.host.versions import iommufd_lacks as iommufd_lacks
from passthrough.host.versions import versions_of
from passthrough.model import Host


def host_versions(host: Host) -> Versions:
    """The versions of a discovered host (read by discovery: a snapshot gives the same)."""
    return versions_of(host.packages, host.tool_versions)


def read_versions(root: str) -> Versions:
    """The same, read straight from a root (a bare directory need not be a host root)."""
    hr = HostRoot(root)
    packages = read_packages(hr)
    return versions_of(packages, read_tool_versions(hr, packages))
