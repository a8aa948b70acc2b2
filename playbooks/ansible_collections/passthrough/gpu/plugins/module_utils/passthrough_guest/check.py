"""``passthrough guest check``: does this guest see its GPU, and is everything above it wired?

Each check has an id, a level (PASS / WARN / FAIL, or SKIP when it does not apply here:
the thing is not installed, or the root is a capture with no live GPU) and a one-line fix.
Standard library only (see the package docstring).
"""

from __future__ import annotations

import json
import os
import re
import socket
import xml.etree.ElementTree as ET
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from .root import GuestRoot
from .runner import Runner
from .virt import VirtualMachine, detect

PASS, WARN, FAIL, SKIP = "PASS", "WARN", "FAIL", "SKIP"
LEVELS = (PASS, WARN, FAIL, SKIP)

VENDOR_NVIDIA = 0x10DE
MEM_64 = 0x00100000  # IORESOURCE_MEM_64: the BAR takes this line and the next
CLASS_DISPLAY = 0x03

# The host-side fix for BARs the guest's firmware could not place (the large-BAR failure).
BAR_FIX = (
    "on the host, give the VM a 64-bit MMIO window as large as the card's BARs: re-render it "
    "with `passthrough render --gpu ADDRESS` (it sizes <pcihole64> and OVMF's "
    "X-PciMmio64Mb from the BARs), define it again and restart it"
)


@dataclass(frozen=True, slots=True)
class GuestCheck:
    id: str
    level: str
    summary: str
    fix: str | None = None
    data: dict[str, Any] = field(default_factory=dict, hash=False, compare=False)

    def to_json(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "level": self.level,
            "summary": self.summary,
            "fix": self.fix,
            "data": self.data,
        }


@dataclass(frozen=True, slots=True)
class GuestBar:
    index: int
    start: int
    size: int
    flags: int

    @property
    def is_io(self) -> bool:
        return bool(self.flags & 0x100)  # IORESOURCE_IO

    @property
    def is_mem(self) -> bool:
        return bool(self.flags & 0x200)  # IORESOURCE_MEM

    @property
    def is_64bit(self) -> bool:
        return bool(self.flags & MEM_64)

    @property
    def unset(self) -> bool:
        return bool(self.flags & 0x20000000)  # IORESOURCE_UNSET: the kernel could not place it


@dataclass(frozen=True, slots=True)
class GuestGpu:
    address: str
    vendor_id: int
    device_id: int
    subsystem: str | None
    class_code: int
    driver: str | None
    bars: tuple[GuestBar, ...]
    resource_readable: bool

    @property
    def id(self) -> str:
        return f"{self.vendor_id:04x}:{self.device_id:04x}"

    @property
    def is_display(self) -> bool:
        return self.class_code >> 16 == CLASS_DISPLAY


@dataclass(frozen=True, slots=True)
class GuestReport:
    root: str
    live: bool
    machine: VirtualMachine
    gpus: tuple[GuestGpu, ...]
    checks: tuple[GuestCheck, ...]

    @property
    def failed(self) -> bool:
        return any(c.level == FAIL for c in self.checks)

    def to_json(self) -> dict[str, Any]:
        return {
            "schema": "passthrough.guest-check/v1",
            "root": self.root,
            "live": self.live,
            "ok": not self.failed,
            "virtual_machine": {
                "guest": self.machine.guest,
                "hypervisor": self.machine.hypervisor,
                "evidence": list(self.machine.evidence),
            },
            "gpus": [
                {
                    "address": g.address,
                    "id": g.id,
                    "subsystem_id": g.subsystem,
                    "class": f"0x{g.class_code:06x}",
                    "driver": g.driver,
                    "bars": [{"index": b.index, "start": b.start, "size": b.size} for b in g.bars],
                }
                for g in self.gpus
            ],
            "checks": [c.to_json() for c in self.checks],
        }


# -- reading -----------------------------------------------------------------------------


def _hex(text: str | None) -> int | None:
    try:
        return int(text, 16) if text else None
    except ValueError:
        return None


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


def read_gpus(root: GuestRoot) -> tuple[GuestGpu, ...]:
    gpus = []
    for addr in root.listdir("sys/bus/pci/devices"):
        base = f"sys/bus/pci/devices/{addr}"
        vendor = _hex(root.read(f"{base}/vendor"))
        if vendor != VENDOR_NVIDIA:
            continue
        sv, sd = (
            _hex(root.read(f"{base}/subsystem_vendor")),
            _hex(root.read(f"{base}/subsystem_device")),
        )
        resource = root.read(f"{base}/resource")
        gpus.append(
            GuestGpu(
                address=addr,
                vendor_id=vendor,
                device_id=_hex(root.read(f"{base}/device")) or 0,
                subsystem=f"{sv:04x}:{sd:04x}" if sv is not None and sd is not None else None,
                class_code=_hex(root.read(f"{base}/class")) or 0,
                driver=root.link_name(f"{base}/driver"),
                bars=parse_resource(resource) if resource else (),
                resource_readable=resource is not None,
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


def _bus_id(text: str) -> str:
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


def _driver_loaded(gpus: Sequence[GuestGpu]) -> bool:
    return any(g.driver == "nvidia" for g in gpus)


def check_driver_version(root: GuestRoot, gpus: Sequence[GuestGpu]) -> GuestCheck:
    version = driver_version(root)
    if version:
        text = root.read("proc/driver/nvidia/version") or ""
        kind = "open kernel module" if "Open Kernel Module" in text else "kernel module"
        return GuestCheck(
            "driver-version", PASS, f"NVIDIA {kind} {version}", data={"version": version}
        )
    if not _driver_loaded(gpus):
        return GuestCheck("driver-version", SKIP, "the NVIDIA driver is not loaded")
    return GuestCheck(
        "driver-version",
        FAIL,
        "nvidia is bound but /proc/driver/nvidia/version is missing or unreadable",
        "reinstall the NVIDIA driver so its kernel module and user space match",
    )


def check_device_nodes(root: GuestRoot, gpus: Sequence[GuestGpu]) -> GuestCheck:
    if not _driver_loaded(gpus):
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


def _text(node: ET.Element | None, path: str) -> str | None:
    if node is None:
        return None
    found = node.find(path)
    return found.text.strip() if found is not None and found.text else None


def nvidia_smi(runner: Runner) -> tuple[ET.Element | None, str | None, bool]:
    """(the parsed ``nvidia-smi -q -x``, why not, whether nvidia-smi is there at all)."""
    result = runner(["nvidia-smi", "-q", "-x"])
    if result is None:
        return None, "nvidia-smi not found", False
    if result.rc != 0:
        why = (result.stderr or result.stdout).strip().splitlines()
        return None, f"nvidia-smi failed (exit {result.rc}): {why[0] if why else ''}", True
    try:
        return ET.fromstring(result.stdout), None, True
    except ET.ParseError as exc:
        return None, f"nvidia-smi -q -x gave no readable XML ({exc})", True


def check_nvidia_smi(
    gpus: Sequence[GuestGpu], smi: tuple[ET.Element | None, str | None, bool]
) -> GuestCheck:
    xml, why, present = smi
    if not present:
        return GuestCheck("nvidia-smi", SKIP, why or "nvidia-smi not found")
    if not _driver_loaded(gpus):  # it can only say it cannot reach the driver: one FAIL is enough
        return GuestCheck("nvidia-smi", SKIP, "the NVIDIA driver is not loaded")
    if xml is None:
        return GuestCheck(
            "nvidia-smi",
            FAIL,
            why or "nvidia-smi failed",
            "nvidia-smi and the kernel module must come from the same driver install; "
            "see the kernel-log check",
        )
    seen: dict[str, dict[str, str | None]] = {}
    for gpu in xml.findall("gpu"):
        bus = _bus_id(gpu.get("id") or _text(gpu, "pci/pci_bus_id") or "")
        seen[bus] = {
            "name": _text(gpu, "product_name"),
            "ecc": _text(gpu, "ecc_mode/current_ecc"),
            "mig": _text(gpu, "mig_mode/current_mig"),
            "persistence": _text(gpu, "persistence_mode"),
            "virtualization": _text(gpu, "gpu_virtualization_mode/virtualization_mode"),
            "memory": _text(gpu, "fb_memory_usage/total"),
        }
    expected = {g.address.lower() for g in gpus if g.is_display and g.driver == "nvidia"}
    data: dict[str, Any] = {"driver_version": _text(xml, "driver_version"), "gpus": seen}
    if set(seen) != expected:
        return GuestCheck(
            "nvidia-smi",
            FAIL,
            f"nvidia-smi sees {sorted(seen) or 'no GPU'}, sysfs has {sorted(expected)} on nvidia",
            "a GPU the driver could not start is missing from nvidia-smi: see the kernel-log check",
            data,
        )
    parts = [
        f"{bus} {v['name']} (ECC {v['ecc']}, MIG {v['mig']}, persistence {v['persistence']})"
        for bus, v in sorted(seen.items())
    ]
    return GuestCheck("nvidia-smi", PASS, "; ".join(parts), data=data)


ComputeProbe = Callable[[], Any]


def _default_probe() -> Any:
    from .compute import run_vector_add

    return run_vector_add()


def check_compute(
    live: bool, enabled: bool, probe: ComputeProbe | None = None, driver: bool = True
) -> GuestCheck:
    if not live:
        return GuestCheck("compute", SKIP, "not run: a captured root has no live GPU")
    if not enabled:
        return GuestCheck("compute", SKIP, "not run (--no-compute)")
    if not driver:
        return GuestCheck("compute", SKIP, "not run: the NVIDIA driver is not bound to a GPU")
    result = (probe or _default_probe)()
    data = result.to_json() if hasattr(result, "to_json") else {}
    if result.status == "pass":
        mem = f", {result.memory_bytes / (1 << 30):.0f} GiB" if result.memory_bytes else ""
        ms = f" in {result.elapsed_ms:.2f} ms" if result.elapsed_ms is not None else ""
        return GuestCheck(
            "compute",
            PASS,
            f"vector add of {result.elements} floats correct on {result.device_name}{mem}{ms}",
            data=data,
        )
    if result.status == "skip":
        return GuestCheck("compute", SKIP, f"not run: {result.reason}", data=data)
    return GuestCheck(
        "compute",
        FAIL,
        f"vector add failed: {result.reason}",
        "see the kernel-log and nvidia-smi checks; a driver older than the GPU cannot load PTX",
        data,
    )


def _containerd_config(root: GuestRoot, runner: Runner) -> tuple[str | None, str]:
    """containerd's effective configuration (``config dump``), else its files under the root."""
    result = runner(["containerd", "config", "dump"])
    if result is not None and result.rc == 0:
        return result.stdout, "containerd config dump"
    texts = [root.read("etc/containerd/config.toml")]
    texts += [
        root.read(f"etc/containerd/conf.d/{n}")
        for n in root.listdir("etc/containerd/conf.d")
        if n.endswith(".toml")
    ]
    present = [t for t in texts if t is not None]
    if present:
        return "\n".join(present), "/etc/containerd"
    return None, ""


def check_runtime(root: GuestRoot, runner: Runner) -> GuestCheck:
    config, source = _containerd_config(root, runner)
    daemon = root.read("etc/docker/daemon.json")
    if config is None and daemon is None:
        return GuestCheck("container-runtime", SKIP, "no containerd or docker configuration")
    found: list[str] = []
    missing: list[str] = []
    if config is not None:
        m = re.search(r"^\s*version\s*=\s*(\d+)", config, re.MULTILINE)
        version = m.group(1) if m else "?"
        if re.search(r"runtimes\.nvidia\]|runtimes\.\"nvidia\"\]", config):
            found.append(f"containerd (config version {version}, from {source})")
        else:
            missing.append("containerd has no nvidia runtime")
    if daemon is not None:
        try:
            runtimes = (json.loads(daemon or "{}") or {}).get("runtimes") or {}
        except (ValueError, AttributeError):
            runtimes = {}
        if "nvidia" in runtimes:
            found.append("docker (/etc/docker/daemon.json)")
        else:
            missing.append("docker's daemon.json has no nvidia runtime")
    if missing and not found:
        tool = "containerd" if config is not None else "docker"
        return GuestCheck(
            "container-runtime",
            FAIL,
            "; ".join(missing),
            f"`nvidia-ctk runtime configure --runtime={tool}` and restart {tool}",
        )
    return GuestCheck("container-runtime", PASS, "nvidia runtime in " + ", ".join(found))


def check_toolkit(runner: Runner) -> GuestCheck:
    result = runner(["nvidia-ctk", "--version"])
    if result is None:
        return GuestCheck("container-toolkit", SKIP, "NVIDIA Container Toolkit not installed")
    m = re.search(r"version\s+(\d+\.\d+\.\d+\S*)", result.stdout)
    if result.rc != 0 or not m:
        return GuestCheck(
            "container-toolkit",
            FAIL,
            f"nvidia-ctk --version failed (exit {result.rc})",
            "reinstall nvidia-container-toolkit",
        )
    return GuestCheck(
        "container-toolkit", PASS, f"nvidia-ctk {m.group(1)}", data={"version": m.group(1)}
    )


CDI_DIRS = ("etc/cdi", "var/run/cdi", "run/cdi")


def _gpu_identities(root: GuestRoot) -> dict[str, tuple[str | None, str | None]]:
    """address → (UUID, device minor) from /proc/driver/nvidia/gpus/*/information."""
    out: dict[str, tuple[str | None, str | None]] = {}
    for addr in root.listdir("proc/driver/nvidia/gpus"):
        info = root.read(f"proc/driver/nvidia/gpus/{addr}/information") or ""
        uuid = re.search(r"GPU UUID:\s*(\S+)", info)
        minor = re.search(r"Device Minor:\s*(\d+)", info)
        out[addr.lower()] = (uuid.group(1) if uuid else None, minor.group(1) if minor else None)
    return out


def check_cdi(root: GuestRoot, toolkit: GuestCheck) -> GuestCheck:
    specs: list[tuple[str, str]] = []
    seen_real: set[str] = set()
    for d in CDI_DIRS:
        for name in root.listdir(d):
            if not name.endswith((".yaml", ".yml", ".json")):
                continue
            text = root.read(f"{d}/{name}") or ""
            real = os.path.realpath(root.abs(f"{d}/{name}"))
            if real in seen_real:
                continue  # /var/run is often a link to /run
            seen_real.add(real)
            if re.search(r"""kind["']?\s*:\s*["']?nvidia\.com/gpu""", text):
                specs.append((f"/{d}/{name}", text))
    if not specs:
        if toolkit.level == SKIP:
            return GuestCheck("cdi-spec", SKIP, "no CDI spec (no NVIDIA Container Toolkit)")
        return GuestCheck(
            "cdi-spec",
            FAIL,
            "no CDI spec for nvidia.com/gpu in /etc/cdi or /var/run/cdi",
            "`nvidia-ctk cdi generate --output=/etc/cdi/nvidia.yaml`",
        )
    text = "\n".join(t for _p, t in specs)
    paths = [p for p, _t in specs]
    regenerate = f"`nvidia-ctk cdi generate --output={paths[0]}` (after every driver change)"
    driver = driver_version(root)
    versions = sorted(set(re.findall(r"\.so\.(\d+\.\d+(?:\.\d+)?)\b", text)))
    if driver and versions and driver not in versions:
        return GuestCheck(
            "cdi-spec",
            FAIL,
            f"{', '.join(paths)} was generated for driver {', '.join(versions)}; "
            f"the driver is {driver}",
            regenerate,
        )
    missing = [
        addr
        for addr, (uuid, minor) in _gpu_identities(root).items()
        if not ((uuid and uuid in text) or (minor and f"/dev/nvidia{minor}" in text))
    ]
    if missing:
        return GuestCheck(
            "cdi-spec",
            FAIL,
            f"{', '.join(paths)} does not name the GPU at {', '.join(missing)}",
            regenerate,
        )
    return GuestCheck("cdi-spec", PASS, f"{', '.join(paths)} names every GPU the driver sees")


def _node_name(root: GuestRoot) -> str | None:
    if root.is_live:
        return socket.gethostname()
    return root.read("etc/hostname")


def check_kubernetes(
    root: GuestRoot,
    runner: Runner,
    gpus: Sequence[GuestGpu],
    node: str | None = None,
    labels: Mapping[str, str] | None = None,
) -> GuestCheck:
    """The node's allocatable nvidia.com/gpu, and ``labels`` (those the role set) on it."""
    node = node or _node_name(root)
    if not node:
        return GuestCheck("kubernetes", SKIP, "not checked: no node name (/etc/hostname)")
    result = runner(["kubectl", "get", "node", node, "-o", "json"])
    if result is None:
        return GuestCheck("kubernetes", SKIP, "no kubectl here")
    if result.rc != 0:
        why = (result.stderr or result.stdout).strip().splitlines()
        return GuestCheck(
            "kubernetes",
            SKIP,
            f"kubectl cannot read node {node}: {why[-1][:120] if why else result.rc}",
        )
    try:
        obj = json.loads(result.stdout)
    except ValueError:
        return GuestCheck("kubernetes", WARN, f"kubectl gave no JSON for node {node}")
    allocatable = (obj.get("status") or {}).get("allocatable") or {}
    on_node = (obj.get("metadata") or {}).get("labels") or {}
    nvidia_labels = {k: v for k, v in on_node.items() if k.startswith("nvidia.com/")}
    raw = str(allocatable.get("nvidia.com/gpu", "0") or "0")
    count = int(raw) if raw.isdigit() else 0
    want = sum(g.is_display for g in gpus) or 1
    data = {"allocatable": count, "labels": nvidia_labels}
    missing = {k: v for k, v in (labels or {}).items() if on_node.get(k) != str(v)}
    if missing:
        return GuestCheck(
            "kubernetes",
            FAIL,
            f"node {node} lacks the labels "
            + ", ".join(f"{k}={v}" for k, v in sorted(missing.items())),
            f"kubectl label node {node} --overwrite "
            + " ".join(f"{k}={v}" for k, v in sorted(missing.items())),
            data,
        )
    if count < want:
        return GuestCheck(
            "kubernetes",
            FAIL,
            f"node {node} offers nvidia.com/gpu: {count}, this guest has {want} GPU(s)",
            "check the NVIDIA device plugin pod on this node (kubectl -n kube-system logs)",
            data,
        )
    shown = ", ".join(f"{k}={v}" for k, v in sorted(nvidia_labels.items())) or "no nvidia labels"
    return GuestCheck(
        "kubernetes", PASS, f"node {node} offers nvidia.com/gpu: {count} ({shown})", data=data
    )


# Checks that must pass before anything is installed (the guest role's first step).
HARDWARE_CHECKS = ("gpu-functions", "gpu-bars")


def run_guest_checks(
    root: GuestRoot,
    runner: Runner,
    *,
    compute: bool = True,
    probe: ComputeProbe | None = None,
    node: str | None = None,
    labels: Mapping[str, str] | None = None,
) -> GuestReport:
    """Every check; ``node``/``labels``: the Kubernetes node name and the labels expected."""
    machine = detect(root.read, root.listdir)
    gpus = read_gpus(root)
    toolkit = check_toolkit(runner)
    checks = (
        check_functions(gpus),
        check_bars(gpus),
        check_driver(gpus),
        check_driver_version(root, gpus),
        check_device_nodes(root, gpus),
        check_kernel_log(runner),
        check_nvidia_smi(gpus, nvidia_smi(runner)),
        check_compute(root.is_live, compute, probe, _driver_loaded(gpus)),
        check_runtime(root, runner),
        toolkit,
        check_cdi(root, toolkit),
        check_kubernetes(root, runner, gpus, node, labels),
    )
    return GuestReport(root.path, root.is_live, machine, gpus, checks)


def render(report: GuestReport, paint: Callable[[str, str], str] = lambda t, _s: t) -> str:
    """Text for people; ``paint(text, level)`` colours the level column."""
    m = report.machine
    lines = [
        (
            f"virtual machine ({m.hypervisor or 'hypervisor not named'}): {'; '.join(m.evidence)}"
            if m.guest
            else "no sign of a virtual machine: this looks like bare metal"
        ),
        "",
    ]
    width = max(len(c.id) for c in report.checks)
    for c in report.checks:
        lines.append(f"{paint(f'{c.level:4}', c.level)}  {c.id:<{width}}  {c.summary}")
        if c.fix and c.level in (FAIL, WARN):
            lines.append(f"      {'':<{width}}  fix: {c.fix}")
    counts = {lvl: sum(c.level == lvl for c in report.checks) for lvl in LEVELS}
    lines += [
        "",
        f"{counts[PASS]} passed, {counts[WARN]} warnings, {counts[FAIL]} failed, "
        f"{counts[SKIP]} not applicable or not run",
    ]
    return "\n".join(lines)
