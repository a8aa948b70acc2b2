# SPDX-License-Identifier: Apache-2.0
"""The VM options as one table: name, type, range or pattern, default, help, and where
each comes from (a ``render`` flag, a key of ``--spec FILE.yaml``).

Both the spec file and the flags are read through this table, so they accept exactly the
same values and name the same field when they refuse one. ``check_options`` runs the same
checks again on a :class:`~passthrough.vm.spec.VmOptions` built any other way (the Python
API, the Ansible module). Every refusal is one line naming the field; nothing is written.
"""

from __future__ import annotations

import argparse
import re
from collections.abc import Mapping
from enum import StrEnum
from typing import TYPE_CHECKING, Any

from passthrough.errors import PassthroughError
from passthrough.pciaddr import CARD_METAVAR
from passthrough.records import frozen
from passthrough.units import MIB, parse_size

if TYPE_CHECKING:
    from passthrough.model import Host

NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.+-]{0,63}$")
VENDOR_ID_RE = re.compile(r"^[A-Za-z0-9_ .-]{1,12}$")
PATH_SAFE = re.compile(r"^[^\x00-\x1f<>&\"'\]]+$")
# Linux interface names (dev_valid_name: under IFNAMSIZ, no '/', ':' or whitespace) within
# what libvirt's deviceName allows; no ',' either, QEMU's option separator.
IFNAME_RE = re.compile(r"^(?!\.\.?$)[A-Za-z0-9_.-]{1,15}$")
NETWORK_RE = re.compile(r"^[A-Za-z0-9_.+-]{1,64}$")
# libvirt keeps memory as a byte count in a signed 64-bit integer
MAX_MEMORY_MIB = (2**63 - 1) >> 20
MIN_MEMORY_MIB = 256
MAX_VCPUS = 4096
DEFAULT_VENDOR_ID = "passthrough"  # any ≤ 12-character string works; the point is not "KVMKVMKVM"


class BadVmSpec(PassthroughError):
    """A VM option that cannot be used, named by its field (flag or spec key)."""

    def __init__(self, field_name: str, why: str) -> None:
        super().__init__(f"{field_name}: {why}")
        self.field = field_name
        self.why = why


class Kind(StrEnum):
    TEXT = "str"
    INT = "int"
    BOOL = "bool"
    SIZE = "size"  # MiB, or text with a G/M suffix
    PATH = "path"  # an absolute path on the host the guest runs on
    CHOICE = "choice"
    ROM = "rom"  # on | off | an absolute ROM file path
    CARDS = "cards"  # cards: a PCI address or a vendor:device ID each (analysis/cards.py)


@frozen
class VmOption:
    name: str  # the VmOptions field
    kind: Kind
    help: str
    default: Any = None
    minimum: int | None = None
    maximum: int | None = None
    pattern: re.Pattern[str] | None = None
    what: str = ""  # what the pattern means, for the refusal
    choices: tuple[str, ...] = ()
    key: str = ""  # spec-file key (default: name)
    aliases: tuple[str, ...] = ()  # other spec-file keys accepted for it
    flag: str = ""  # render flag (default: --key with '-')
    negated: bool = False  # a boolean whose flag turns it off (--no-hide)
    flag_help: str = ""  # the flag's help where it differs (a negated flag)
    metavar: str = ""

    @property
    def spec_key(self) -> str:
        return self.key or self.name

    @property
    def cli_flag(self) -> str:
        return self.flag or "--" + self.spec_key.replace("_", "-")


OPTIONS: tuple[VmOption, ...] = (
    VmOption(
        "name",
        Kind.TEXT,
        "domain name",
        pattern=NAME_RE,
        what="a domain name (letters, digits, _ . + -; up to 64)",
    ),
    VmOption(
        "gpus",
        Kind.CARDS,
        "a card (repeatable); default: every viable NVIDIA GPU",
        default=(),
        aliases=("gpu",),
        flag="--gpu",
    ),
    VmOption(
        "nvswitches",
        Kind.CARDS,
        "an NVSwitch, or 'all' (repeatable), with every GPU: a guest that owns the whole NVLink "
        "domain (Fabric Manager runs in it); without it the NVSwitches stay with the host",
        default=(),
        key="nvswitches",
        aliases=("nvswitch",),
        flag="--nvswitch",
        metavar="all|ADDRESS",
    ),
    VmOption(
        "no_gpu",
        Kind.BOOL,
        "a guest without a card, knowingly (without it, no card to pass through is refused)",
        default=False,
    ),
    VmOption(
        "vcpus",
        Kind.INT,
        "virtual CPUs (at most the host's logical CPUs)",
        default=4,
        minimum=1,
        maximum=MAX_VCPUS,
    ),
    VmOption(
        "memory_mib",
        Kind.SIZE,
        "guest memory: MiB, or with a G/M suffix (16G); at most the host's RAM",
        default=8192,
        minimum=MIN_MEMORY_MIB,
        maximum=MAX_MEMORY_MIB,
        key="memory",
        aliases=("memory_mib",),
    ),
    VmOption(
        "overcommit",
        Kind.BOOL,
        "allow more guest memory than the host has RAM",
        default=False,
        flag="--allow-overcommit",
    ),
    VmOption("disk", Kind.PATH, "an existing disk image or volume", pattern=PATH_SAFE),
    VmOption(
        "base_image",
        Kind.PATH,
        "a cloud image; `vm define` makes a qcow2 overlay on it",
        pattern=PATH_SAFE,
    ),
    VmOption(
        "image_dir",
        Kind.PATH,
        "where the overlay goes (default /var/lib/libvirt/images)",
        default="/var/lib/libvirt/images",
        pattern=PATH_SAFE,
    ),
    VmOption(
        "bridge",
        Kind.TEXT,
        "attach to a host bridge",
        metavar="BRIDGE",
        pattern=IFNAME_RE,
        what="a Linux interface name (1-15 letters, digits, _ . -)",
    ),
    VmOption(
        "network",
        Kind.TEXT,
        "attach to a libvirt network (default: default; none: no NIC)",
        default="default",
        metavar="NAME",
        pattern=NETWORK_RE,
        what="a libvirt network name (letters, digits, _ . + -)",
    ),
    VmOption(
        "seed", Kind.PATH, "cloud-init seed ISO (user, SSH key)", pattern=PATH_SAFE, metavar="ISO"
    ),
    VmOption(
        "cdrom",
        Kind.PATH,
        "an installer ISO: a SATA CD-ROM the guest boots from first, then its disk",
        pattern=PATH_SAFE,
        metavar="ISO",
    ),
    VmOption(
        "driver_iso",
        Kind.PATH,
        "a second CD-ROM: drivers for Setup (virtio-win for a Windows guest's virtio disk)",
        pattern=PATH_SAFE,
        metavar="ISO",
    ),
    VmOption(
        "disk_bus",
        Kind.CHOICE,
        "the disk's bus (default: sata for Windows without --driver-iso, which Setup sees "
        "without a driver; else virtio)",
        choices=("virtio", "sata"),
    ),
    VmOption(
        "secure_boot",
        Kind.BOOL,
        "UEFI Secure Boot with Microsoft keys enrolled (default: on for Windows, off for Linux)",
        flag="--no-secure-boot",
        flag_help="firmware without Secure Boot (the Windows profile has it)",
        negated=True,
    ),
    VmOption(
        "tpm",
        Kind.BOOL,
        "an emulated TPM 2.0 (tpm-crb, swtpm) (default: on for Windows, off for Linux)",
        flag="--no-tpm",
        flag_help="no emulated TPM (the Windows profile has one)",
        negated=True,
    ),
    VmOption(
        "usb_input",
        Kind.BOOL,
        "a USB tablet and keyboard (default: on for Windows, off for Linux)",
        flag="--no-usb-input",
        flag_help="no USB tablet and keyboard (the Windows profile has them)",
        negated=True,
    ),
    VmOption(
        "graphics",
        Kind.CHOICE,
        "a console on 127.0.0.1: vnc or spice (default: vnc for Windows, none for Linux, "
        "whose console is the serial one)",
        choices=("vnc", "spice"),
    ),
    VmOption(
        "headless",
        Kind.BOOL,
        "no graphical console (after installation; the serial console stays)",
        default=False,
    ),
    VmOption(
        "topology",
        Kind.BOOL,
        "one socket, the vCPUs as cores (threads as the host's SMT where they divide)",
        default=True,
        flag="--no-topology",
        flag_help="leave the vCPU topology to libvirt (one socket per vCPU)",
        negated=True,
    ),
    VmOption(
        "profile",
        Kind.CHOICE,
        "guest OS profile",
        default="linux",
        choices=("linux", "windows"),
    ),
    VmOption(
        "hide",
        Kind.BOOL,
        "hide the hypervisor from the guest (KVM hidden, a Hyper-V vendor_id)",
        default=True,
        flag="--no-hide",
        flag_help="do not hide the hypervisor (drivers from R465 on do not need it)",
        negated=True,
    ),
    VmOption(
        "vendor_id",
        Kind.TEXT,
        "Hyper-V vendor_id (1-12 characters, no commas)",
        metavar="TEXT",
        default=DEFAULT_VENDOR_ID,
        pattern=VENDOR_ID_RE,
        what="a Hyper-V vendor_id (1 to 12 letters/digits, no commas)",
    ),
    VmOption(
        "hide_hypervisor_cpuid",
        Kind.BOOL,
        "also clear the CPUID hypervisor bit: costs Windows every Hyper-V enlightenment "
        "(timers, TLB flush)",
        default=False,
    ),
    VmOption(
        "rom",
        Kind.ROM,
        "the cards' option ROM: on (default), off (ROM BAR off) or an absolute ROM file path",
        default="on",
        pattern=PATH_SAFE,
    ),
    VmOption("hugepages", Kind.BOOL, "back memory with huge pages, locked", default=False),
    VmOption(
        "numa_pin",
        Kind.BOOL,
        "pin vCPUs and memory to the GPUs' NUMA node",
        default=True,
        flag="--no-numa-pin",
        flag_help="do not pin to the GPUs' NUMA node",
        negated=True,
    ),
    VmOption(
        "iommufd",
        Kind.BOOL,
        "the cards on iommufd (/dev/iommu and each function's /dev/vfio/devices/vfioN) instead "
        "of the legacy vfio container; refused where the host, QEMU or libvirt lacks it",
        default=False,
    ),
    VmOption(  # kvm: hardware virtualization, every real GPU guest; qemu: TCG
        "virt_type",
        Kind.CHOICE,
        "kvm (default) or qemu: software emulation (TCG) for a lab or CI machine without "
        "a working /dev/kvm; the CPU model becomes QEMU's max instead of host-passthrough",
        default="kvm",
        choices=("kvm", "qemu"),
    ),
)
BY_NAME = {o.name: o for o in OPTIONS}
BY_KEY = {k: o for o in OPTIONS for k in (o.spec_key, *o.aliases)}


def size_mib(text: str, where: str) -> int:
    """``16G`` / ``16384M`` / ``16384`` → MiB."""
    size = parse_size(text, MIB)
    if size is None or size % MIB:
        raise BadVmSpec(where, f"{_show(text)} is not MiB or a size such as 16G")
    return size // MIB


def _show(value: object) -> str:
    """A value as the user wrote it (booleans as YAML and JSON spell them), cut short."""
    text = str(value).lower() if isinstance(value, bool) else repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def check(opt: VmOption, value: Any, where: str) -> Any:
    """``value`` (already of the option's type) against its range, pattern or choices."""
    if value is None and opt.default is None:
        return value  # optional and not given
    if opt.kind in (Kind.INT, Kind.SIZE):
        if isinstance(value, bool) or not isinstance(value, int):
            raise BadVmSpec(where, f"{_show(value)} is not a whole number")
        unit = " MiB" if opt.kind is Kind.SIZE else ""
        if opt.minimum is not None and value < opt.minimum:
            raise BadVmSpec(where, f"{value}{unit} is below the minimum of {opt.minimum}{unit}")
        if opt.maximum is not None and value > opt.maximum:
            raise BadVmSpec(where, f"{value}{unit} is above the maximum of {opt.maximum}{unit}")
        return value
    if opt.kind is Kind.BOOL:
        if not isinstance(value, bool):
            raise BadVmSpec(where, f"{_show(value)} is not true or false (unquoted in YAML)")
        return value
    if opt.kind is Kind.CARDS:
        # the card parser (and the model under it) only where a card is read, not for --help
        from passthrough.analysis.cards import NoSuchCard, parse_card

        if not isinstance(value, (tuple, list)):
            raise BadVmSpec(where, f"{_show(value)} is not a list of PCI addresses")
        for item in value:
            if not isinstance(item, str):
                raise BadVmSpec(where, f"{_show(item)} is not a PCI address")
            if opt.metavar.startswith("all|") and item.lower() == "all":
                continue  # --nvswitch all: every one (analysis/nvswitch.py)
            try:
                parse_card(item)
            except NoSuchCard:
                raise BadVmSpec(
                    where,
                    f"{_show(item)} is neither a PCI address (0000:01:00.0) nor a "
                    "vendor:device ID (10de:2684)",
                ) from None
        return tuple(value)
    if not isinstance(value, str):
        raise BadVmSpec(where, f"{_show(value)} is not text")
    if opt.kind is Kind.CHOICE:
        if value not in opt.choices:
            raise BadVmSpec(where, f"{_show(value)} is not {' or '.join(opt.choices)}")
        return value
    if opt.kind is Kind.ROM and value in ("on", "off"):
        return value
    if opt.kind in (Kind.PATH, Kind.ROM):
        if opt.pattern is not None and not opt.pattern.fullmatch(value):
            raise BadVmSpec(
                where,
                f"{_show(value)} is not a safe path (no quotes, <, &, ] or control characters)",
            )
        if not value.startswith("/"):
            raise BadVmSpec(where, f"{_show(value)} is not an absolute path (libvirt needs one)")
        return value
    if opt.pattern is not None and not opt.pattern.fullmatch(value):
        raise BadVmSpec(where, f"{_show(value)} is not {opt.what}")
    return value


def check_options(values: Mapping[str, Any]) -> None:
    """Every option's value (by VmOptions field name) against the table."""
    for name, value in values.items():
        opt = BY_NAME.get(name)
        if opt is not None:  # every field has a row (tests/test_hostile_values.py holds it)
            check(opt, value, opt.spec_key)


def check_against_host(host: Host, vcpus: int, memory_mib: int, overcommit: bool) -> list[str]:
    """What the host can give: vCPUs up to its logical CPUs, memory up to its RAM (unless
    ``overcommit``). Facts the root does not hold (a bare tree) are not guessed: the
    warnings returned say what could not be checked."""
    unchecked = [
        f"{what} not checked against the host: this root has no {path}"
        for what, path, known in (
            ("vcpus", "/proc/cpuinfo", host.cpu.logical_cpus),
            ("memory", "/proc/meminfo", host.memory_mib),
        )
        if not known
    ]
    cpus = host.cpu.logical_cpus
    if cpus and vcpus > cpus:
        raise BadVmSpec("vcpus", f"{vcpus} is more than this host's {cpus} logical CPUs")
    if host.memory_mib is not None and memory_mib > host.memory_mib and not overcommit:
        raise BadVmSpec(
            "memory",
            f"{memory_mib} MiB is more than this host's {host.memory_mib} MiB of RAM "
            "(--allow-overcommit / overcommit: true to allow it)",
        )
    return unchecked


def unknown_key(key: str, where: str) -> BadVmSpec:
    import difflib  # only on a mistake

    close = difflib.get_close_matches(key, list(BY_KEY), n=1)
    hint = f" (did you mean {close[0]!r}?)" if close else ""
    return BadVmSpec(where, f"unknown option {key!r}{hint}")


# -- the render flags --------------------------------------------------------------------


def add_flags(parser: argparse.ArgumentParser, leave_out: frozenset[str] = frozenset()) -> None:
    """One render flag per option, text in, checked by :func:`from_flags` (so a refusal
    names the flag and reads like one from the spec file); none for the options named in
    ``leave_out`` (a command that has no use for them: kubevirt render)."""
    metavars = {Kind.INT: "N", Kind.SIZE: "SIZE", Kind.PATH: "PATH", Kind.ROM: "on|off|FILE"}
    for opt in OPTIONS:
        if opt.name in leave_out:
            continue
        help = opt.flag_help or opt.help
        if opt.kind is Kind.BOOL:
            parser.add_argument(
                opt.cli_flag, dest=opt.name, action="store_true", default=None, help=help
            )
        elif opt.kind is Kind.CARDS:
            parser.add_argument(
                opt.cli_flag,
                dest=opt.name,
                action="append",
                metavar=opt.metavar or CARD_METAVAR,
                help=help,
            )
        elif opt.kind is Kind.CHOICE:
            parser.add_argument(opt.cli_flag, dest=opt.name, choices=opt.choices, help=help)
        else:
            metavar = opt.metavar or metavars.get(opt.kind, opt.spec_key.upper())
            parser.add_argument(opt.cli_flag, dest=opt.name, metavar=metavar, help=help)


def _int_text(text: str, where: str) -> int:
    t = text.strip()
    if not (t.isascii() and t.isdigit()):
        raise BadVmSpec(where, f"{_show(text)} is not a whole number")
    return int(t)


def from_flags(args: argparse.Namespace) -> dict[str, Any]:
    """The options given as flags, parsed and checked (VmOptions field → value)."""
    values: dict[str, Any] = {}
    for opt in OPTIONS:
        raw = getattr(args, opt.name, None)
        if raw is None:
            continue
        where = opt.cli_flag
        if opt.kind is Kind.BOOL:
            value: Any = not opt.negated
        elif opt.kind is Kind.INT:
            value = _int_text(raw, where)
        elif opt.kind is Kind.SIZE:
            value = size_mib(raw, where)
        elif opt.kind is Kind.CARDS:
            value = tuple(raw)
        else:
            value = raw
        values[opt.name] = check(opt, value, where)
    return values


# -- the Ansible module's options --------------------------------------------------------

# Ansible's option types for each kind; sizes are whole MiB there (memory_mib), paths stay
# "str" so Ansible does not expand ~ or variables in them before the table checks them.
ANSIBLE_TYPES = {
    Kind.TEXT: "str",
    Kind.INT: "int",
    Kind.BOOL: "bool",
    Kind.SIZE: "int",
    Kind.PATH: "str",
    Kind.CHOICE: "str",
    Kind.ROM: "str",
    Kind.CARDS: "list",
}


def ansible_option(opt: VmOption) -> dict[str, Any]:
    """One option as an Ansible argument_spec entry, named by its VmOptions field."""
    entry: dict[str, Any] = {"type": ANSIBLE_TYPES[opt.kind]}
    if opt.kind is Kind.CARDS:
        entry["elements"] = "str"
    if opt.choices:
        entry["choices"] = list(opt.choices)
    if opt.default is None:
        # the one option without a default and without which there is no guest
        if opt.name == "name":
            entry["required"] = True
    else:
        entry["default"] = list(opt.default) if isinstance(opt.default, tuple) else opt.default
    return entry


def ansible_argument_spec() -> dict[str, dict[str, Any]]:
    """The passthrough_vm module's guest options, generated from :data:`OPTIONS`."""
    return {opt.name: ansible_option(opt) for opt in OPTIONS}
