# SPDX-License-Identifier: Apache-2.0
"""Inside the guest, on REAL data: a cloud VM with an NVIDIA H100 80GB passed through,
captured on 2026-11-22 (tests/fixtures/h100-guest, its README says what it holds). Its tools' outputs (nvidia-smi -q -x,
dmesg) are a RECORDING of the real machine, replayed through RecordedRunner.

Variants are derived from the capture in tmp_path (a truncated BAR, no driver, a stale CDI
spec); every derivation is spelled out where it is made.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jsonschema
import pytest

from passthrough.cli import main
from passthrough.guest.check import run_guest_checks
from passthrough.guest.compute import ComputeResult, run_vector_add
from passthrough.guest.report import FAIL, PASS, SKIP, GuestReport
from passthrough.guest.root import GuestRoot
from passthrough.guest.runner import RecordedRunner
from passthrough.guest.stack import check_compute

from .cli_process import run_cli

REPO = Path(__file__).parents[1]
FIXTURE = REPO / "tests/fixtures/h100-guest"  # copied unchanged from the capture (README there)
RECORDED = FIXTURE / "commands"
GPU = "0000:00:06.0"
GPU_SYSFS = f"sys/devices/pci0000:00/{GPU}"
HOST_ONLY = {
    "cpu-virtualization",
    "kvm-device",
    "iommu-firmware",
    "iommu-enabled",
    "kernel-iommu-args",
    "interrupt-remapping",
    "vfio-modules",
    "bootloader",
    "gpu-viable",
}
SCHEMA = json.loads((REPO / "passthrough/schemas/scan-v1.schema.json").read_text())


@pytest.fixture(scope="session")
def capture(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """root.tar.gz unpacked for real (it holds one top-level directory, root/)."""
    dest = tmp_path_factory.mktemp("h100")
    with tarfile.open(FIXTURE / "root.tar.gz") as tar:
        tar.extractall(dest, filter="tar")
    return dest / "root"


@pytest.fixture
def variant(capture: Path, tmp_path: Path) -> tuple[Path, Path]:
    """A copy of the capture (links kept as links) and of its recorded commands, to change."""
    root = tmp_path / "root"
    shutil.copytree(capture, root, symlinks=True)
    commands = tmp_path / "commands"
    shutil.copytree(RECORDED, commands)
    for p in [commands, *commands.iterdir()]:
        p.chmod(0o755 if p.is_dir() else 0o644)  # the shared fixture is read-only
    return root, commands


def _report(root: Path, commands: Path = RECORDED) -> GuestReport:
    return run_guest_checks(GuestRoot(str(root)), RecordedRunner(str(commands)))


def _levels(report: GuestReport) -> dict[str, str]:
    return {c.id: c.level for c in report.checks}


def _cli(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    rc = main(argv)
    return rc, capsys.readouterr().out


# -- host discovery inside the guest --------------------------------------------------------


@pytest.mark.parametrize("archive", ["snapshot.tar.gz", "root.tar.gz/root"])
def test_check_in_the_h100_guest_says_guest_and_gives_no_host_advice(
    archive: str, capture: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root = str(FIXTURE / archive) if archive.endswith(".gz") else str(capture)
    rc, out = _cli(["check", "--root", root, "--json"], capsys)
    data = json.loads(out)
    assert rc == 0 and data["ok"]
    assert data["virtual_machine"]["guest"]
    assert "CPUID hypervisor flag (/proc/cpuinfo)" in data["virtual_machine"]["evidence"]
    levels = {c["id"]: c["level"] for c in data["checks"]}
    assert {i for i in HOST_ONLY if levels.get(i) != "SKIP"} == set()
    assert "FAIL" not in levels.values()
    rc, text = _cli(["check", "--root", root], capsys)
    assert rc == 0 and text.startswith("Guest")
    for advice in ("firmware setup", "kernel modules package", "intel_iommu=on"):
        assert advice not in text


def test_scan_of_the_guest_validates_and_a_3d_controller_is_no_display(
    capsys: pytest.CaptureFixture[str],
) -> None:
    rc, out = _cli(["scan", "--root", str(FIXTURE / "snapshot.tar.gz"), "--json"], capsys)
    data = json.loads(out)
    assert rc == 0
    jsonschema.validate(data, SCHEMA)
    machine = data["host"]["virtual_machine"]
    # all three kinds of evidence, the PCI ones from the IDs discovery read (the snapshot
    # records uevent files, not the separate vendor/device attributes)
    assert machine == {
        "guest": True,
        "hypervisor": None,
        "evidence": [
            "CPUID hypervisor flag (/proc/cpuinfo)",
            "emulated host bridge 8086:0d57 at 0000:00:00.0",
            "5 virtio PCI functions (1af4:*)",
        ],
    }
    (gpu,) = data["gpus"]
    assert gpu["class"] == "0x030200"
    assert gpu["warnings"] == []  # no advice on passing on a card that cannot be passed on
    assert gpu["reasons"][0].startswith("inside a virtual machine with no IOMMU")


def test_a_bare_metal_host_is_not_a_guest(hosts: dict[str, Path]) -> None:
    from passthrough.host.discover import discover

    assert len(hosts) >= 10
    for name, root in hosts.items():
        assert not discover(str(root)).machine.guest, name


# -- passthrough guest check on the capture ------------------------------------------------


def test_guest_check_on_the_h100_capture(capture: Path) -> None:
    runner = RecordedRunner(str(RECORDED))
    report = run_guest_checks(GuestRoot(str(capture)), runner)
    assert _levels(report) == {
        "gpu-functions": PASS,
        "gpu-bars": PASS,
        "driver-bound": PASS,
        "driver-version": PASS,
        "device-nodes": PASS,
        "kernel-log": PASS,
        "nvidia-smi": PASS,
        "vgpu": SKIP,  # a whole GPU passed through, no vGPU
        "compute": SKIP,  # a capture has no live GPU: not run, never a pass
        "container-runtime": SKIP,  # none installed on that guest
        "container-toolkit": SKIP,
        "cdi-spec": SKIP,
        "kubernetes": SKIP,
        "secure-boot-cas": SKIP,  # the capture holds no /sys/firmware/efi
    }
    assert not report.failed and report.machine.guest
    assert "5 virtio PCI functions (1af4:*)" in report.machine.evidence
    by_id = {c.id: c for c in report.checks}
    assert by_id["gpu-functions"].data == {"addresses": [GPU]}
    assert "10de:2330 (subsystem 10de:16c1)" in by_id["gpu-functions"].summary
    assert by_id["gpu-bars"].data == {GPU: {"0": 16 << 20, "2": 128 << 30, "4": 32 << 20}}
    assert by_id["driver-version"].data == {"version": "580.159.04"}
    smi = by_id["nvidia-smi"].data["gpus"][GPU]
    assert (smi["ecc"], smi["mig"], smi["persistence"]) == ("Enabled", "Disabled", "Enabled")
    assert smi["virtualization"] == "Pass-Through"
    assert "captured root" in by_id["compute"].summary
    assert ("dmesg",) in runner.calls and ("nvidia-smi", "-q", "-x") in runner.calls


def test_guest_check_cli_on_the_archive(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["guest", "check", "--root", str(FIXTURE / "root.tar.gz"), "--commands", str(RECORDED)]
    rc, out = _cli([*argv, "--json"], capsys)
    data = json.loads(out)
    assert rc == 0 and data["ok"] and data["virtual_machine"]["guest"]
    assert data["gpus"][0]["address"] == GPU and data["gpus"][0]["driver"] == "nvidia"
    rc, text = _cli(argv, capsys)
    assert rc == 0 and text.startswith("virtual machine")
    assert "SKIP  compute            not run: a captured root has no live GPU" in text
    # without recordings a capture runs no tools: the kernel log and nvidia-smi are not read
    rc, out = _cli(["guest", "check", "--root", str(FIXTURE / "root.tar.gz"), "--json"], capsys)
    levels = {c["id"]: c["level"] for c in json.loads(out)["checks"]}
    assert rc == 0 and levels["kernel-log"] == SKIP and levels["nvidia-smi"] == SKIP


def test_snapshot_of_a_guest_carries_what_the_guest_check_reads(
    capture: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`passthrough snapshot` inside a VM records the guest check's files too (subsystem IDs,
    driver link, BARs, /proc/driver/nvidia, /dev/nvidia*): `guest check --root` on the
    snapshot judges exactly as on the full copy of that guest's root."""
    out = tmp_path / "guest-snapshot.tar.gz"
    assert main(["snapshot", "--root", str(capture), "-o", str(out)]) == 0
    capsys.readouterr()
    argv = ["guest", "check", "--root", str(out), "--commands", str(RECORDED), "--json"]
    rc, text = _cli(argv, capsys)
    from_snapshot = json.loads(text)
    full = _report(capture).to_json()
    assert rc == 0
    assert from_snapshot["checks"] == full["checks"] and from_snapshot["gpus"] == full["gpus"]
    levels = {c["id"]: c["level"] for c in from_snapshot["checks"]}
    assert levels["gpu-bars"] == levels["driver-bound"] == levels["device-nodes"] == PASS
    # and it still is the small capture, not the root: no file the checks did not read
    with tarfile.open(out) as tar:
        names = tar.getnames()
    assert len(names) < 400 and not any(n.startswith(("usr/lib", "boot/")) for n in names)


def test_guest_check_on_a_host_discovery_snapshot(capsys: pytest.CaptureFixture[str]) -> None:
    """The capture's snapshot.tar.gz was taken when `snapshot` kept only host discovery's
    files (uevent, resource, driver link; no vendor files, no /proc/driver, no /dev): the GPU,
    its BARs and driver are read from those, and what was never recorded is SKIP, not FAIL."""
    argv = ["guest", "check", "--root", str(FIXTURE / "snapshot.tar.gz"), "--json"]
    rc, out = _cli(argv, capsys)
    data = json.loads(out)
    levels = {c["id"]: c["level"] for c in data["checks"]}
    assert rc == 0 and data["ok"]
    assert levels["gpu-functions"] == levels["gpu-bars"] == levels["driver-bound"] == PASS
    assert levels["driver-version"] == levels["device-nodes"] == SKIP
    (gpu,) = data["gpus"]
    assert (gpu["address"], gpu["driver"], gpu["subsystem_id"]) == (GPU, "nvidia", "10de:16c1")


def test_guest_check_input_errors_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["guest", "check", "--root", str(tmp_path / "nope")]) == 2
    assert main(["guest", "check", "--root", "/", "--commands", str(tmp_path / "nope")]) == 2
    bad = tmp_path / "bad.tar.gz"
    bad.write_bytes(b"not a tar")
    assert main(["guest", "check", "--root", str(bad)]) == 2
    plain = tmp_path / "notes.txt"
    plain.write_text("a file\n")
    assert main(["guest", "check", "--root", str(plain)]) == 2
    assert main(["guest", "check", "--root", str(tmp_path)]) == 2  # no sys, no proc
    err = capsys.readouterr().err
    assert err.count("passthrough: error:") == 5


# -- derived from the capture ---------------------------------------------------------------

EMPTY = "0x0000000000000000 0x0000000000000000 0x0000000000000000"


def _bar1_line(root: Path, line: str) -> None:
    """Replace the capture's resource line 2 (the H100's BAR1, the 128 GiB aperture)."""
    resource = root / GPU_SYSFS / "resource"
    lines = resource.read_text().splitlines()
    lines[2] = line
    resource.write_text("\n".join(lines) + "\n")


BAR_INVALID = (
    "[    0.412345] NVRM: This PCI I/O region assigned to your NVIDIA device is invalid:\n"
    "[    0.412346] NVRM: BAR1 is 0M @ 0x0 (PCI:0000:00:06.0)\n"
)


def test_a_truncated_bar_fails_with_the_host_side_fix(variant: tuple[Path, Path]) -> None:
    root, commands = variant
    # The large-BAR failure: the guest firmware could not place BAR1 (resource line 2), and
    # the driver said so in the kernel log.
    _bar1_line(root, EMPTY)
    (commands / "dmesg.txt").write_text((commands / "dmesg.txt").read_text() + BAR_INVALID)
    report = _report(root, commands)
    by_id = {c.id: c for c in report.checks}
    assert by_id["gpu-bars"].level == FAIL
    assert by_id["gpu-bars"].summary == (
        f"{GPU} resource2 empty before resource4: a BAR was not placed"
    )
    assert "passthrough render" in (by_id["gpu-bars"].fix or "")
    assert by_id["kernel-log"].level == FAIL
    assert set(by_id["kernel-log"].data["trouble"]) == {"bar-invalid"}
    assert "passthrough render" in (by_id["kernel-log"].fix or "")
    assert report.failed


def test_a_bar_with_flags_but_no_address_is_unplaced(variant: tuple[Path, Path]) -> None:
    root, commands = variant
    # how the kernel shows a BAR it could not fit: its size and flags kept, IORESOURCE_UNSET
    # set, start 0
    _bar1_line(root, "0x0000000000000000 0x0000001fffffffff 0x000000002014220c")
    check = {c.id: c for c in _report(root, commands).checks}["gpu-bars"]
    assert check.level == FAIL and check.summary == f"{GPU} resource2 unplaced"


@pytest.mark.parametrize(
    ("damage", "lines"),
    [
        (lambda text: "garbage, not the kernel's\n", "0, 1, 2, 3, 4, 5"),
        (lambda text: text[:20], "0, 1, 2, 3, 4, 5"),  # cut inside its first line
        (lambda text: "", "0, 1, 2, 3, 4, 5"),
        (lambda text: text.replace("0x", "", 3), "0"),  # one line not hex as the kernel writes
        (lambda text: "\n".join(text.splitlines()[:3]) + "\n", "3, 4, 5"),  # cut after BAR1
    ],
)
def test_a_resource_file_that_is_not_the_kernels_is_no_pass(
    variant: tuple[Path, Path], damage: Any, lines: str
) -> None:
    """A damaged copy of the capture's resource file: its BARs cannot be told, so the check
    fails naming the lines (it passed with an empty list of BARs)."""
    root, commands = variant
    resource = root / GPU_SYSFS / "resource"
    resource.write_text(damage(resource.read_text()))
    check = {c.id: c for c in _report(root, commands).checks}["gpu-bars"]
    assert check.level == FAIL
    assert check.summary.startswith(f"{GPU}: resource lines {lines} are not the kernel's")


def test_a_consumer_card_layout_passes(variant: tuple[Path, Path]) -> None:
    root, commands = variant
    # A GeForce's BARs as sysfs shows them (a real layout, addresses from a workstation):
    # BAR0 32-bit registers, BAR1 and BAR3 64-bit (each with an empty upper half), BAR5 I/O.
    (root / GPU_SYSFS / "resource").write_text(
        "0x00000000fb000000 0x00000000fbffffff 0x0000000000040200\n"
        "0x000000e000000000 0x000000e00fffffff 0x000000000014220c\n"
        "0x0000000000000000 0x0000000000000000 0x0000000000000000\n"
        "0x000000e010000000 0x000000e011ffffff 0x000000000014220c\n"
        "0x0000000000000000 0x0000000000000000 0x0000000000000000\n"
        "0x000000000000e000 0x000000000000e07f 0x0000000000040101\n"
    )
    check = {c.id: c for c in _report(root, commands).checks}["gpu-bars"]
    assert check.level == PASS, check.summary


@pytest.mark.parametrize(
    ("line", "code"),
    [
        (
            "NVRM: Xid (PCI:0000:00:06.0): 79, pid=1234, GPU has fallen off the bus.",
            "fallen-off-the-bus",
        ),
        ("NVRM: Xid (PCI:0000:00:06.0): 48, pid=1, An uncorrectable double bit error", "xid"),
        ("NVRM: GPU 0000:00:06.0: RmInitAdapter failed! (0x22:0x56:742)", "rminitadapter-failed"),
    ],
)
def test_nvrm_trouble_in_the_kernel_log(variant: tuple[Path, Path], line: str, code: str) -> None:
    root, commands = variant
    (commands / "dmesg.txt").write_text(
        (commands / "dmesg.txt").read_text() + f"[  812.000001] {line}\n"
    )
    check = {c.id: c for c in _report(root, commands).checks}["kernel-log"]
    assert check.level == FAIL and set(check.data["trouble"]) == {code}


def test_no_driver_fails_once_and_skips_what_depends_on_it(variant: tuple[Path, Path]) -> None:
    root, commands = variant
    # No driver installed yet: no driver link, no /proc/driver/nvidia, no nodes, no nvidia-smi.
    (root / GPU_SYSFS / "driver").unlink()
    shutil.rmtree(root / "proc/driver/nvidia")
    for node in (root / "dev").glob("nvidia*"):
        shutil.rmtree(node) if node.is_dir() else node.unlink()
    # nvidia-smi stays installed: without the driver it can only fail (its real message)
    (commands / "nvidia-smi-q.xml").write_text(
        "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver. "
        "Make sure that the latest NVIDIA driver is installed and running.\n"
    )
    (commands / "nvidia-smi-q.xml.rc").write_text("9\n")
    levels = _levels(_report(root, commands))
    assert levels["gpu-functions"] == PASS and levels["gpu-bars"] == PASS
    assert levels["driver-bound"] == FAIL
    assert levels["driver-version"] == SKIP and levels["device-nodes"] == SKIP
    assert levels["nvidia-smi"] == SKIP
    assert [i for i, lvl in levels.items() if lvl == FAIL] == ["driver-bound"]


def test_nouveau_is_named(variant: tuple[Path, Path]) -> None:
    root, commands = variant
    link = root / GPU_SYSFS / "driver"
    link.unlink()
    link.symlink_to("../../../bus/pci/drivers/nouveau")
    check = {c.id: c for c in _report(root, commands).checks}["driver-bound"]
    assert check.level == FAIL and "nouveau" in check.summary


def _runtime(root: Path, commands: Path, driver: str) -> None:
    """A containerd with the nvidia runtime, a toolkit, and a CDI spec made for ``driver``
    (nvidia-ctk names the driver's libraries with their version, as in these lines)."""
    (commands / "containerd-config-dump.toml").write_text(
        'version = 3\n[plugins."io.containerd.cri.v1.runtime".containerd.runtimes.nvidia]\n'
        '  runtime_type = "io.containerd.runc.v2"\n'
    )
    (commands / "nvidia-ctk-version.txt").write_text(
        "NVIDIA Container Toolkit CLI version 1.20.0\ncommit: 0000000\n"
    )
    (root / "etc/cdi").mkdir(parents=True)
    (root / "etc/cdi/nvidia.yaml").write_text(
        "cdiVersion: 0.5.0\nkind: nvidia.com/gpu\ndevices:\n"
        "- name: GPU-3133db59-d892-aa7a-b374-e12a8b938a0c\n  containerEdits:\n"
        "    deviceNodes:\n    - path: /dev/nvidia0\n"
        "containerEdits:\n  mounts:\n"
        f"  - hostPath: /usr/lib/x86_64-linux-gnu/libcuda.so.{driver}\n"
        f"    containerPath: /usr/lib/x86_64-linux-gnu/libcuda.so.{driver}\n"
    )


def test_runtime_toolkit_and_a_current_cdi_spec_pass(variant: tuple[Path, Path]) -> None:
    root, commands = variant
    _runtime(root, commands, "580.159.04")
    by_id = {c.id: c for c in _report(root, commands).checks}
    assert by_id["container-runtime"].level == PASS
    assert "config version 3" in by_id["container-runtime"].summary
    assert by_id["container-toolkit"].data == {"version": "1.20.0"}
    assert by_id["cdi-spec"].level == PASS


def test_a_cdi_spec_older_than_the_driver_fails(variant: tuple[Path, Path]) -> None:
    root, commands = variant
    _runtime(root, commands, "570.86.15")
    check = {c.id: c for c in _report(root, commands).checks}["cdi-spec"]
    assert check.level == FAIL
    assert "570.86.15" in check.summary and "580.159.04" in check.summary
    assert "nvidia-ctk cdi generate" in (check.fix or "")


def test_a_toolkit_without_a_cdi_spec_or_runtime_fails(variant: tuple[Path, Path]) -> None:
    root, commands = variant
    _runtime(root, commands, "580.159.04")
    (root / "etc/cdi/nvidia.yaml").unlink()
    (commands / "containerd-config-dump.toml").write_text("version = 2\n")
    levels = _levels(_report(root, commands))
    assert levels["cdi-spec"] == FAIL and levels["container-runtime"] == FAIL


@pytest.mark.parametrize(("allocatable", "level"), [("1", PASS), ("0", FAIL)])
def test_kubernetes_node(variant: tuple[Path, Path], allocatable: str, level: str) -> None:
    root, commands = variant
    (root / "etc/hostname").write_text("gpu-guest-1\n")
    node = {
        "metadata": {"name": "gpu-guest-1", "labels": {"nvidia.com/gpu.present": "true"}},
        "status": {"allocatable": {"cpu": "16", "nvidia.com/gpu": allocatable}},
    }
    (commands / "kubectl-get-node.json").write_text(json.dumps(node))
    runner = RecordedRunner(str(commands))
    report = run_guest_checks(GuestRoot(str(root)), runner)
    check = {c.id: c for c in report.checks}["kubernetes"]
    assert check.level == level
    assert ("kubectl", "get", "node", "gpu-guest-1", "-o", "json") in runner.calls
    # the labels the role set must be there too
    want = {"nvidia.com/gpu.present": "true", "nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"}
    report = run_guest_checks(GuestRoot(str(root)), runner, node="gpu-guest-1", labels=want)
    check = {c.id: c for c in report.checks}["kubernetes"]
    assert check.level == FAIL and "nvidia.com/gpu.product=NVIDIA-H100-80GB-HBM3" in check.summary


def test_docker_daemon_json_with_the_nvidia_runtime(variant: tuple[Path, Path]) -> None:
    root, commands = variant
    (root / "etc/docker").mkdir(parents=True)
    daemon = root / "etc/docker/daemon.json"
    daemon.write_text(
        json.dumps({"runtimes": {"nvidia": {"args": [], "path": "nvidia-container-runtime"}}})
    )
    assert _levels(_report(root, commands))["container-runtime"] == PASS
    daemon.write_text(json.dumps({"log-driver": "json-file"}))
    assert _levels(_report(root, commands))["container-runtime"] == FAIL


# -- the compute probe without a GPU --------------------------------------------------------


def test_a_passing_probe_is_reported_with_device_memory_and_time() -> None:
    # STAND-IN for a live GPU (none here): the probe's own result type, filled in with what
    # the probe reported on the real H100 guest (README of the capture).
    stand_in = ComputeResult(
        "pass",
        "vector add of 1048576 floats correct on the GPU",
        device_name="NVIDIA H100 80GB HBM3",
        memory_bytes=81559 << 20,
        elements=1 << 20,
        elapsed_ms=0.5,
        driver_version=13000,
    )
    check = check_compute(True, True, lambda: stand_in)
    assert check.level == PASS
    assert check.summary == (
        "vector add of 1048576 floats correct on NVIDIA H100 80GB HBM3, 80 GiB in 0.50 ms"
    )
    assert check.data["driver_version"] == 13000


def test_compute_without_libcuda_is_a_skip_with_the_reason() -> None:
    result = run_vector_add("/nonexistent/libcuda.so.1")
    assert result.status == "skip" and "libcuda.so.1" in result.reason
    check = check_compute(True, True, lambda: run_vector_add("/nonexistent/libcuda.so.1"))
    assert check.level == SKIP and "libcuda.so.1" in check.summary
    assert check_compute(True, False).summary == "not run (--no-compute)"
    no_driver = check_compute(True, True, lambda: pytest.fail("probe run"), driver=False)
    assert no_driver.level == SKIP and "driver is not bound" in no_driver.summary


# -- runs where the package is not installed ----------------------------------------------

BLOCKED = ("libvirt", "pyudev", "lxml", "jinja2", "ansible_runner", "ansible", "yaml")

SITECUSTOMIZE = """
import atexit, importlib.abc, os, sys
BLOCKED = {blocked!r}
tried = []
class Block(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in BLOCKED:
            tried.append(name)
            raise ImportError(f"blocked for this test: {{name}}")
        return None
sys.meta_path.insert(0, Block())
atexit.register(lambda: open(os.environ["BLOCK_LOG"], "w").write("\\n".join(tried)))
"""


def _isolated(tmp_path: Path) -> Callable[[list[str]], subprocess.CompletedProcess[str]]:
    """The system python3 (no project dependencies installed), the checkout on its path only
    through the working directory (``python3 -m`` from a checkout), and every third-party
    module the toolkit uses elsewhere blocked; each attempt to import one is logged."""
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(SITECUSTOMIZE.format(blocked=BLOCKED))
    log = tmp_path / "blocked.log"
    python = shutil.which("python3", path="/usr/bin:/bin") or sys.executable

    def run(argv: list[str]) -> subprocess.CompletedProcess[str]:
        env = {"PATH": os.environ.get("PATH", ""), "PYTHONPATH": str(site), "BLOCK_LOG": str(log)}
        done = subprocess.run(
            [python, "-s", "-m", "passthrough", *argv],
            cwd=REPO,
            env=env,
            capture_output=True,
            text=True,
            timeout=300,
            check=False,
        )
        assert log.read_text() == "", f"tried to import {log.read_text()!r}"
        return done

    return run


def test_guest_check_runs_without_the_package_or_its_dependencies(tmp_path: Path) -> None:
    run = _isolated(tmp_path)
    argv = ["guest", "check", "--root", str(FIXTURE / "root.tar.gz"), "--commands", str(RECORDED)]
    done = run([*argv, "--json"])
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["ok"] is True
    # the live root, as the lead runs it on a GPU guest: on this machine (no NVIDIA GPU) it
    # runs every tool it finds and fails on gpu-functions
    done = run(["guest", "check", "--json", "--no-compute"])
    data = json.loads(done.stdout)
    assert data["live"] is True
    levels = {c["id"]: c["level"] for c in data["checks"]}
    vendors = {p.read_text().strip() for p in Path("/sys/bus/pci/devices").glob("*/vendor")}
    if "0x10de" not in vendors:
        assert done.returncode == 1 and levels["gpu-functions"] == FAIL
    assert levels["compute"] == SKIP


# -- the guest role: its first and last tasks through real ansible-playbook ----------------


def _guest_inventory(tmp_path: Path) -> Path:
    """localhost through the local connection, with a target python that cannot import the
    passthrough package (the system python3, isolated: no PYTHONPATH, no cwd, no user site),
    as in a guest where the package was never installed."""
    python = tmp_path / "guest-python3"
    python.write_text('#!/bin/sh\nexec /usr/bin/python3 -I "$@"\n')
    python.chmod(0o755)
    probe = subprocess.run(
        [str(python), "-c", "import passthrough"],
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        capture_output=True,
        check=False,
    )
    assert probe.returncode != 0, "the target python must not see the passthrough package"
    inv = tmp_path / "inventory.yml"
    inv.write_text(
        "all:\n  children:\n    gpu_guests:\n      hosts:\n        h100-guest:\n"
        "          ansible_connection: local\n"
        f"          ansible_python_interpreter: {python}\n"
    )
    return inv


def test_guest_role_checks_the_h100_capture_first_and_last(capture: Path, tmp_path: Path) -> None:
    from passthrough.provision.runner import run, summary_table

    tasks: list[str] = []
    result = run(
        str(_guest_inventory(tmp_path)),
        "guest.yml",
        tags="guest_check",
        extravars={
            "passthrough_guest_check_root": str(capture),
            "passthrough_guest_check_commands": str(RECORDED),
        },
        progress=tasks.append,
    )
    assert result.ok, summary_table(result)
    role_tasks = [t.strip() for t in tasks if t.strip().startswith("TASK The guest")]
    assert role_tasks == [
        "TASK The guest sees its GPU",
        "TASK The guest's GPU stack end to end",
    ]
    assert result.hosts["h100-guest"].changed == 0


def test_guest_role_stops_first_when_a_bar_did_not_fit(
    variant: tuple[Path, Path], tmp_path: Path
) -> None:
    from passthrough.provision.runner import run

    root, commands = variant
    _bar1_line(root, EMPTY)
    tasks: list[str] = []
    # the whole role, no tags: the first task must stop it before anything is installed
    result = run(
        str(_guest_inventory(tmp_path)),
        "guest.yml",
        extravars={
            "passthrough_guest_check_root": str(root),
            "passthrough_guest_check_commands": str(commands),
        },
        progress=tasks.append,
    )
    assert not result.ok
    reason = result.hosts["h100-guest"].reason or ""
    assert reason.startswith("The guest sees its GPU: gpu-bars:"), reason
    assert "passthrough render" in reason or reason.endswith("...")
    started = [t.strip() for t in tasks if t.strip().startswith("TASK")]
    assert started[-1] == "TASK The guest sees its GPU", started  # nothing after it ran
    assert result.hosts["h100-guest"].changed == 0


def test_snapshot_of_a_live_machine_without_pyudev(tmp_path: Path) -> None:
    """Seen on the real H100 guest (no pip, no pyudev): `snapshot` stopped with "pyudev
    cannot be imported" while `scan` read sysfs. Both now fall back to the root's sysfs
    files; the capture then reads back as the same machine."""
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(SITECUSTOMIZE.format(blocked=("pyudev", "libvirt")))
    env = {
        "PATH": os.environ.get("PATH", ""),
        "PYTHONPATH": f"{site}:{REPO}",
        "BLOCK_LOG": str(tmp_path / "blocked.log"),
    }
    out = tmp_path / "live.tar.gz"
    done = subprocess.run(
        [sys.executable, "-m", "passthrough", "snapshot", "-o", str(out)],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0 and out.is_file(), done.stderr
    assert "pyudev" in (tmp_path / "blocked.log").read_text()  # it was tried, and refused
    scan = subprocess.run(
        [sys.executable, "-m", "passthrough", "scan", "--json", "--root", str(out)],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert scan.returncode == 0, scan.stderr
    live = {p.name for p in Path("/sys/bus/pci/devices").iterdir()}
    with tarfile.open(out) as tar:
        captured = {
            m.name.split("/")[4]
            for m in tar.getmembers()
            if m.name.startswith("sys/bus/pci/devices/") and m.name.count("/") == 4
        }
    assert captured == live


def test_pci_ids_from_uevent_and_from_the_attribute_files() -> None:
    """The guest check's own reading of PCI IDs: the uevent line where there is one, the
    vendor/device files where not (an old snapshot), None for what is missing or not hex."""
    from passthrough.guest.virt import detect, pci_ids

    base = "sys/bus/pci/devices"
    files = {
        f"{base}/0000:00:00.0/uevent": "DRIVER=x\nPCI_ID=8086:29C0\nPCI_CLASS=60000",
        f"{base}/0000:00:01.0/vendor": "0x1af4",
        f"{base}/0000:00:01.0/device": "0x1041",
        f"{base}/0000:00:02.0/vendor": "nonsense",
    }
    found = list(pci_ids(files.get, lambda rel: sorted({k.split("/")[4] for k in files})))
    assert found == [
        ("0000:00:00.0", 0x8086, 0x29C0),
        ("0000:00:01.0", 0x1AF4, 0x1041),
        ("0000:00:02.0", None, None),
    ]
    machine = detect({}.get, found)
    assert machine.guest and machine.evidence == (
        "emulated host bridge 8086:29c0 at 0000:00:00.0",
        "1 virtio PCI function (1af4:*)",
    )


# -- hostile captures ------------------------------------------------------------------------


def _guest_cli(*args: str) -> subprocess.CompletedProcess[str]:
    """The real CLI in its own process, with a limit: a hang is a failure, not a stuck run."""
    return run_cli(args, timeout=60)


def test_links_out_of_a_capture_are_followed_inside_it(
    variant: tuple[Path, Path], tmp_path: Path
) -> None:
    """guest check and snapshot resolve a capture's links the way a chroot would: files
    planted outside (a CDI spec, /dev, cpuinfo) are never read, listed or archived."""
    root, _commands = variant
    # outside: under /tmp, not tmp_path: the quick tier's tmp_path is on /dev/shm, where the
    # absolute links planted here would, re-rooted, run through the `dev` link planted in the
    # capture and loop, as they would in a real chroot
    with tempfile.TemporaryDirectory(prefix="passthrough-outside-", dir="/tmp") as where:
        _links_out_stay_out(root, Path(where), tmp_path)


def _links_out_stay_out(root: Path, outside: Path, tmp_path: Path) -> None:
    (outside / "dev").mkdir(parents=True)
    (outside / "dev" / "nvidiaSECRET").write_text("")
    (outside / "spec.yaml").write_text("kind: nvidia.com/gpu\nlibcuda.so.999.1 SECRET\n")
    (outside / "cpuinfo").write_text("flags : SECRET\n")
    (root / "etc/cdi").mkdir(parents=True, exist_ok=True)
    (root / "etc/cdi/nvidia.yaml").symlink_to(outside / "spec.yaml")  # absolute: re-rooted
    shutil.rmtree(root / "dev")
    (root / "dev").symlink_to(outside / "dev")
    (root / "proc/cpuinfo").unlink()
    (root / "proc/cpuinfo").symlink_to(os.path.relpath(outside / "cpuinfo", root / "proc"))
    r = _guest_cli("guest", "check", "--root", str(root), "--json")
    assert r.returncode in (0, 1) and "Traceback" not in r.stderr, r.stderr
    assert "SECRET" not in r.stdout and "999.1" not in r.stdout
    out = tmp_path / "snap.tar.gz"
    r = _guest_cli("snapshot", "--root", str(root), "-o", str(out))
    assert r.returncode == 0, r.stderr
    with tarfile.open(out) as tar:
        for member in tar.getmembers():
            assert "SECRET" not in member.name
            data = tar.extractfile(member) if member.isfile() else None
            assert data is None or b"SECRET" not in data.read(), member.name


def test_fifos_and_a_hostile_snapshot_meta_neither_hang_nor_crash(
    variant: tuple[Path, Path], tmp_path: Path
) -> None:
    """A FIFO where a file belongs reads as nothing (no hang, for scan, guest check and
    snapshot alike); a snapshot metadata file nested past the parser's depth is no snapshot."""
    root, _commands = variant
    (root / "etc/docker").mkdir(parents=True, exist_ok=True)
    os.mkfifo(root / "etc/docker/daemon.json")
    (root / "proc/driver/nvidia/version").unlink()
    os.mkfifo(root / "proc/driver/nvidia/version")
    (root / "passthrough-snapshot.json").write_text("[" * 60000)
    for args in (
        ("guest", "check", "--root", str(root), "--json"),
        ("snapshot", "--root", str(root), "-o", str(tmp_path / "s.tar.gz")),
        ("scan", "--root", str(root), "--json"),
    ):
        r = _guest_cli(*args)
        assert r.returncode in (0, 1) and "Traceback" not in r.stderr, (args, r.stderr)
    r = _guest_cli("guest", "check", "--root", str(root), "--json")
    levels = {c["id"]: c["level"] for c in json.loads(r.stdout)["checks"]}
    assert levels["driver-version"] == FAIL  # nothing readable there: the check says so


def test_planted_names_and_lenient_ids_are_not_taken(variant: tuple[Path, Path]) -> None:
    """A device entry whose name is no PCI address (here one forging a coloured PASS line)
    is neither a GPU nor printed raw; an ID that int(x, 16) would take but sysfs never
    writes (a sign, non-ASCII digits) is no ID."""
    root, commands = variant
    devices = root / "sys/bus/pci/devices"
    forged = "0000:00:07.0\n\x1b[32mPASS  fake"
    (devices / forged).symlink_to(f"../../../devices/pci0000:00/{GPU}")
    r = _guest_cli("guest", "check", "--root", str(root), "--commands", str(commands))
    assert r.returncode == 0, r.stderr
    assert "\x1b" not in r.stdout and "PASS  fake" not in r.stdout.splitlines()
    assert "1 NVIDIA function:" in r.stdout
    from passthrough.guest.virt import hex_id, hex_pair

    assert hex_pair("1b36:-1") == (0x1B36, None) and hex_id("٣٣") is None
    assert hex_id("0x10de") == 0x10DE and hex_id("30200") == 0x30200
    r = _guest_cli("scan", "--root", str(root), "--json")
    problems = json.loads(r.stdout)["problems"]
    assert r.returncode == 0 and any("\\x1b" in p and "not a PCI address" in p for p in problems)
