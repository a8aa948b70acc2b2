# SPDX-License-Identifier: Apache-2.0
"""Before a reboot, host.yml finds the libvirt guests holding the host's cards and refuses
(the default) or stops them and starts them again after.

Real ansible-playbook over an hgx-h100 sample root (local connection) and a real libvirtd
(the session fixture) serving libvirt's test driver (test+unix:///default): the one driver
here whose domains can run while holding a PCI hostdev. The daemon keeps the test driver's
state while a connection to it is open, so the test holds one and the play's modules see the
guest it started. With a sample root the reboot itself is left out (the role reboots only
"/"); the guests around it are handled as on a real host."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import libvirt
import pytest

from passthrough.cli import main
from passthrough.provision.runner import run, summary_table
from tests.kube_standin import Cluster, StandIn, pod
from tests.test_ansible import _inventory, _root
from tests.test_fleet_rolling import _tree

pytestmark = pytest.mark.fleet

URI = "test+unix:///default"
GUEST = """<domain type='test'>
  <name>gpu-guest</name><memory unit='MiB'>512</memory><vcpu>1</vcpu>
  <os><type arch='x86_64'>hvm</type></os>
  <devices>
    <hostdev mode='subsystem' type='pci' managed='yes'>
      <source><address domain='0x0000' bus='0x18' slot='0x00' function='0x0'/></source>
    </hostdev>
  </devices>
</domain>"""


EVENTS: list[int] = []  # the guest's lifecycle events as the daemon sends them


def _loop() -> None:
    while True:
        libvirt.virEventRunDefaultImpl()


@pytest.fixture
def guest(libvirtd: str) -> Iterator[libvirt.virDomain]:
    """gpu-guest running with 0000:18:00.0, on the daemon's test driver; its lifecycle
    events (stopped, started) recorded in EVENTS by libvirt's own event loop."""
    if not EVENTS:
        libvirt.virEventRegisterDefaultImpl()
        threading.Thread(target=_loop, daemon=True).start()
    EVENTS[:] = [-1]  # -1: the loop runs; the events follow
    conn = libvirt.open(URI)
    dom = conn.defineXML(GUEST)
    dom.create()
    callback = conn.domainEventRegisterAny(
        dom,
        libvirt.VIR_DOMAIN_EVENT_ID_LIFECYCLE,
        lambda _c, _d, event, _detail, _o: EVENTS.append(event),
        None,
    )
    try:
        yield dom
    finally:
        conn.domainEventDeregisterAny(callback)
        if dom.isActive():
            dom.destroy()
        dom.undefine()
        conn.close()


def _events() -> list[int]:
    time.sleep(1)  # the daemon's events reach the loop thread asynchronously
    return EVENTS[1:]


def _host(tmp_path: Path, **extra: Any) -> tuple[Path, Path]:
    root = _root(tmp_path, "h", "hgx-h100")
    host = {
        "passthrough_root": str(root),
        "passthrough_host_gpus": ["0000:18:00.0"],
        "passthrough_reboot_ok": True,
        "passthrough_host_libvirt_uri": URI,
        **extra,
    }
    return _inventory(tmp_path, {"h": host}), root


def test_a_running_guest_holding_the_card_is_refused_by_default(
    tmp_path: Path, guest: libvirt.virDomain
) -> None:
    inv, root = _host(tmp_path)
    before = guest.ID()
    result = run(str(inv), "host.yml")
    assert not result.ok
    reason = result.hosts["h"].reason or ""
    assert "guests: gpu-guest running with the cards" in reason, summary_table(result)
    assert "passthrough_guests=stop" in reason
    assert guest.isActive() and guest.ID() == before
    assert _events() == []  # left running, never stopped
    assert not (root / "etc/default/grub.d/99-passthrough.cfg").exists()  # nothing changed


def test_the_opt_in_stops_the_guest_and_starts_it_after(
    tmp_path: Path, guest: libvirt.virDomain
) -> None:
    """passthrough_guests=stop: shut down before the reboot, started after (libvirt's own
    lifecycle events: the guest really went down and came up again)."""
    inv, root = _host(tmp_path, passthrough_guests="stop")
    log = tmp_path / "run.log"
    result = run(str(inv), "host.yml", log_path=str(log))
    assert result.ok, summary_table(result)
    assert "vfio-pci" in (root / "etc/modprobe.d/passthrough-vfio.conf").read_text()
    assert guest.isActive()
    assert _events() == [libvirt.VIR_DOMAIN_EVENT_STOPPED, libvirt.VIR_DOMAIN_EVENT_STARTED]
    text = log.read_text()
    stop = text.index(
        "TASK [passthrough.gpu.passthrough_host : Stop the guests that hold the cards]"
    )
    start = text.index("TASK [passthrough.gpu.passthrough_host : Start the guests stopped for the")
    assert stop < start


def test_a_guest_holding_another_card_does_not_stop_the_reboot(
    tmp_path: Path, guest: libvirt.virDomain
) -> None:
    """Only the cards the plan hands over count: 0000:19:00.0 leaves gpu-guest alone."""
    inv, root = _host(tmp_path, passthrough_host_gpus=["0000:19:00.0"])
    result = run(str(inv), "host.yml")
    assert result.ok, summary_table(result)
    assert guest.isActive() and _events() == []
    assert (
        'KERNEL=="0000:19:00.0"'
        in (root / "etc/udev/rules.d/40-passthrough-vfio.rules").read_text()
    )


def _applied(tmp_path: Path, **extra: Any) -> tuple[Path, Path]:
    """The host with 0000:18:00.0 handed over by an earlier apply (the CLI's, quicker than a
    play), to be undone by the play (state absent)."""
    inv, root = _host(tmp_path, passthrough_host_state="absent", **extra)
    argv = ["apply", "--root", str(root), "--gpu", "0000:18:00.0", "--yes", "--quiet"]
    assert main(argv) == 0
    return inv, root


def test_undo_refuses_a_running_guest_holding_the_card_by_default(
    tmp_path: Path, guest: libvirt.virDomain
) -> None:
    """state absent gives the card back to the host at the reboot: the guest holding it is in
    the way as it is for an apply, so the undo is refused naming it, and nothing is undone."""
    inv, root = _applied(tmp_path)
    result = run(str(inv), "host.yml")
    assert not result.ok
    reason = result.hosts["h"].reason or ""
    assert "guests: gpu-guest running with the cards" in reason, summary_table(result)
    assert guest.isActive() and _events() == []
    assert "vfio-pci" in (root / "etc/modprobe.d/passthrough-vfio.conf").read_text()


def test_undo_with_the_opt_in_stops_the_guest_and_starts_it_after(
    tmp_path: Path, guest: libvirt.virDomain
) -> None:
    """state absent with passthrough_guests=stop: the guest is shut down, the changes undone,
    and the guest started again (libvirt's lifecycle events)."""
    inv, root = _applied(tmp_path, passthrough_guests="stop")
    result = run(str(inv), "host.yml")
    assert result.ok, summary_table(result)
    assert not (root / "etc/modprobe.d/passthrough-vfio.conf").exists()
    assert guest.isActive()
    assert _events() == [libvirt.VIR_DOMAIN_EVENT_STOPPED, libvirt.VIR_DOMAIN_EVENT_STARTED]


@pytest.fixture
def kube(tmp_path: Path) -> Iterator[StandIn]:
    """A STAND-IN Kubernetes API (tests/kube_standin.py; no real one can run here) with node
    gpu-node-1 running a pod that requests a GPU and one that does not."""
    cluster = Cluster(
        "gpu-node-1",
        [pod("trainer", "gpu-node-1", {"nvidia.com/gpu": "1"}), pod("web", "gpu-node-1")],
    )
    standin = StandIn(cluster, tmp_path)
    try:
        yield standin
    finally:
        standin.close()


def _node(tmp_path: Path, kube: StandIn, **extra: Any) -> tuple[Path, Path]:
    return _host(
        tmp_path,
        passthrough_host_libvirt_uri="",
        passthrough_host_k8s_node="gpu-node-1",
        passthrough_host_k8s_kubeconfig=str(kube.kubeconfig),
        **extra,
    )


def test_standin_kubernetes_pods_holding_the_cards_refuse_the_node(
    tmp_path: Path, kube: StandIn
) -> None:
    """Against the stand-in API: the GPU pod on the node refuses the host by default; the
    node is not cordoned and the host not changed."""
    inv, root = _node(tmp_path, kube)
    result = run(str(inv), "host.yml")
    assert not result.ok
    reason = result.hosts["h"].reason or ""
    assert "pods: default/trainer request nvidia.com/ on node gpu-node-1" in reason, summary_table(
        result
    )
    assert not [c for c in kube.cluster.calls if c[0] != "GET"]  # read only
    assert not (root / "etc/default/grub.d/99-passthrough.cfg").exists()


def test_standin_kubernetes_node_drained_before_and_uncordoned_after(
    tmp_path: Path, kube: StandIn
) -> None:
    """Against the stand-in API, with passthrough_guests=stop: kubernetes.core.k8s_drain
    cordons the node, evicts both pods and waits for them, and the node is uncordoned once
    the host is done (the reboot and verify are left out with a sample root)."""
    inv, root = _node(tmp_path, kube, passthrough_guests="stop")
    result = run(str(inv), "host.yml")
    assert result.ok, summary_table(result)
    writes = [c for c in kube.cluster.calls if c[0] != "GET"]
    node = ("PATCH", "/api/v1/nodes/gpu-node-1")
    assert writes[0] == node and writes[-1] == node
    evicted = {path for method, path in writes if method == "POST"}
    assert evicted == {
        "/api/v1/namespaces/default/pods/trainer/eviction",
        "/api/v1/namespaces/default/pods/web/eviction",
    }
    assert kube.cluster.node["spec"]["unschedulable"] is False
    assert not kube.cluster.pods
    assert "vfio-pci" in (root / "etc/modprobe.d/passthrough-vfio.conf").read_text()


def skip_fleet(
    tmp_path: Path, how: Callable[[int], dict[str, str]] | None = None
) -> tuple[Path, Path, Path]:
    """Two hgx-h100 hosts under passthrough_guests=skip, in that order: "a" asked for the card
    gpu-guest holds, "b" for another; ``how(i)``: host i reached another way (SSH). Returns
    the inventory and the two roots."""
    first = _root(tmp_path, "a", "hgx-h100")
    second = _root(tmp_path, "b", "hgx-h100")
    common = {
        "passthrough_reboot_ok": True,
        "passthrough_host_libvirt_uri": URI,
        "passthrough_guests": "skip",
    }
    cards = ("0000:18:00.0", "0000:19:00.0")
    hosts = {
        name: {
            "passthrough_root": str(root),
            "passthrough_host_gpus": [card],
            **common,
            **(how(i) if how else {}),
        }
        for i, (name, root, card) in enumerate(zip("ab", (first, second), cards, strict=True))
    }
    return _inventory(tmp_path, hosts), first, second


def judge_skip(
    result: Any, guest: libvirt.virDomain, first: Path, before: dict[str, bytes], second: Path
) -> None:
    """ "a" skipped naming the guest, its tree as it was, the guest never stopped; "b", the
    next batch, done."""
    assert result.ok, summary_table(result)
    a, b = result.hosts["a"], result.hosts["b"]
    assert (a.status, a.batch, b.status, b.batch) == ("skipped", 1, "reboot pending", 2)
    assert "guests gpu-guest running with the cards (passthrough_guests=skip)" in (a.why or "")
    assert _tree(first) == before
    assert guest.isActive() and _events() == []
    rules = second / "etc/udev/rules.d/40-passthrough-vfio.rules"
    assert 'KERNEL=="0000:19:00.0"' in rules.read_text()


def test_skip_leaves_the_host_under_a_running_guest_and_the_rollout_goes_on(
    tmp_path: Path, guest: libvirt.virDomain
) -> None:
    """passthrough_guests=skip: the canary's card is held by the running gpu-guest, so that
    host is left as it was (tree byte-identical, the guest never stopped) and reported
    skipped naming the guest; the next batch's host (another card) is done."""
    inv, first, second = skip_fleet(tmp_path)
    before = _tree(first)
    judge_skip(run(str(inv), "host.yml"), guest, first, before, second)
