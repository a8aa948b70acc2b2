# SPDX-License-Identifier: Apache-2.0
"""``vm stop`` of a guest holding a vGPU: a clean shutdown, a grace period, then libvirt's
graceful destroy (SIGTERM only), never a plain destroy (which ends in SIGKILL: a QEMU killed
so during vGPU start-up can wedge the VF).

What runs for real: the decision on domains ``render --vgpu`` writes from roots built on the
real captures (../shared/realworld/vgpu/), the whole ``vm stop`` command on libvirt's own test
driver (a domain file holding a running guest with an mdev hostdev), and the SIGTERM (ours,
and libvirt's graceful destroy) against the real libvirtd's QEMU driver on a plain TCG
domain (``render --no-gpu``),
including a QEMU that cannot act on SIGTERM (stopped with SIGSTOP): it is left alive, named. Not covered: a libvirtd starting a domain that really holds a
vGPU (no vGPU VF or mdev can exist here, and libvirt refuses to start a hostdev whose device
is absent), so the QEMU stopped here holds none."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from passthrough.cli import main
from passthrough.host.root import HostRoot
from passthrough.vm.vgpustop import (
    StillRunning,
    qemu_pid,
    root_driver,
    stop_gently,
    vgpu_hostdevs,
)
from tests.cli_process import run_cli

from .test_vgpu_realworld import VFS, apply, driver
from .vgpu_standin import A2_PF, L40S_VF, a2_root, l40s_root

REPO = Path(__file__).parents[1]
UUID = "4b20d080-1b54-4048-85b3-a6a62d165c01"


def realworld(test):  # type: ignore[no-untyped-def]
    """The captures of ../shared/realworld/vgpu: the realworld tier, skipped without them."""
    absent = pytest.mark.skipif(not L40S_VF.is_dir(), reason="../shared/realworld/vgpu absent")
    return pytest.mark.realworld(absent(test))


def rendered(root: Path, name: str, *args: str) -> str:
    out = root.parent / f"{name}.xml"
    assert main(["render", "--root", str(root), "--name", name, *args, "-o", str(out)]) == 0
    return out.read_text()


@realworld
def test_the_rendered_vgpu_forms_are_told_from_a_whole_card(
    tmp_path: Path, hosts: dict[str, Path]
) -> None:
    l40s = l40s_root(tmp_path / "l40s")
    apply(l40s, "L40S-12Q", 1, driver())
    vf_xml = rendered(l40s, "v1", "--vgpu", VFS[0])
    assert vgpu_hostdevs(vf_xml, root_driver(HostRoot(str(l40s)))) == [
        f"VF {VFS[0]} (nvidia driver)"
    ]
    a2 = a2_root(tmp_path / "a2")
    (m,) = apply(a2, "A2-4C", 1, driver(), pf=A2_PF).placements
    mdev_xml = rendered(a2, "m1", "--vgpu", str(m.uuid))
    assert vgpu_hostdevs(mdev_xml, root_driver(HostRoot(str(a2)))) == [f"mdev {m.uuid}"]
    # a whole card (managed='yes', libvirt binds it to vfio-pci): not a vGPU
    hgx = hosts["hgx-h100"]
    card_xml = rendered(hgx, "c1", "--gpu", "0000:18:00.0")
    assert "<hostdev" in card_xml
    assert vgpu_hostdevs(card_xml, root_driver(HostRoot(str(hgx)))) == []
    # the same card given managed='no' (bound to vfio-pci by hand): not a vGPU either
    unmanaged = card_xml.replace("managed='yes'", "managed='no'")
    on_vfio = {"0000:18:00.0": "vfio-pci"}
    assert vgpu_hostdevs(unmanaged, lambda a: on_vfio.get(a, "vfio-pci")) == []
    # a remote host (no driver to read): managed='no' without a vfio driver element counts
    assert vgpu_hostdevs(vf_xml, lambda _a: None) == [f"VF {VFS[0]}"]
    # the source address read as libvirt reads it: bus='046' is octal, the VF's bus 0x26
    octal = re.sub(r"bus='0x26'", "bus='046'", vf_xml)
    assert octal != vf_xml
    assert vgpu_hostdevs(octal, root_driver(HostRoot(str(l40s)))) == [
        f"VF {VFS[0]} (nvidia driver)"
    ]


# -- the command, on libvirt's own test driver ------------------------------------------------

NODE = """<node>
  <domain type='test'>
    <name>{name}</name>
    <memory>131072</memory>
    <os><type>hvm</type></os>
    <devices>
      <hostdev mode='subsystem' type='mdev' model='vfio-pci'>
        <source><address uuid='{uuid}'/></source>
      </hostdev>
    </devices>
  </domain>
</node>
"""


def test_vm_stop_shuts_a_vgpu_guest_down_and_says_so(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """libvirt's test driver reads the node file at each connection: the guest runs each
    time, and its shutdown is immediate."""
    node = tmp_path / "node.xml"
    node.write_text(NODE.format(name="desk1", uuid=UUID))
    uri = f"test://{node}"
    assert main(["vm", "stop", "desk1", "--connect", uri, "--grace", "5"]) == 0
    assert capsys.readouterr().out.splitlines()[0] == (
        f"desk1 holds a vGPU (mdev {UUID}): shut down cleanly in 0 s"
    )
    assert main(["vm", "stop", "desk1", "--connect", uri, "--force", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["stopped"] == (
        f"desk1 holds a vGPU (mdev {UUID}): --force, stopped by libvirt's graceful destroy "
        "(SIGTERM; libvirt may still SIGKILL a QEMU that outlives it, there is no pid to "
        "signal here)"
    )
    # (its state after: the test driver reads the node file again, so it runs again)
    bad = run_cli(["vm", "stop", "desk1", "--connect", uri, "--grace", "-1"])
    assert bad.returncode == 2 and "--grace: '-1': seconds from 0 to 3600" in bad.stderr


# -- the graceful destroy against the real libvirtd ---------------------------------------


@pytest.fixture()
def tcg_guest(libvirtd: str) -> Iterator[tuple[object, object]]:
    """A plain TCG guest (``render --no-gpu``, no disk: OVMF waits in its boot manager and
    ignores the ACPI power button), started on the real libvirtd; undefined after."""
    import libvirt

    name = f"vgpu-after-boot-stop-{os.getpid()}"
    argv = [sys.executable, "-m", "passthrough", "render", "--root", "/", "--name", name]
    argv += [
        "--no-gpu",
        "--virt-type",
        "qemu",
        "--network",
        "none",
        "--memory",
        "512M",
        "--vcpus",
        "1",
    ]
    xml = subprocess.run(argv, capture_output=True, text=True, check=True, cwd=REPO).stdout
    conn = libvirt.open(libvirtd)
    dom = conn.defineXML(xml)
    try:
        dom.create()
        yield dom, libvirt
    finally:
        pid = Path(f"/run/libvirt/qemu/{name}.pid")
        if pid.exists():
            os.kill(int(pid.read_text()), signal.SIGCONT)
        if dom.isActive():
            dom.destroy()
        dom.undefineFlags(libvirt.VIR_DOMAIN_UNDEFINE_NVRAM)
        conn.close()


def qemu_log(dom: object) -> str:
    return Path(f"/var/log/libvirt/qemu/{dom.name()}.log").read_text()  # type: ignore[attr-defined]


def test_after_the_grace_period_qemu_gets_sigterm_and_nothing_else(
    tcg_guest: tuple[object, object],
) -> None:
    dom, libvirt = tcg_guest
    pid = qemu_pid(dom.name())  # type: ignore[attr-defined]
    assert pid is not None
    started = time.monotonic()
    said = stop_gently(dom, libvirt, grace=3, force=False, held=["mdev stand-in"], pid=pid)
    assert time.monotonic() - started >= 3
    assert said.endswith(
        f": no clean shutdown in 3 s, stopped with SIGTERM to QEMU (pid {pid}; no SIGKILL)"
    )
    assert not dom.isActive()  # type: ignore[attr-defined]
    assert "terminating on signal 15 from pid" in qemu_log(dom)


def test_a_qemu_that_outlives_sigterm_is_left_running(tcg_guest: tuple[object, object]) -> None:
    """QEMU stopped (SIGSTOP) cannot act on SIGTERM: vm stop waits, names it and leaves it
    — the process is still there, so no SIGKILL was sent. Then SIGCONT: the pending SIGTERM
    ends it."""
    dom, libvirt = tcg_guest
    pid = qemu_pid(dom.name())  # type: ignore[attr-defined]
    assert pid is not None
    os.kill(pid, signal.SIGSTOP)
    with pytest.raises(
        StillRunning, match=rf"QEMU \(pid {pid}\) outlived SIGTERM by 3 s: not kill"
    ):
        stop_gently(dom, libvirt, grace=0, force=True, held=["mdev stand-in"], pid=pid, term_wait=3)
    os.kill(pid, 0)  # alive
    assert dom.isActive()  # type: ignore[attr-defined]
    os.kill(pid, signal.SIGCONT)
    deadline = time.monotonic() + 60
    while dom.isActive() and time.monotonic() < deadline:  # type: ignore[attr-defined]
        time.sleep(0.5)
    assert not dom.isActive()  # type: ignore[attr-defined]
    assert "terminating on signal 15" in qemu_log(dom)


def test_without_a_pid_it_is_libvirts_graceful_destroy(tcg_guest: tuple[object, object]) -> None:
    """Where passthrough cannot signal QEMU itself (a remote URI): libvirt's graceful destroy,
    which sends SIGTERM (QEMU logs it); the line does not promise that libvirt never sends
    SIGKILL (libvirt 9.0 did, tried on a QEMU stopped with SIGSTOP, after ~15 s)."""
    dom, libvirt = tcg_guest
    said = stop_gently(dom, libvirt, grace=1, force=False, held=["mdev stand-in"])
    assert said.endswith(
        ": no clean shutdown in 1 s, stopped by libvirt's graceful destroy (SIGTERM; libvirt may "
        "still SIGKILL a QEMU that outlives it, there is no pid to signal here)"
    )
    assert not dom.isActive()  # type: ignore[attr-defined]
    assert "terminating on signal 15 from pid" in qemu_log(dom)
