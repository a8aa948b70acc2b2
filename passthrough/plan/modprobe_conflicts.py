"""Other modprobe.d lines about vfio, named in the plan with what wins at boot.

modprobe reads every ``*.conf`` of /etc/modprobe.d, /run/modprobe.d and the library
directories in the order of their file names (a name in /etc hides the same name further
down). The ``options`` lines for one module are joined in that order, and a parameter
given twice ends with the last value: another file's ``options vfio-pci ids=`` either
comes before ours (ours wins, so ours carries its IDs too) or after ours (it wins: refused
unless it already binds our IDs). ``install`` replaces the command that loads a module;
``blacklist`` only stops loading through aliases.
"""

from __future__ import annotations

import re

from passthrough.host.root import HostRoot
from passthrough.plan.kargs import UnsafeCmdline, key_of, utf8_text
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


def review(root: HostRoot, ours: list[str], per_device: bool) -> tuple[list[str], list[str]]:
    """Our ``ids=`` merged with those of files read before ours, and a note per conflict."""
    merged = list(ours)
    notes: list[str] = []
    for name, rel in config_files(root):
        text = utf8_text(root.read_bytes(rel), "/" + rel) or ""
        for n, words in _lines(text):
            where = f"/{rel}:{n}"
            verb = words[0]
            module = words[1].replace("-", "_") if len(words) > 1 else ""
            if verb == "options" and module == "vfio_pci":
                ids = _ids(words)
                if any(key_of(w).startswith("vfio-pci.") for w in words[2:]):
                    notes.append(
                        f"{where}: vfio-pci.ids= on an options line is no parameter of "
                        "vfio-pci (the kernel ignores it); ids= is"
                    )
                if ids is None:
                    continue
                if per_device:
                    notes.append(
                        f"{where}: options vfio-pci ids={','.join(ids)} binds by ID at boot, "
                        "beside our per-device binding: check it names none of the kept cards"
                    )
                elif name > OURS and not set(ours) <= set(ids):
                    raise UnsafeCmdline(
                        where,
                        f"sets vfio-pci ids={','.join(ids)} and is read after {OURS}, so its "
                        f"value replaces ours at boot; add {','.join(ours)} to it or remove it",
                    )
                elif name > OURS:
                    notes.append(
                        f"{where}: its vfio-pci ids= is read after ours and wins; it binds ours too"
                    )
                else:
                    extra = [i for i in ids if i not in merged]
                    merged += extra
                    notes.append(
                        f"{where}: its vfio-pci ids= is read before ours, ours wins"
                        + (f" and keeps {','.join(extra)}" if extra else "")
                    )
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
    return merged, notes
