# SPDX-License-Identifier: Apache-2.0
"""The guest's own view of its GPU: the PCI functions and BARs in sysfs, the driver bound, its
version, the device nodes and NVRM's complaints in the kernel log. Standard library only."""

from __future__ import annotations

import re
from collections.abc import Sequence

from .report import FAIL, PASS, SKIP, WARN, GuestBar, GuestCheck, GuestGpu
from .root import GuestRoot
from .runner import Runner
from .virt import PCI_NAME, hex_id, hex_pair, uevent

VENDOR_NVIDIA = 0x10DE

# The host-side fix for BARs the guest's firmware could not place (the large-BAR failure).
BAR_FIX = (
    "on the host, give the VM a 64-bit MMIO window as large as the card's BARs: re-render it "
    "with `passthrough render --gpu ADDRESS` (it sizes <pcihole64> and OVMF's "
    "X-PciMmio64Mb from the BARs), define it again and restart it"
)

# -- reading -----------------------------------------------------------------------------


def parse_resource(text: str) -> tuple[GuestBar, ...]:
    """sysfs ``resource``: one ``start end flags`` line per region; lines 0-5 are the BARs."""
    bars = []
    for index, line in enumerate(text.splitlines()[:6]):
        parts = line.split()
        if len(parts) != 3:
            continue
        try:
            start, end, flags = (int(p, 16) for p in parts)
        except ValueError:
            continue  # not what the kernel writes: the line tells nothing
        size = end - start + 1 if end > start else 0
        bars.append(GuestBar(index, start, size, flags))
    return tuple(bars)


def bad_lines(text: str) -> tuple[int, ...]:
    """The BAR lines (0-5) of a ``resource`` file that are not three hex numbers: not what
    the kernel writes (a damaged or cut copy). A file of fewer lines lacks the rest."""
    lines = text.splitlines()[:6]
    bad = [i for i, line in enumerate(lines) if not _bar_line(line)]
    return tuple(bad + list(range(len(lines), 6)))


def _bar_line(line: str) -> bool:
    parts = line.split()
    try:
        return len(parts) == 3 and all(p.startswith("0x") and int(p, 16) >= 0 for p in parts)
    except ValueError:
        return False


def read_gpus(root: GuestRoot) -> tuple[GuestGpu, ...]:
    gpus = []
    for addr in root.listdir("sys/bus/pci/devices"):
        if not PCI_NAME.fullmatch(addr):
            continue  # not what the kernel names a function (a planted entry)
        base = f"sys/bus/pci/devices/{addr}"
        # uevent first: one read gives IDs, class and driver, and a snapshot may hold only it
        event = uevent(root.read, base)
        vendor, device = (
            hex_pair(event["PCI_ID"])
            if "PCI_ID" in event
            else (hex_id(root.read(f"{base}/vendor")), hex_id(root.read(f"{base}/device")))
        )
        if vendor != VENDOR_NVIDIA:
            continue
        sv, sd = (
            hex_pair(event["PCI_SUBSYS_ID"])
            if "PCI_SUBSYS_ID" in event
            else (
                hex_id(root.read(f"{base}/subsystem_vendor")),
                hex_id(root.read(f"{base}/subsystem_device")),
            )
        )
        class_code = hex_id(event.get("PCI_CLASS")) or hex_id(root.read(f"{base}/class"))
        resource = root.read(f"{base}/resource")
        driver = root.link_name(f"{base}/driver")
        if driver is None and root.host_files_only:
            driver = event.get("DRIVER")  # such a snapshot kept uevent, never the link
        gpus.append(
            GuestGpu(
                address=addr,
                vendor_id=vendor,
                device_id=device or 0,
                subsystem=f"{sv:04x}:{sd:04x}" if sv is not None and sd is not None else None,
                class_code=class_code or 0,
                driver=driver,
                bars=parse_resource(resource) if resource else (),
                resource_readable=resource is not None,
                resource_bad=bad_lines(resource) if resource is not None else (),
            )
        )
    return tuple(gpus)


def driver_version(root: GuestRoot) -> str | None:
    text = root.read("proc/driver/nvidia/version") or ""
    m = re.search(r"NVRM version:.*?\s(\d+\.\d+(?:\.\d+)?)\s", text + " ")
    return m.group(1) if m else None


def _size(n: int) -> str:
    for unit, factor in (("G", 1 << 30), ("M", 1 << 20), ("K", 1 << 10)):
        if n >= factor and n % factor == 0:
            return f"{n // factor}{unit}"
    return f"{n}B"


def bus_id(text: str) -> str:
    """nvidia-smi's 00000000:00:06.0 → 0000:00:06.0 (sysfs spelling), lower case."""
    dom, _colon, rest = text.strip().lower().partition(":")
    return f"{int(dom, 16):04x}:{rest}" if rest else text.strip().lower()


# -- the checks --------------------------------------------------------------------------


def check_functions(gpus: Sequence[GuestGpu]) -> GuestCheck:
    if not gpus:
        return GuestCheck(
            "gpu-functions",
            FAIL,
            "no NVIDIA PCI function in this guest",
            "attach the GPU to this VM on the host (`passthrough render --gpu ADDRESS`, "
            "`passthrough vm define`), with the card bound to vfio-pci there",
        )
    parts = [f"{g.address} {g.id} (subsystem {g.subsystem or '?'})" for g in gpus]
    return GuestCheck(
        "gpu-functions",
        PASS,
        f"{len(gpus)} NVIDIA function{'s' if len(gpus) > 1 else ''}: " + ", ".join(parts),
        data={"addresses": [g.address for g in gpus]},
    )


def bar_problems(g: GuestGpu) -> list[str]:
    """BARs the guest could not place, from sysfs ``resource`` alone (no config space).

    A BAR the firmware could not fit shows either with its flags but no address
    (IORESOURCE_UNSET, start 0) or as an empty line. An empty line is only telling when it
    is not the upper half of a 64-bit BAR and a placed BAR follows it (a hole): trailing
    empty lines are just slots the card does not use.
    """
    problems = [
        f"resource{b.index} unplaced"
        for b in g.bars
        if b.flags and (b.unset or b.start == 0 or b.size == 0)
    ]
    by_index = {b.index: b for b in g.bars}
    last_used = max((b.index for b in g.bars if b.flags), default=-1)
    empty_before = False
    for i in range(last_used):
        b = by_index.get(i)
        prev = by_index.get(i - 1)
        empty = b is None or not b.flags
        upper_half = prev is not None and prev.is_64bit
        if empty and not upper_half and not empty_before:  # one hole, one line
            problems.append(f"resource{i} empty before resource{last_used}: a BAR was not placed")
        empty_before = empty and not upper_half
    return problems


def check_bars(gpus: Sequence[GuestGpu]) -> GuestCheck:
    displays = [g for g in gpus if g.is_display]
    if not displays:
        return GuestCheck("gpu-bars", SKIP, "no NVIDIA GPU function to look at")
    problems: list[str] = []
    shown: list[str] = []
    for g in displays:
        if not g.resource_readable:
            problems.append(f"{g.address}: no sysfs resource file")
            continue
        if g.resource_bad:
            lines = ", ".join(str(i) for i in g.resource_bad)
            problems.append(
                f"{g.address}: resource lines {lines} are not the kernel's 'start end flags' "
                "(a damaged or cut copy): its BARs cannot be told"
            )
            continue
        problems += [f"{g.address} {p}" for p in bar_problems(g)]
        shown.append(
            f"{g.address} "
            + " ".join(f"resource{b.index}={_size(b.size)}" for b in g.bars if b.size)
        )
    data = {g.address: {str(b.index): b.size for b in g.bars if b.size} for g in displays}
    if problems:
        return GuestCheck("gpu-bars", FAIL, "; ".join(problems), BAR_FIX, data)
    return GuestCheck("gpu-bars", PASS, "BARs assigned: " + "; ".join(shown), data=data)


def check_driver(gpus: Sequence[GuestGpu]) -> GuestCheck:
    displays = [g for g in gpus if g.is_display]
    if not displays:
        return GuestCheck("driver-bound", SKIP, "no NVIDIA GPU function to look at")
    drivers = {g.address: g.driver for g in displays}
    nouveau = [a for a, d in drivers.items() if d == "nouveau"]
    unbound = [a for a, d in drivers.items() if d is None]
    other = [f"{a} ({d})" for a, d in drivers.items() if d not in (None, "nouveau", "nvidia")]
    data = {"drivers": drivers}
    if nouveau:
        return GuestCheck(
            "driver-bound",
            FAIL,
            f"nouveau drives {', '.join(nouveau)}: CUDA needs the NVIDIA driver",
            "install the NVIDIA driver (it blacklists nouveau), then reboot the guest",
            data,
        )
    if unbound or other:
        return GuestCheck(
            "driver-bound",
            FAIL,
            "no NVIDIA driver bound to " + ", ".join(unbound + other),
            "install the NVIDIA driver (the passthrough_guest role does), then `modprobe nvidia`",
            data,
        )
    return GuestCheck("driver-bound", PASS, f"nvidia bound to {', '.join(drivers)}", data=data)


def driver_loaded(gpus: Sequence[GuestGpu]) -> bool:
    return any(g.driver == "nvidia" for g in gpus)


def check_driver_version(root: GuestRoot, gpus: Sequence[GuestGpu]) -> GuestCheck:
    version = driver_version(root)
    if version:
        text = root.read("proc/driver/nvidia/version") or ""
        kind = "open kernel module" if "Open Kernel Module" in text else "kernel module"
        return GuestCheck(
            "driver-version", PASS, f"NVIDIA {kind} {version}", data={"version": version}
        )
    if not driver_loaded(gpus):
        return GuestCheck("driver-version", SKIP, "the NVIDIA driver is not loaded")
    return GuestCheck(
        "driver-version",
        FAIL,
        "nvidia is bound but /proc/driver/nvidia/version is missing or unreadable",
        "reinstall the NVIDIA driver so its kernel module and user space match",
    )


def check_device_nodes(root: GuestRoot, gpus: Sequence[GuestGpu]) -> GuestCheck:
    if not driver_loaded(gpus):
        return GuestCheck("device-nodes", SKIP, "the NVIDIA driver is not loaded")
    nodes = sorted(n for n in root.listdir("dev") if n.startswith("nvidia"))
    numbered = [n for n in nodes if n[len("nvidia") :].isdigit()]
    bound = sum(g.driver == "nvidia" for g in gpus if g.is_display)
    data = {"nodes": [f"/dev/{n}" for n in nodes]}
    if "nvidiactl" not in nodes or len(numbered) < bound:
        return GuestCheck(
            "device-nodes",
            FAIL,
            f"/dev has {', '.join(nodes) or 'no nvidia nodes'}: expected nvidiactl and "
            f"{bound} nvidiaN",
            "run `nvidia-modprobe` (or nvidia-smi once as root) to create the device nodes",
            data,
        )
    if "nvidia-uvm" not in nodes:
        return GuestCheck(
            "device-nodes",
            WARN,
            f"{', '.join('/dev/' + n for n in nodes)} present, but no /dev/nvidia-uvm "
            "(CUDA needs it)",
            "`modprobe nvidia-uvm` and `nvidia-modprobe -u -c=0`",
            data,
        )
    return GuestCheck("device-nodes", PASS, ", ".join("/dev/" + n for n in nodes), data=data)


# NVRM lines that mean the GPU is in trouble, each with what to do about it.
TROUBLE: tuple[tuple[str, re.Pattern[str], str], ...] = (
    (
        "bar-invalid",
        re.compile(r"NVRM: This PCI I/O region assigned to your NVIDIA device is invalid"),
        BAR_FIX,
    ),
    (
        "fallen-off-the-bus",
        re.compile(r"NVRM: .*fallen off the bus"),
        "the card stopped answering: check its power and the host's reset for it "
        "(`passthrough scan` on the host shows its reset methods); restart the VM",
    ),
    (
        "rminitadapter-failed",
        re.compile(r"NVRM: .*RmInitAdapter failed"),
        "the driver could not start the GPU: look at the NVRM lines before it (BARs, firmware, "
        "a driver too old for this GPU)",
    ),
    (
        "xid",
        re.compile(r"NVRM: Xid \("),
        "look the Xid number up in NVIDIA's Xid catalogue; many need a GPU reset (restart the VM)",
    ),
)


def check_kernel_log(runner: Runner) -> GuestCheck:
    result = runner(["dmesg"])
    if result is None:
        return GuestCheck("kernel-log", SKIP, "no kernel log to read (dmesg not run here)")
    if result.rc != 0:
        return GuestCheck(
            "kernel-log",
            WARN,
            f"dmesg failed: {(result.stderr or result.stdout).strip()[:120] or f'exit {result.rc}'}",
            "run the check as root (or set kernel.dmesg_restrict=0) to read the kernel log",
        )
    found: dict[str, list[str]] = {}
    for line in result.stdout.splitlines():
        for code, pattern, _fix in TROUBLE:
            if pattern.search(line):
                found.setdefault(code, []).append(line.strip())
                break
    nvrm = sum("NVRM:" in line for line in result.stdout.splitlines())
    if not found:
        return GuestCheck(
            "kernel-log", PASS, f"no NVRM trouble in the kernel log ({nvrm} NVRM lines read)"
        )
    first = next(code for code, _p, _f in TROUBLE if code in found)
    fix = next(f for code, _p, f in TROUBLE if code == first)
    summary = "; ".join(f"{code}: {lines[0][:160]}" for code, lines in found.items())
    return GuestCheck("kernel-log", FAIL, summary, fix, {"trouble": found})
