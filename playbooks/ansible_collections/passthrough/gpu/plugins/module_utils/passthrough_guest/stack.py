# SPDX-License-Identifier: Apache-2.0
"""What sits above the GPU in the guest: nvidia-smi, a CUDA probe, the container runtime, the
NVIDIA container toolkit, CDI specs and the Kubernetes node. Standard library only."""

from __future__ import annotations

import json
import re
import socket
import xml.etree.ElementTree as ET
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from .hardware import bus_id, driver_loaded, driver_version
from .report import FAIL, PASS, SKIP, WARN, GuestCheck, GuestGpu
from .root import GuestRoot
from .runner import Runner


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
    if not driver_loaded(gpus):  # it can only say it cannot reach the driver: one FAIL is enough
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
        bus = bus_id(gpu.get("id") or _text(gpu, "pci/pci_bus_id") or "")
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


def check_vgpu(smi: tuple[ET.Element | None, str | None, bool]) -> GuestCheck:
    """A vGPU (``Virtualization Mode: VGPU`` in ``nvidia-smi -q``): its type and licence.
    NVIDIA's guest driver names the type as the product (``NVIDIA A2-4Q``) and reports the
    licence under ``vGPU Software Licensed Product``; an unlicensed vGPU is restricted."""
    xml = smi[0]
    vgpus = [
        g
        for g in (xml.findall("gpu") if xml is not None else [])
        if (_text(g, "gpu_virtualization_mode/virtualization_mode") or "").upper() == "VGPU"
    ]
    if not vgpus:
        return GuestCheck("vgpu", SKIP, "no vGPU: nvidia-smi reports no GPU in VGPU mode")
    seen = {
        bus_id(g.get("id") or _text(g, "pci/pci_bus_id") or ""): {
            "type": _text(g, "product_name"),
            "product": _text(g, "vgpu_software_licensed_product/licensed_product_name"),
            "license": _text(g, "vgpu_software_licensed_product/license_status"),
        }
        for g in vgpus
    }
    parts = [
        f"{bus} {v['type']} ({v['product'] or 'no licensed product named'}: "
        f"{v['license'] or 'licence status not reported'})"
        for bus, v in sorted(seen.items())
    ]
    unlicensed = [b for b, v in seen.items() if not (v["license"] or "").startswith("Licensed")]
    if unlicensed:
        return GuestCheck(
            "vgpu",
            WARN,
            "vGPU not licensed: " + "; ".join(parts),
            "give the guest a client configuration token from the NVIDIA License System "
            "(/etc/nvidia/ClientConfigToken/) and restart nvidia-gridd; an unlicensed vGPU "
            "runs restricted",
            {"vgpus": seen},
        )
    return GuestCheck("vgpu", PASS, "; ".join(parts), data={"vgpus": seen})


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
            real = root.real(f"{d}/{name}")  # resolved inside the root
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
