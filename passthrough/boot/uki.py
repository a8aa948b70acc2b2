# SPDX-License-Identifier: Apache-2.0
"""One named section of a PE image (a unified kernel image's ``.cmdline``), read from the
headers: the DOS header's ``e_lfanew`` points at ``PE\\0\\0``; the COFF header after it
gives the number of sections and the optional header's size; the section table follows
that header, 40 bytes a section (name, virtual size, virtual address, raw size, raw
offset, …). Only the headers and the section are read, never the whole image (a UKI is
tens of MiB), and every size is bounded."""

from __future__ import annotations

import os
import struct

MAX_SECTIONS = 96  # the PE/COFF limit
MAX_SECTION = 64 << 10  # a kernel command line is a few KiB at most


class NotPE(ValueError):
    """The file is not a PE image, or its headers point outside it."""


def _read(fd: int, offset: int, size: int) -> bytes:
    data = os.pread(fd, size, offset)
    if len(data) != size:
        raise NotPE(f"ends before byte {offset + size}")
    return data


def section(path: str, name: str) -> bytes | None:
    """The bytes of section ``name`` (``.cmdline``) of the PE image at ``path``, None when
    the image has no such section; NotPE when it is not a PE image."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    try:
        if _read(fd, 0, 2) != b"MZ":
            raise NotPE("no MZ header")
        (pe,) = struct.unpack("<I", _read(fd, 0x3C, 4))
        if _read(fd, pe, 4) != b"PE\0\0":
            raise NotPE("no PE signature")
        count, _, _, _, optional = struct.unpack("<HIIIH", _read(fd, pe + 6, 16))
        if count > MAX_SECTIONS:
            raise NotPE(f"{count} sections")
        table = _read(fd, pe + 24 + optional, 40 * count)
        for i in range(count):
            raw_name, vsize, _, rsize, offset = struct.unpack_from("<8sIIII", table, 40 * i)
            if raw_name.rstrip(b"\0") != name.encode():
                continue
            size = min(vsize, rsize) if vsize else rsize
            if size > MAX_SECTION:
                raise NotPE(f"its {name} section is {size} bytes")
            return _read(fd, offset, size)
        return None
    finally:
        os.close(fd)


def cmdline(path: str) -> list[str] | None:
    """The arguments a UKI's ``.cmdline`` section gives the kernel, None without one."""
    data = section(path, ".cmdline")
    if data is None:
        return None
    return data.split(b"\0", 1)[0].decode("utf-8", "replace").split()
