# SPDX-License-Identifier: Apache-2.0
"""Kernel command-line arguments: what this host needs, and editing a list of them.

Editing keeps every unrelated argument where it was, is idempotent, and adding then
removing the same arguments gives the original list back (property-tested).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import field
from typing import Any

from passthrough.errors import PassthroughError
from passthrough.model import Host
from passthrough.records import frozen


class UnsafeCmdline(PassthroughError):
    def __init__(self, where: str, why: str) -> None:
        super().__init__(f"{where}: {why}; edit it by hand or fix the file, then re-run")


def utf8_text(data: bytes | None, path: str) -> str | None:
    """A file the planner edits and writes back, decoded strictly: a byte that is not UTF-8
    would otherwise come back as U+FFFD in the new file. Refused with the file and line."""
    if data is None:
        return None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data[: exc.start].count(b"\n") + 1
        raise UnsafeCmdline(
            f"{path}:{line}", f"byte 0x{data[exc.start]:02x} is not UTF-8 text"
        ) from None


def key_of(arg: str) -> str:
    """``vfio-pci.ids=10de:2684`` → ``vfio-pci.ids``; module names compare with - and _ alike."""
    name = arg.split("=", 1)[0]
    if "." in name:
        module, _, param = name.partition(".")
        return module.replace("_", "-") + "." + param
    return name


@frozen
class ArgChange:
    """Arguments to set (key → full ``key=value`` or bare ``key``) and keys to drop."""

    set: dict[str, str] = field(default_factory=dict)
    drop: frozenset[str] = frozenset()
    why: dict[str, str] = field(default_factory=dict)  # key → reason, for the plan's text

    def __post_init__(self) -> None:
        # One spelling per key: vfio_pci.ids and vfio-pci.ids are the same parameter.
        object.__setattr__(self, "set", {key_of(k): v for k, v in self.set.items()})
        object.__setattr__(self, "drop", frozenset(key_of(k) for k in self.drop))
        object.__setattr__(self, "why", {key_of(k): v for k, v in self.why.items()})
        both = set(self.set) & self.drop
        if both:  # a change that would set and drop one key has no single meaning
            raise ValueError(f"kernel argument keys both set and dropped: {sorted(both)}")

    def is_empty(self) -> bool:
        return not self.set and not self.drop

    def to_json(self) -> dict[str, list[str]]:
        """The plan's JSON and the journal's record: full arguments set, keys removed."""
        return {"set": list(self.set.values()), "remove": sorted(self.drop)}

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> ArgChange:
        return cls(
            set={key_of(a): a for a in map(str, d.get("set") or [])},
            drop=frozenset(map(str, d.get("remove") or [])),
        )


def edit(args: Sequence[str], change: ArgChange) -> list[str]:
    """Apply ``change`` to ``args``.

    A key being set replaces its first occurrence in place (later duplicates go, since
    the kernel would let the last one win); a new key is appended; dropped keys go.
    """
    out: list[str] = []
    placed: set[str] = set()
    for arg in args:
        key = key_of(arg)
        if key in change.drop:
            continue
        if key in change.set:
            if key not in placed:
                out.append(change.set[key])
                placed.add(key)
            continue
        out.append(arg)
    for key, arg in change.set.items():
        if key not in placed:
            out.append(arg)
    return out


def _holds(key: str, values: list[str], want: str) -> bool:
    """Whether the kernel ends with ``want`` for ``key`` given every occurrence in order.
    Most parameters keep the last value (``iommu=1 iommu=pt`` is iommu=pt: nothing to
    change); the huge-page keys do not (default_hugepagesz ignores a second one, hugepagesz
    and hugepages pair up by position), so there every occurrence must be ours."""
    if key in HUGEPAGE_KEYS:
        return set(values) == {want}
    return bool(values) and values[-1] == want


def needed(args: Sequence[str], change: ArgChange) -> ArgChange:
    """The part of ``change`` that ``args`` does not already satisfy."""
    present: dict[str, list[str]] = {}
    for arg in args:
        present.setdefault(key_of(arg), []).append(arg)
    to_set = {k: v for k, v in change.set.items() if not _holds(k, present.get(k, []), v)}
    to_drop = frozenset(k for k in change.drop if k in present)
    return ArgChange(
        set=to_set,
        drop=to_drop,
        why={k: change.why[k] for k in change.why if k in to_set or k in to_drop},
    )


def union(changes: Sequence[ArgChange]) -> ArgChange:
    """Several changes drawn from one target (one per loader entry) as the one the plan
    and the journal record: every key any of them sets or drops."""
    return ArgChange(
        set={k: v for c in changes for k, v in c.set.items()},
        drop=frozenset(k for c in changes for k in c.drop),
        why={k: v for c in changes for k, v in c.why.items()},
    )


def invert(before: Sequence[str], change: ArgChange) -> ArgChange:
    """The change that turns ``edit(before, change)`` back into ``before`` for the keys
    ``change`` touches: each one's value before (the last, the one the kernel reads) set
    again, or dropped where ``before`` had none; keys in ``change``'s order (set, then drop
    sorted). What a bootloader's undo command puts back."""
    present = {key_of(arg): arg for arg in before}
    keys = [*change.set, *sorted(change.drop - change.set.keys())]
    return ArgChange(
        set={k: present[k] for k in keys if k in present},
        drop=frozenset(k for k in keys if k not in present),
    )


HUGEPAGE_KEYS = ("default_hugepagesz", "hugepagesz", "hugepages")


@frozen
class KargOptions:
    """What the kernel arguments should hold: iommu=pt, vfio-pci.ids, hugepages."""

    iommu_pt: bool = True
    vfio_ids: tuple[str, ...] = ()  # empty: bind per device instead
    # IDs bound per device to a vfio variant driver: never kept from the configuration's
    # vfio-pci.ids (vfio-pci would claim those devices first)
    variant_ids: tuple[str, ...] = ()
    boot_gpu: bool = False
    hugepages_1g: int = 0
    release_hugepages: bool = False  # the pages an earlier apply reserved go


def _last(args: Sequence[str], key: str) -> str | None:
    found: str | None = None
    for arg in args:
        if key_of(arg) == key_of(key):
            found = arg.partition("=")[2]
    return found


class _Args:
    """Arguments as the running kernel and the bootloader configuration hold them."""

    def __init__(self, running: Sequence[str], configured: Sequence[str]) -> None:
        self.sources = (list(configured), list(running))

    def arg(self, key: str) -> str | None:
        for source in self.sources:
            value = _last(source, key)
            if value is not None:
                return value
        return None


def _other_ids(configured: Sequence[str], ours: Sequence[str]) -> list[str]:
    """IDs in the configuration's ``vfio-pci.ids=`` that are not ours, in order."""
    out: list[str] = []
    for arg in configured:
        if key_of(arg) == "vfio-pci.ids":
            for item in arg.partition("=")[2].split(","):
                if item and item not in ours and item not in out:
                    out.append(item)
    return out


def desired(host: Host, opts: KargOptions, configured: Sequence[str] = ()) -> ArgChange:
    """Arguments this host needs for passthrough, with a reason for each. Values in the
    bootloader's configuration (``configured``) count before the running command line."""
    to_set: dict[str, str] = {}
    drop: set[str] = set()
    why: dict[str, str] = {}
    k = _Args(host.kernel.cmdline, configured)
    config = host.kernel.config
    if host.cpu.vendor == "GenuineIntel":
        # Debian's kernels choose "on, except for an integrated GPU"; only an iGPU then
        # needs intel_iommu=on, and this toolkit hands over discrete cards.
        default_on = "y" in (
            config.get("CONFIG_INTEL_IOMMU_DEFAULT_ON"),
            config.get("CONFIG_INTEL_IOMMU_DEFAULT_ON_INTGPU_OFF"),
        )
        arg = k.arg("intel_iommu")
        if not default_on or (arg is not None and "off" in arg.split(",")):
            to_set["intel_iommu"] = "intel_iommu=on"
            why["intel_iommu"] = (
                "replaces intel_iommu=off"
                if arg is not None and "off" in arg.split(",")
                else "this kernel does not enable the Intel IOMMU by default"
            )
    elif host.cpu.vendor == "AuthenticAMD":
        arg = k.arg("amd_iommu")
        if arg is not None and ("on" in arg.split(",") or "off" in arg.split(",")):
            drop.add("amd_iommu")
            why["amd_iommu"] = (
                "amd_iommu=on is not a valid value (the AMD IOMMU is on by default)"
                if "on" in arg.split(",")
                else "amd_iommu=off turns the IOMMU off"
            )
    iommu_off = k.arg("iommu") == "off"
    if opts.iommu_pt:
        # setting the key replaces every other value of it where it is written: iommu=off
        # goes by that, never by dropping the key (which would drop iommu=pt with it)
        to_set["iommu"] = "iommu=pt"
        why["iommu"] = "identity-maps host devices (usually faster for the host)" + (
            "; replaces iommu=off, which turns the IOMMU off" if iommu_off else ""
        )
    elif iommu_off:
        drop.add("iommu")
        why["iommu"] = "iommu=off turns the IOMMU off"
    if opts.vfio_ids:
        others = _other_ids(configured, opts.vfio_ids)
        gone = [i for i in others if i in opts.variant_ids]
        others = [i for i in others if i not in opts.variant_ids]
        to_set["vfio-pci.ids"] = "vfio-pci.ids=" + ",".join([*opts.vfio_ids, *others])
        why["vfio-pci.ids"] = (
            "binds the cards' functions to vfio-pci at boot"
            + (
                f"; keeps {','.join(others)} (another device's, already configured: one "
                "vfio-pci.ids= is read, so both sets go in ours)"
                if others
                else ""
            )
            + (f"; drops {','.join(gone)} (bound to a vfio variant driver)" if gone else "")
        )
    elif k.arg("vfio-pci.ids") is not None or k.arg("vfio_pci.ids") is not None:
        drop.add("vfio-pci.ids")
        why["vfio-pci.ids"] = "stale: the cards are bound per device (driver_override) instead"
    if host.boot.initramfs.value == "dracut":
        to_set["rd.driver.pre"] = "rd.driver.pre=vfio-pci"
        why["rd.driver.pre"] = "dracut loads vfio-pci before the GPU drivers"
    if opts.boot_gpu:
        if config.get("CONFIG_SYSFB_SIMPLEFB") == "y":
            to_set["initcall_blacklist"] = "initcall_blacklist=sysfb_init"
            why["initcall_blacklist"] = (
                "keeps the firmware framebuffer off the boot GPU (simplefb kernel)"
            )
        else:
            to_set["video"] = "video=efifb:off"
            why["video"] = "keeps the EFI framebuffer off the boot GPU"
    _hugepages(opts, k, to_set, drop, why)
    return ArgChange(set=to_set, drop=frozenset(drop), why=why)


def _hugepages(
    opts: KargOptions, k: _Args, to_set: dict[str, str], drop: set[str], why: dict[str, str]
) -> None:
    """1 GiB pages reserved at boot, or (``release_hugepages``) those an earlier apply
    reserved taken out again."""
    if opts.hugepages_1g:
        to_set["default_hugepagesz"] = "default_hugepagesz=1G"
        to_set["hugepagesz"] = "hugepagesz=1G"
        to_set["hugepages"] = f"hugepages={opts.hugepages_1g}"
        for key in HUGEPAGE_KEYS:
            why[key] = f"{opts.hugepages_1g} x 1 GiB huge pages reserved at boot for guest memory"
    elif opts.release_hugepages:
        for key in HUGEPAGE_KEYS:
            if k.arg(key) is not None:
                drop.add(key)
                why[key] = "the 1 GiB huge pages an earlier apply reserved go back to the host"


def describe(change: ArgChange) -> list[str]:
    def line(sign: str, text: str, key: str) -> str:
        why = change.why.get(key)
        return f"{sign} {text}  ({why})" if why else f"{sign} {text}"

    lines = [line("+", arg, key) for key, arg in change.set.items()]
    lines += [line("-", key, key) for key in sorted(change.drop)]
    return lines
