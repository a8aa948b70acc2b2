# SPDX-License-Identifier: Apache-2.0
"""Other modprobe.d lines about vfio, named in the plan with what wins at boot.

modprobe reads every ``*.conf`` of /etc/modprobe.d, /run/modprobe.d and the library
directories in the order of their file names (a name in /etc hides the same name further
down). The ``options`` lines for one module are joined in that order, and a parameter
given twice ends with the last value: another file's ``options vfio-pci ids=`` either
comes before ours (ours wins, so ours carries its IDs too) or after ours (it wins, so our
IDs are added to its line in place, journaled like every write, and undo takes them out
again). ``install`` replaces the command that loads a module; ``blacklist`` only stops
loading through aliases.
"""

from __future__ import annotations

import re

from passthrough.actions import WriteFile
from passthrough.host.root import HostRoot
from passthrough.kargs import UnsafeCmdline, key_of, utf8_text
from passthrough.plan.vfio import MODPROBE

DIRS = (
    "etc/modprobe.d",
    "run/modprobe.d",
    "usr/local/lib/modprobe.d",
    "lib/modprobe.d",
    "usr/lib/modprobe.d",
)
OURS = MODPROBE.rsplit("/", 1)[1]
VFIO = re.compile(r"vfio([_-].*)?$")
PCI_ID = re.compile(r"[0-9a-fA-F]{4}:[0-9a-fA-F]{4}(:[0-9a-fA-F]{4}){0,4}")
MAX_FILES = 1000


def config_files(root: HostRoot) -> list[tuple[str, str]]:
    """(file name, path) in the order modprobe reads them, ours left out."""
    found: dict[str, str] = {}
    for d in DIRS:
        for name in root.listdir(d)[:MAX_FILES]:
            if name.endswith(".conf") and name not in found:
                found[name] = f"{d}/{name}"
    found.pop(OURS, None)
    return sorted(found.items())


def _lines(text: str) -> list[tuple[int, list[str]]]:
    out: list[tuple[int, list[str]]] = []
    for n, line in enumerate(text.split("\n"), 1):
        words = line.split("#", 1)[0].split()
        if words:
            out.append((n, words))
    return out


def _ids(words: list[str]) -> list[str] | None:
    for w in words[2:]:
        if w.startswith("ids="):
            return [i for i in w[4:].split(",") if i]
    return None


Review = tuple[list[str], list[str], list[WriteFile]]


def _with_ours(text: str, n: int, ours: list[str]) -> str:
    lines = text.split("\n")
    lines[n - 1] = re.sub(
        r"(?<=\s)ids=(\S+)",
        lambda m: "ids=" + ",".join([m[1], *[i for i in ours if i not in m[1].split(",")]]),
        lines[n - 1],
        count=1,
    )
    return "\n".join(lines)


def _options(
    where: str, ids: list[str], later: bool, ours: list[str], per_device: bool
) -> tuple[list[str], str]:
    """(IDs of theirs ours must keep, the note) for another file's ``ids=``."""
    bad = [i for i in ids if PCI_ID.fullmatch(i) is None]
    if bad:
        raise UnsafeCmdline(where, f"vfio-pci ids= has {bad[0]!r}, which is no PCI ID")
    if per_device:
        return [], (
            f"{where}: options vfio-pci ids={','.join(ids)} binds by ID at boot, beside our "
            "per-device binding: check it names none of the kept cards"
        )
    if later:
        missing = [i for i in ours if i not in ids]
        return [], (
            f"{where}: its vfio-pci ids= is read after ours and wins"
            + (f"; our {','.join(missing)} added to it" if missing else "; it binds ours too")
        )
    extra = [i for i in ids if i not in ours]
    return extra, f"{where}: its vfio-pci ids= is read before ours, ours wins" + (
        f" and keeps {','.join(extra)}" if extra else ""
    )


def review(root: HostRoot, ours: list[str], per_device: bool) -> Review:
    """Our ``ids=`` merged with those of files read before ours, a note per conflict, and
    our IDs written into the ``ids=`` of files read after ours."""
    merged = list(ours)
    notes: list[str] = []
    writes: list[WriteFile] = []
    for name, rel in config_files(root):
        text = utf8_text(root.read_bytes(rel), "/" + rel) or ""
        new = text
        for n, words in _lines(text):
            where = f"/{rel}:{n}"
            verb = words[0]
            module = words[1].replace("-", "_") if len(words) > 1 else ""
            if verb == "options" and module == "vfio_pci":
                if any(key_of(w).startswith("vfio-pci.") for w in words[2:]):
                    notes.append(
                        f"{where}: vfio-pci.ids= on an options line is no parameter of "
                        "vfio-pci (the kernel ignores it); ids= is"
                    )
                ids = _ids(words)
                if ids is None:
                    continue
                later = name > OURS
                keep, note = _options(where, ids, later, ours, per_device)
                merged += [i for i in keep if i not in merged]
                notes.append(note)
                if later and not per_device and not set(ours) <= set(ids):
                    new = _with_ours(new, n, ours)
            elif verb == "install" and VFIO.match(module):
                notes.append(
                    f"{where}: install {words[1]} replaces the command that loads it; our "
                    "options and softdeps apply only if that command runs modprobe"
                )
            elif verb == "blacklist" and VFIO.match(module):
                notes.append(
                    f"{where}: blacklist {words[1]} stops loading by alias only; our softdeps "
                    "load vfio-pci by name, so it still loads before the GPU drivers"
                )
        if new != text:
            writes.append(WriteFile(rel, new.encode(), "our IDs in the ids= modprobe reads last"))
    return merged, notes, writes
