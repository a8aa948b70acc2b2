# SPDX-License-Identifier: Apache-2.0
"""Floors: the least a Python program can take to do the measurable part of what a command
does, so bench_speed.py can show, in the same run, how much of a command's time is ours
and how much any Python tool that does the same work would pay. Nothing here checks,
judges or reports; each mode only does the expensive part and exits.

    python benchmarks/floors.py reads ROOT       # the files and links `scan` reads, no parsing
    python benchmarks/floors.py schema           # import lxml, compile libvirt's domain schema
    python benchmarks/floors.py validate FILE... # that, then each file parsed and validated by
                                                 # the schema alone, shared among forked workers
                                                 # as `passthrough validate` shares a batch

Standard library and lxml only; nothing of passthrough is imported.
"""

from __future__ import annotations

import contextlib
import os
import sys

SCHEMA = "/usr/share/libvirt/schemas/domain.rng"
DEVICES = "sys/bus/pci/devices"
# what scan reads of every function (passthrough/host/pci.py): one link to the device's
# directory, that directory opened once, two links and five files read through it
LINKS = ("iommu_group", "physfn")
FILES = ("uevent", "numa_node", "reset_method", "resource", "sriov_totalvfs")


def reads(root: str) -> int:
    """Every PCI function's link, links and files read as scan reads them; the count."""
    flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK
    devices = os.path.join(root, DEVICES)
    listing = os.open(devices, os.O_RDONLY | os.O_DIRECTORY)
    count = 0
    for name in sorted(os.listdir(listing)):
        target = os.readlink(name, dir_fd=listing)
        real = os.path.normpath(os.path.join(devices, target))
        fd = os.open(real, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
        for link in LINKS:
            with contextlib.suppress(OSError):  # absent: scan pays the failed call too
                os.readlink(link, dir_fd=fd)
        for file in FILES:
            try:
                f = os.open(file, flags, dir_fd=fd)
            except OSError:
                continue
            os.fstat(f)
            os.read(f, 1 << 16)
            os.close(f)
        os.close(fd)
        count += 1
    os.close(listing)
    return count


def schema() -> object:
    from lxml import etree

    return etree.RelaxNG(etree.parse(SCHEMA))


def validate(files: list[str], workers: int) -> int:
    """The files that fail the schema, the share of each worker after the first forked."""
    from lxml import etree

    rng = schema()
    parser = etree.XMLParser(resolve_entities=False, no_network=True)

    def bad(share: list[str]) -> int:
        n = 0
        for name in share:
            with open(name, "rb") as fh:
                n += not rng.validate(etree.fromstring(fh.read(), parser))  # type: ignore[attr-defined]
        return n

    size = -(-len(files) // max(1, workers))
    shares = [files[i : i + size] for i in range(0, len(files), size)]
    children = []
    for share in shares[1:]:
        pid = os.fork()
        if pid == 0:
            os._exit(min(bad(share), 100))
        children.append(pid)
    failed = bad(shares[0]) if shares else 0
    for pid in children:
        failed += os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])
    return failed


def main(argv: list[str]) -> int:
    if argv[:1] == ["reads"] and len(argv) == 2:
        return 0 if reads(argv[1]) else 1
    if argv == ["schema"]:
        schema()
        return 0
    if argv[:1] == ["validate"]:
        cpus = len(os.sched_getaffinity(0))
        workers = min(cpus, 8, len(argv[1:]) // 64) or 1  # as passthrough's batch decides
        return 1 if validate(argv[1:], workers) else 0
    sys.stderr.write(__doc__ or "")
    return 2


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
