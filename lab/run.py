# SPDX-License-Identifier: Apache-2.0
"""The lab, run from outside: a real Debian 12 kernel under QEMU with an emulated Intel
IOMMU, and the toolkit inside it.

    python lab/run.py [--full] [--keep WORKDIR]

Stage one (each stage prints what it does and how long it took):
  image   debootstrap once (cached, rebuilt when the recipe changes), then an ext4 image
  boot    QEMU q35 + intel-iommu (intremap, caching-mode), SSH port forward; KVM only when a
          probe shows it works here, TCG otherwise
  scan    `passthrough scan/check --json` on the real kernel: IOMMU groups, interrupt
          remapping, the two-function stand-in card viable, the stand-in display that shares
          its group with a NIC refused
  bind    `passthrough bind` moves both functions of the card to vfio-pci, confirmed by the
          kernel's bind events through pyudev; the negative case is refused and left alone

--full, the whole chain on a disk that boots through OVMF and GRUB:
  provision  the lab host has no passthrough library (stage one copies it onto python3's
             path; the full chain does not); `passthrough provision --playbook host.yml`
             over SSH as the user `lab`, root through sudo (become): the collection
             installs the controller's wheel into /opt/passthrough/venv, then checks,
             plan, apply (real update-initramfs and update-grub inside), the reboot
             through Ansible, verify; then the same play again, which must report 0
             changed, not reboot, and leave the venv as it was
  verify     /proc/cmdline, `passthrough verify`, both functions on vfio-pci, the negative
             case untouched and refused
  guest      `passthrough provision --playbook vm.yml`: the lab host's own libvirt renders,
             validates, defines and starts a guest with the card; its live XML and QEMU's PCI
             list show both functions; the playbook then removes it
  nested     a guest that boots: the library renders the card and the 64 GiB-BAR stand-in
             with the address planner's layout; the lab host's kernel and a busybox
             initramfs boot through OVMF inside it (TCG inside TCG) and print the guest's
             PCI view; every BAR at full size at the promised addresses, the big one in the
             planned window — and without the planner's window and bits, the kernel must
             report that BAR unassigned (lab/nested.py, lab/nested_render.py); with
             --no-nested-break (CI's lab tier) only the planned boot: the unplanned one is
             tests/lab/test_firmware_window.py's check, made there without the lab host
  admin      the admin edits /etc/default/grub after apply (one more kernel argument) and
             runs update-grub; the break's reboot boots it, and /proc/cmdline must have the
             admin's argument and ours
  break      the companion function's override is taken out of the applied udev rule; after a
             reboot `passthrough verify` must fail and name that function
  undo       `passthrough undo`, a reboot: the original files (the admin's /etc/default/grub
             with their edit), arguments (the admin's kept, ours gone) and drivers
On failure the console log, the Ansible logs and every command's output stay in the
artifacts directory (PASSTHROUGH_LAB_ARTIFACTS, default ./lab-artifacts).
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any
from xml.etree import ElementTree

sys.path.insert(0, str(Path(__file__).parent))
import image
import machine
import nested

REPO = Path(__file__).resolve().parents[1]
CARD = "0000:01:00.0"
CARD_FUNCTIONS = ["0000:01:00.0", "0000:01:00.1"]
NEGATIVE = "0000:02:01.0"
NEGATIVE_PEER = "0000:02:02.0"
# no_timer_check: see image.GRUB_DEFAULTS
APPEND = "root=/dev/vda rw console=ttyS0 no_timer_check intel_iommu=on iommu=pt"
SRC = "/opt/passthrough-src"
# the venv the collection installs the controller's library into (passthrough_runtime)
VENV = "/opt/passthrough/venv"
# Where scripts/setup.sh test names a file here, it exists (holding this process's id) while a
# nested guest boots, and the tests run beside the lab start no new test meanwhile
# (tests/conftest.py): TCG inside TCG slows down three- to fourfold beside any busy thread,
# even one at nice 19 (docs/lab.md, the nested row)
ALONE = "PASSTHROUGH_LAB_ALONE"


@contextlib.contextmanager
def alone() -> Iterator[None]:
    """The machine to this process while the block runs, where the run beside it asks."""
    path = os.environ.get(ALONE)
    if not path:
        yield
        return
    Path(path).write_text(f"{os.getpid()}\n")
    try:
        yield
    finally:
        Path(path).unlink(missing_ok=True)


GUEST = "lab-guest"
COMPANION = CARD_FUNCTIONS[1]  # the card's second function (a USB controller)
BIG = "0000:03:00.0"  # the large-BAR stand-in (ivshmem-plain, BAR2 64 GiB)
NESTED = "lab-nested"
IMAGES = "/var/lib/libvirt/images"
NESTED_MIB = 256
# The break's guest CPU bits: a count OVMF does not trust from any vendor, so it falls back
# to its 32 GiB window (TCG's "max" CPU says AuthenticAMD, whose 40 bits OVMF does trust).
BREAK_BITS = 38
# TCG inside TCG: the planned guest took 453 s at load 2, about 18 min beside the rest of the
# suite, and ran past 1,500 s (its capture half printed) with two more TCG guests beside it
NESTED_TIMEOUT = 2100
# The admin's edit after apply: a dotted parameter no kernel code claims, which the kernel
# ignores and still shows in /proc/cmdline
ADMIN_ARG = "lab.admin_edit=1"
ADMIN_GRUB = "/etc/default/grub"
# the line the admin's sed edits: GRUB_CMDLINE_LINUX_DEFAULT with its value in double quotes
ADMIN_LINE = r'^(GRUB_CMDLINE_LINUX_DEFAULT="[^"]*)"$'


class LabFailed(Exception):
    pass


def _sha256(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def with_admin_edit(text: str) -> str:
    """``text`` (an /etc/default/grub) as the admin's sed leaves it: ``ADMIN_ARG`` at the end
    of the GRUB_CMDLINE_LINUX_DEFAULT line."""
    edited, n = re.subn(ADMIN_LINE, rf'\1 {ADMIN_ARG}"', text, flags=re.M)
    if n != 1:
        raise LabFailed(f"{ADMIN_GRUB} has no single GRUB_CMDLINE_LINUX_DEFAULT line: {text}")
    return edited


class Lab:
    boot_wait = 600.0  # seconds for the first SSH banner

    def __init__(self, work: Path, artifacts: Path, say: Callable[[str], None] = print) -> None:
        self.work = work
        self.artifacts = artifacts
        self.say = say
        self.timings: dict[str, float] = {}
        self.machine: machine.LabMachine | None = None
        self.log: list[str] = []
        self.ansible_logs: list[Path] = []
        self.accel = "tcg"
        self.baseline = ""
        self._inventory: Path | None = None
        self.artifact_files: list[Path] = []
        self.ours: list[str] = []  # the arguments our GRUB drop-in appends
        self.admin_grub = ""  # sha256 of /etc/default/grub as the admin's edit left it
        # the lab host's Python with the library: the system's in stage one (put there by
        # boot), the collection's venv in the full chain (installed by the host play)
        self.python = "python3"
        self.installed: dict[str, Any] = {}

    def stage(self, name: str, fn: Callable[[], Any]) -> Any:
        self.say(f"[lab] {name} ...")
        started = time.monotonic()
        try:
            return fn()
        finally:
            self.timings[name] = time.monotonic() - started
            self.say(f"[lab] {name} took {self.timings[name]:.1f}s")

    def sh(self, command: str, timeout: int = 1800) -> subprocess.CompletedProcess[str]:
        assert self.machine is not None
        r = self.machine.ssh(command, timeout=timeout)
        self.log.append(f"$ {command}\n[rc={r.returncode}]\n{r.stdout}\n{r.stderr}")
        return r

    def pt(self, args: str) -> subprocess.CompletedProcess[str]:
        return self.sh(f"{self.python} -m passthrough {args}")

    # -- stages -------------------------------------------------------------------------
    def _key(self) -> Path:
        """The SSH key root and the lab user log in with (made once per work directory)."""
        key = self.work / "id_lab"
        if not key.exists():
            subprocess.run(
                ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(key)], check=True
            )
        return key

    def build(self) -> tuple[Path, Path, Path, Path]:
        key = self._key()
        img, kernel, initrd = image.image(self.work, (self.work / "id_lab.pub").read_text())
        return img, kernel, initrd, key

    def boot(
        self,
        img: Path,
        kernel: Path | None,
        initrd: Path | None,
        key: Path,
        tree: Callable[[], Path] = image.tree,
        library: bool = True,
    ) -> float:
        """Start the machine (direct kernel boot, or UEFI from the disk when no kernel is
        given: the bootloader on its ESP), wait for sshd, and put the toolkit inside unless
        ``library`` is false (the full chain: the collection installs it). The KVM probe
        boots ``kernel``, or the newest one of the image's ``tree``."""
        probe_kernel = kernel or tree() / f"boot/vmlinuz-{image.release_of(tree())}"
        self.accel = "kvm" if machine.kvm_works(probe_kernel) else "tcg"
        self.say(f"[lab] accelerator: {self.accel}")
        self.machine = machine.LabMachine(
            self.work, img, kernel, initrd, APPEND if kernel else "", key, self.accel
        )
        self.machine.start()
        seconds = self.machine.wait_ssh(self.boot_wait)
        if not library:
            return seconds
        # the library and its template, on python3's path as an installed package would be
        # (its dependencies are Debian's python3-* packages in the image)
        self.machine.copy_to(REPO / "passthrough", SRC)
        self.machine.copy_to(REPO / "templates", SRC)
        r = self.sh(f"echo {SRC} > /usr/lib/python3/dist-packages/passthrough-lab.pth")
        if r.returncode != 0:
            raise LabFailed(f"installing the toolkit: {r.stderr.strip()}")
        return seconds

    def scan(self) -> dict[str, Any]:
        r = self.pt("scan --json")
        if r.returncode != 0:
            raise LabFailed(f"scan failed: {r.stderr.strip()}")
        data: dict[str, Any] = json.loads(r.stdout)
        gpus = {g["address"]: g for g in data["gpus"]}
        checks = {c["id"]: c["level"] for c in data["checks"]}
        problems = []
        if data["host"]["iommu"]["groups"] < 5:
            problems.append("too few IOMMU groups")
        if checks.get("interrupt-remapping") != "PASS" or checks.get("iommu-enabled") != "PASS":
            problems.append(f"checks: {checks}")
        card = gpus.get(CARD)
        if not card or not card["viable"] or card["functions"] != CARD_FUNCTIONS:
            problems.append(f"stand-in card: {card}")
        neg = gpus.get(NEGATIVE)
        if not neg or neg["viable"] or not any(NEGATIVE_PEER in r for r in neg["reasons"]):
            problems.append(f"negative case: {neg}")
        if problems:
            raise LabFailed("; ".join(problems))
        return data

    def bind(self) -> dict[str, str]:
        r = self.sh("modprobe vfio-pci")
        if r.returncode != 0:
            raise LabFailed(f"modprobe vfio-pci: {r.stderr.strip()}")
        r = self.pt(f"bind --yes --gpu {CARD} --json")
        if r.returncode != 0:
            raise LabFailed(f"bind: {r.stderr.strip()}")
        if json.loads(r.stdout)["bound"] != CARD_FUNCTIONS:
            raise LabFailed(f"bind reported {r.stdout}")
        before = self.drivers([NEGATIVE])[NEGATIVE]
        refused = self.pt(f"bind --yes --gpu {NEGATIVE}")
        if refused.returncode != 2 or NEGATIVE_PEER not in refused.stderr:
            raise LabFailed(
                f"negative case was not refused: rc={refused.returncode} {refused.stderr.strip()}"
            )
        drivers = self.drivers([*CARD_FUNCTIONS, NEGATIVE])
        if any(drivers[a] != "vfio-pci" for a in CARD_FUNCTIONS) or drivers[NEGATIVE] != before:
            raise LabFailed(f"drivers after bind: {drivers} (negative case was {before})")
        return drivers

    # -- the full chain: UEFI + GRUB from the disk, apply, reboot, verify, undo, reboot ---------
    FILES = "find /etc /boot -xdev -type f ! -path '/etc/ssh/*' ! -path '/etc/machine-id' -print0 | sort -z | xargs -0 sha256sum"

    def inventory(self) -> Path:
        """The lab host as an Ansible inventory: SSH through the port forward, the card by
        address (the stand-ins have no NVIDIA IDs), reboots allowed, one small guest."""
        path = self.work / "inventory.yml"
        if self._inventory == path:
            return path  # written once per lab machine
        assert self.machine is not None
        m = self.machine
        # the guest uses KVM only where the lab machine itself does: under TCG the lab host
        # may still offer /dev/kvm (QEMU emulates AMD SVM), which is not a tested path
        nested_kvm = self.accel == "kvm" and self.sh("test -c /dev/kvm").returncode == 0
        guest_type = "kvm" if nested_kvm else "qemu"
        host = {
            "ansible_host": "127.0.0.1",
            "ansible_port": m.port,
            # an ordinary user logs in and the plays become root through sudo, as on a
            # fleet; the lab's own inspection (self.sh) logs in as root
            "ansible_user": image.USER,
            "ansible_become": True,
            "ansible_ssh_private_key_file": str(m.key),
            "ansible_ssh_common_args": "-o StrictHostKeyChecking=no -o UserKnownHostsFile=/dev/null",
            "ansible_python_interpreter": "/usr/bin/python3",
            # the host has no library: the collection installs the controller's (its wheel,
            # copied over) into a venv of its own (passthrough_runtime's default, venv)
            "passthrough_runtime_venv": VENV,
            "passthrough_host_gpus": [CARD],
            "passthrough_reboot_ok": True,
            "passthrough_vm_wait_ssh": False,
            "passthrough_vm_guests": [
                {
                    "name": GUEST,
                    "gpus": [CARD],
                    "vcpus": 1,
                    "memory_mib": 256,
                    "network": "none",
                    "virt_type": guest_type,
                    "state": "{{ lab_guest_state | default('running') }}",
                }
            ],
        }
        inventory = {"all": {"children": {"gpu_hosts": {"hosts": {"lab-host": host}}}}}
        path.write_text(json.dumps(inventory, indent=2))  # JSON is YAML
        self._inventory = path
        return path

    def provision(self, playbook: str, *extra: str) -> dict[str, Any]:
        """`passthrough provision` from outside, over SSH, as a user runs it."""
        log = self.work / f"ansible-{len(self.ansible_logs) + 1}-{Path(playbook).stem}.log"
        argv = [sys.executable, "-m", "passthrough", "provision", "-i", str(self.inventory())]
        argv += ["--playbook", playbook, "--json", "--log", str(log)]
        for e in extra:
            argv += ["-e", e]
        r = subprocess.run(argv, capture_output=True, text=True, timeout=3600, check=False)
        self.log.append(f"$ {' '.join(argv)}\n[rc={r.returncode}]\n{r.stdout}\n{r.stderr}")
        self.ansible_logs.append(log)
        result: dict[str, Any] = json.loads(r.stdout) if r.stdout.strip() else {}
        if r.returncode != 0 or not result.get("ok"):
            host = result.get("hosts", {}).get("lab-host", {})
            raise LabFailed(
                f"provision {playbook}: {host.get('reason') or r.stderr.strip()[-800:]}"
            )
        return result

    def provision_host(self) -> dict[str, Any]:
        cmdline = self.sh("cat /proc/cmdline").stdout
        if "iommu=pt" in cmdline:
            raise LabFailed(f"the first boot already has iommu=pt: {cmdline}")
        self.baseline = self.sh(self.FILES).stdout
        # a bare host: neither the system's python3 nor a venv has the library
        bare = self.sh(f"python3 -c 'import passthrough' || test -e {VENV}")
        if "No module named 'passthrough'" not in bare.stderr or bare.returncode == 0:
            raise LabFailed(f"the lab host is not bare: {bare.stderr.strip()[-300:]}")
        boot_id = self.sh("cat /proc/sys/kernel/random/boot_id").stdout.strip()
        result = self.provision("host.yml")
        result["bare"] = bare.stderr.strip().splitlines()[-1]
        self.python = f"{VENV}/bin/python"
        self.installed = result["runtime"] = self.runtime()
        if not result["hosts"]["lab-host"]["changed"]:
            raise LabFailed("the host play changed nothing")
        # Debian's kernel has the Intel IOMMU on by default: the plan adds iommu=pt
        grub = self.sh("grep -c 'iommu=pt' /boot/grub/grub.cfg").stdout.strip()
        if grub in ("", "0"):
            raise LabFailed("update-grub did not put iommu=pt into /boot/grub/grub.cfg")
        if self.sh("cat /proc/sys/kernel/random/boot_id").stdout.strip() == boot_id:
            raise LabFailed("the host play did not reboot the lab host")
        if "iommu=pt" not in self.sh("cat /proc/cmdline").stdout:
            raise LabFailed("after the play's reboot /proc/cmdline lacks iommu=pt")
        # the journal shows the regeneration commands really ran inside
        journal = json.loads(self.sh("cat /var/lib/passthrough/journal.json").stdout or "{}")
        ran = [
            s for tx in journal.get("transactions", []) for s in tx["steps"] if s["kind"] == "run"
        ]
        if not ran or any(s["state"] != "done" for s in ran):
            raise LabFailed(f"regeneration commands did not run: {ran}")
        return result

    def runtime(self) -> dict[str, Any]:
        """What the collection installed: the identity in the venv, when the venv was made and
        when the identity was written (the install step's last act, so the difference is its
        time on the host), and where the venv's Python finds the library."""
        r = self.sh(
            f"cat {VENV}/passthrough-runtime && stat -c %.3Y {VENV}/pyvenv.cfg "
            f"{VENV}/passthrough-runtime && "
            f"{VENV}/bin/python -c 'import passthrough; print(passthrough.__file__)'"
        )
        lines = r.stdout.split()
        if r.returncode != 0 or len(lines) != 4 or not lines[3].startswith(VENV + "/"):
            raise LabFailed(f"no runtime in {VENV}: {r.stdout.strip()} {r.stderr.strip()[-300:]}")
        return {
            "identity": lines[0],
            "created": lines[1],
            "written": lines[2],
            "install_seconds": round(float(lines[2]) - float(lines[1]), 1),
            "library": lines[3],
        }

    def provision_again(self) -> dict[str, Any]:
        """The host play a second time on the prepared host: every task ok, none changed,
        no reboot; and the plays' root came through sudo (its journal names the lab user)."""
        boot_id = self.sh("cat /proc/sys/kernel/random/boot_id").stdout.strip()
        result = self.provision("host.yml")
        host = result["hosts"]["lab-host"]
        if host["changed"] != 0 or host.get("reboot_required"):
            raise LabFailed(f"the second host play was not a no-op: {host}")
        if self.sh("cat /proc/sys/kernel/random/boot_id").stdout.strip() != boot_id:
            raise LabFailed("the second host play rebooted the lab host")
        runtime = self.runtime()
        if runtime != self.installed:  # the install step too did nothing
            raise LabFailed(f"the second host play touched the runtime: {runtime}")
        # sudo logs each command it runs; Ansible's become runs its modules that way
        journal = self.sh("journalctl -b -o cat _COMM=sudo").stdout
        become = [
            line
            for line in journal.splitlines()
            if line.lstrip().startswith(f"{image.USER} :") and "USER=root" in line
        ]
        if not become:
            raise LabFailed(f"no sudo to root by {image.USER} in this boot's journal")
        # the host task ran as the library's own command under the venv, not as a module
        direct = [line for line in become if "-m passthrough.hosttask" in line]
        wrapped = [line for line in become if "AnsiballZ_passthrough_host" in line]
        if not direct or wrapped:
            raise LabFailed(f"the host task did not run as the direct command: {become[-3:]}")
        return {
            "host": host,
            "seconds": result["seconds"],
            "sudo_commands": len(become),
            "direct_commands": len(direct),
            "runtime": runtime,
        }

    def reboot(self) -> float:
        assert self.machine is not None
        return self.machine.reboot()

    def verify(self) -> dict[str, Any]:
        r = self.pt("verify --json")
        data: dict[str, Any] = json.loads(r.stdout) if r.stdout.strip() else {}
        if r.returncode != 0 or not data.get("ok"):
            raise LabFailed(
                f"verify after the reboot: {r.stdout.strip()[-1500:]} {r.stderr.strip()[-500:]}"
            )
        if self.drivers([NEGATIVE])[NEGATIVE] == "vfio-pci":
            raise LabFailed("the refused stand-in display was taken by vfio-pci")
        refused = self.pt(f"plan --gpu {NEGATIVE}")
        if refused.returncode != 2 or NEGATIVE_PEER not in refused.stderr:
            raise LabFailed(f"the negative case was not refused: {refused.stderr.strip()}")
        return data

    def guest(self) -> dict[str, Any]:
        """The vm playbook inside the lab host: a guest under its own libvirt with both
        functions of the card; libvirt's live XML, QEMU's device tree and the VFIO group QEMU
        holds open must show them. Removed by the same playbook, the card stays on vfio-pci."""
        self.provision("vm.yml")
        virsh = "virsh -c qemu:///system"
        state = self.sh(f"{virsh} domstate {GUEST}").stdout.strip()
        if state != "running":
            raise LabFailed(f"the guest is {state or 'missing'}, not running")
        live = self.sh(f"{virsh} dumpxml {GUEST}").stdout
        attached = []
        for hostdev in ElementTree.fromstring(live).iter("hostdev"):
            a = hostdev.find("source/address")
            alias = hostdev.find("alias")
            if a is None or alias is None:  # a live domain names every device it attached
                continue
            attached.append(
                "{:04x}:{:02x}:{:02x}.{:x}".format(
                    *(int(a.get(k, "0"), 16) for k in ("domain", "bus", "slot", "function"))
                )
            )
        if attached != CARD_FUNCTIONS:
            raise LabFailed(f"live XML attaches {attached}, expected {CARD_FUNCTIONS}")
        # QEMU's own device tree (its PCI list shows only buses the guest firmware has
        # numbered yet): one vfio-pci device per function, reading the card's real IDs
        qtree = self.sh(f"{virsh} qemu-monitor-command {GUEST} --hmp 'info qtree'").stdout
        vfio = qtree.count("dev: vfio-pci,")
        missing = [
            a
            for a in CARD_FUNCTIONS
            if f'host = "{a}"' not in qtree or f"pci id {self.pci_id(a)}" not in qtree
        ]
        if vfio != len(CARD_FUNCTIONS) or missing:
            raise LabFailed(f"QEMU's device tree has {vfio} vfio-pci devices, lacks {missing}")
        # and the kernel's side: QEMU holds the card's VFIO group open
        group = self.sh(f"basename $(readlink /sys/bus/pci/devices/{CARD}/iommu_group)").stdout
        held = self.sh(
            f"ls -l /proc/$(pgrep -f 'guest={GUEST},' | head -1)/fd | grep -c /dev/vfio/{group.strip()}"
        )
        if held.stdout.strip() in ("", "0"):
            raise LabFailed(f"QEMU does not hold /dev/vfio/{group.strip()} open")
        self.provision("vm.yml", "lab_guest_state=absent")
        if self.sh(f"{virsh} domstate {GUEST}").returncode == 0:
            raise LabFailed("the vm playbook did not remove the guest")
        drivers = self.drivers(CARD_FUNCTIONS)
        if any(d != "vfio-pci" for d in drivers.values()):
            raise LabFailed(f"after the guest was removed the card is on {drivers}")
        return {
            "attached": attached,
            "qemu_vfio_devices": vfio,
            "vfio_group": int(group),
            "drivers_after": drivers,
        }

    # -- the nested guest that boots ------------------------------------------------------
    def nested_prepare(self) -> dict[str, Any]:
        """Inside the lab host: the nested guest's kernel (the lab host's own) and a busybox
        initramfs; the domain for the card and the large-BAR stand-in, rendered by the
        library with the address planner's layout; the host's view of both."""
        assert self.machine is not None
        self.machine.copy_to(REPO / "lab", SRC)
        build = f"python3 {SRC}/lab/nested.py /bin/busybox {IMAGES}/nested-initrd.gz"
        r = self.sh(f"{build} && cp $(ls /boot/vmlinuz-* | tail -1) {IMAGES}/nested-vmlinuz")
        if r.returncode != 0:
            raise LabFailed(f"building the nested guest's initramfs: {r.stderr.strip()[-800:]}")
        r = self.sh(f"{self.python} {SRC}/lab/nested_render.py {NESTED} {CARD} {BIG} {NESTED_MIB}")
        if r.returncode != 0:
            raise LabFailed(f"rendering the nested guest: {r.stderr.strip()[-800:]}")
        rendered: dict[str, Any] = json.loads(r.stdout)
        devices = " ".join(f"/sys/bus/pci/devices/{a}" for a in rendered["addresses"])
        host_view = self.sh(f"echo {nested.BEGIN}; {nested.dump(devices)}echo {nested.END}").stdout
        rendered["host"] = nested.parse_capture(host_view)
        return rendered

    def nested_boot(self, xml: str, tag: str) -> tuple[nested.Capture, list[str], float]:
        """Define and start the guest from ``xml`` with direct kernel boot and its serial
        port in a file; wait until its init has powered it off; parse what it printed.
        Returns the capture, the planner's finding codes on the domain, and the seconds."""
        log = f"{IMAGES}/{NESTED}-{tag}-serial.log"
        booted = nested.boot_xml(xml, f"{IMAGES}/nested-vmlinuz", f"{IMAGES}/nested-initrd.gz", log)
        path = f"/tmp/{NESTED}-{tag}.xml"
        self.sh(f"cat > {path} <<'LAB_XML_EOF'\n{booted}\nLAB_XML_EOF")
        (self.work / f"{NESTED}-{tag}.xml").write_text(booted)
        r = self.sh(f"{self.python} {SRC}/lab/nested_render.py --check {path}")
        if r.returncode != 0:
            raise LabFailed(f"layout check of the {tag} domain: {r.stderr.strip()[-800:]}")
        codes = [f["code"] for f in json.loads(r.stdout)]
        virsh = "virsh -c qemu:///system"
        r = self.sh(f"rm -f {log}; {virsh} define {path} && {virsh} start {NESTED}")
        if r.returncode != 0:
            raise LabFailed(f"starting the {tag} nested guest: {r.stderr.strip()[-800:]}")
        started = time.monotonic()
        try:
            while time.monotonic() - started < NESTED_TIMEOUT:
                state = self.sh(f"{virsh} domstate {NESTED}").stdout.strip()
                if state != "running":
                    break
                time.sleep(5)
            seconds = time.monotonic() - started
            text = self.sh(f"cat {log}").stdout
            (self.work / f"{NESTED}-{tag}-serial.log").write_text(text)
            self.artifact_files.append(self.work / f"{NESTED}-{tag}-serial.log")
            self.artifact_files.append(self.work / f"{NESTED}-{tag}.xml")
            if state == "running":
                raise LabFailed(
                    f"the {tag} nested guest still runs after {NESTED_TIMEOUT}s; its serial "
                    f"log ends: {text[-600:]}"
                )
            try:
                capture = nested.parse_capture(text)
            except ValueError as exc:
                qemu_log = self.sh(f"tail -20 /var/log/libvirt/qemu/{NESTED}.log").stdout
                raise LabFailed(
                    f"the {tag} nested guest: {exc}; serial: {text[-600:]} qemu: {qemu_log}"
                ) from None
        finally:
            self.sh(f"{virsh} destroy {NESTED}; {virsh} undefine --nvram {NESTED}")
        return capture, codes, seconds

    def nested_alone(
        self, boot: Callable[[dict[str, Any]], dict[str, Any]], rendered: dict[str, Any]
    ) -> dict[str, Any]:
        with alone():
            return boot(rendered)

    def nested_planned(self, rendered: dict[str, Any]) -> dict[str, Any]:
        """The guest as rendered: every function at the guest address the XML promised,
        with the host's IDs, every BAR assigned at its full size, the large BAR inside the
        window the planner chose."""
        capture, codes, seconds = self.nested_boot(rendered["xml"], "planned")
        host: nested.Capture = rendered["host"]
        problems = [f"the planner's own check flags the rendered domain: {codes}"] if codes else []
        bars: dict[str, dict[str, int]] = {}
        for host_addr, guest_addr in rendered["addresses"].items():
            h, g = host.functions[host_addr], capture.functions.get(guest_addr)
            if g is None:
                problems.append(f"{host_addr} is not at guest {guest_addr}")
                continue
            if (g.vendor, g.device, g.class_code) != (h.vendor, h.device, h.class_code):
                problems.append(f"guest {guest_addr} is {g.vendor:04x}:{g.device:04x}")
            for i in range(6):
                hb, gb = h.bar(i), g.bar(i)
                if hb is None or hb[1] == 0 or h.resources[i][2] & 0x100:  # IO BARs: no size check
                    continue
                if gb is None or gb[1] != hb[1]:
                    problems.append(f"guest {guest_addr} BAR {i} is {gb}, host size {hb[1]:#x}")
                else:
                    bars[f"{guest_addr} BAR {i}"] = {"start": gb[0], "size": gb[1]}
        window = rendered["layout"]["window"]
        big = bars.get(f"{rendered['addresses'][BIG]} BAR 2")
        if big is None:
            problems.append("the large BAR is not assigned")
        elif not (
            window["base"] <= big["start"]
            and big["start"] + big["size"] <= window["base"] + window["size"]
        ):
            problems.append(f"the large BAR {big} lies outside the planned window {window}")
        if problems:
            raise LabFailed("; ".join(problems))
        return {
            "seconds": seconds,
            "bars": bars,
            "big_bar": big,
            "window": window,
            "decisions": rendered["layout"]["decisions"],
            "addresses": rendered["addresses"],
        }

    def nested_break(self, rendered: dict[str, Any]) -> dict[str, Any]:
        """The same guest without the planner's window and bits: its kernel must report the
        large BAR unassigned, and the planner's check must flag the domain."""
        broken = nested.without_planner(rendered["xml"], BREAK_BITS)
        capture, codes, seconds = self.nested_boot(broken, "broken")
        guest_big = rendered["addresses"][BIG]
        g = capture.functions.get(guest_big)
        if g is None:
            raise LabFailed(f"the broken guest has no function at {guest_big}")
        bar = g.bar(2)
        said = nested.no_space(capture, guest_big)
        if bar is not None or not said:
            raise LabFailed(
                f"the break was not caught: the guest shows BAR 2 of {guest_big} as {bar}, "
                f"its kernel said {said}"
            )
        if "mmio-window-too-small" not in codes:
            raise LabFailed(f"the planner's check did not flag the broken domain: {codes}")
        return {"seconds": seconds, "big_bar": bar, "kernel": said, "codes": codes}

    def pci_id(self, address: str) -> str:
        sysfs = f"/sys/bus/pci/devices/{address}"
        vendor, device = self.sh(f"cat {sysfs}/vendor {sysfs}/device").stdout.split()
        return f"{vendor[2:]}:{device[2:]}"

    def drivers(self, addresses: list[str]) -> dict[str, str]:
        return {
            a: self.sh(
                f"basename $(readlink /sys/bus/pci/devices/{a}/driver 2>/dev/null) 2>/dev/null"
            ).stdout.strip()
            for a in addresses
        }

    def admin_edit(self) -> dict[str, Any]:
        """The admin, after apply, edits /etc/default/grub as they always have (one more
        argument on GRUB_CMDLINE_LINUX_DEFAULT, with sed) and runs update-grub. Our drop-in
        appends to the value the admin sets, so grub.cfg must carry both; the break's reboot
        boots it (`admin_cmdline` reads /proc/cmdline after it)."""
        dropin = "/etc/default/grub.d/99-passthrough.cfg"
        # our arguments: the drop-in sourced on an empty value, as grub-mkconfig sources it
        ours = self.sh(
            f"env -i bash -c 'GRUB_CMDLINE_LINUX_DEFAULT=; . {dropin}; "
            'printf %s "$GRUB_CMDLINE_LINUX_DEFAULT"\''
        )
        self.ours = ours.stdout.split()
        if ours.returncode != 0 or "iommu=pt" not in self.ours:
            raise LabFailed(f"our drop-in does not append iommu=pt: {ours.stdout!r} {ours.stderr}")
        text = self.sh(f"cat {ADMIN_GRUB}").stdout
        if f"{_sha256(text)}  {ADMIN_GRUB}" not in self.baseline.splitlines():
            raise LabFailed(f"{ADMIN_GRUB} changed between the baseline and the admin's edit")
        self.admin_grub = _sha256(with_admin_edit(text))
        linux = self.admin_sed("update-grub")
        return {"ours": self.ours, "grub_cfg": " ".join(linux)}

    def admin_sed(self, regenerate: str) -> list[str]:
        """The admin's sed on /etc/default/grub as it is now (one more argument on
        GRUB_CMDLINE_LINUX_DEFAULT; the file must then be ``with_admin_edit`` of it), then
        ``regenerate``; the default entry's linux line, which must carry the admin's argument
        and ours."""
        want = _sha256(with_admin_edit(self.sh(f"cat {ADMIN_GRUB}").stdout))
        r = self.sh(
            f'sed -i \'s/^\\(GRUB_CMDLINE_LINUX_DEFAULT="[^"]*\\)"$/\\1 {ADMIN_ARG}"/\' '
            f"{ADMIN_GRUB} && sha256sum {ADMIN_GRUB} && {regenerate}"
        )
        if r.returncode != 0 or not r.stdout.startswith(want):
            raise LabFailed(f"the admin's edit: {r.stdout.strip()[:200]} {r.stderr[-500:]}")
        linux = self.default_linux()
        if ADMIN_ARG not in linux or not set(self.ours) <= set(linux):
            raise LabFailed(f"{regenerate} did not put the admin's argument and ours: {linux}")
        return linux

    def default_linux(self) -> list[str]:
        """The words of the default GRUB entry's linux line in /boot/grub/grub.cfg: the first
        one (GRUB_DEFAULT=0; recovery entries take GRUB_CMDLINE_LINUX only)."""
        cfg = self.sh("cat /boot/grub/grub.cfg").stdout.splitlines()
        linux = next((ln.split() for ln in cfg if ln.split()[:1] == ["linux"]), None)
        if linux is None:
            raise LabFailed("/boot/grub/grub.cfg has no linux line")
        return linux

    def admin_cmdline(self) -> dict[str, Any]:
        """After the break's reboot: the admin's argument and ours, theirs first (our drop-in
        appends to their value)."""
        cmdline = self.sh("cat /proc/cmdline").stdout.strip()
        words = cmdline.split()
        admin = ADMIN_ARG in words
        ours = bool(self.ours) and all(a in words for a in self.ours)
        if not (admin and ours):
            raise LabFailed(
                f"after the admin's edit and a reboot /proc/cmdline lacks "
                f"{'the admin argument' if not admin else 'ours ' + str(self.ours)}: {cmdline}"
            )
        if words.index(ADMIN_ARG) > min(words.index(a) for a in self.ours):
            raise LabFailed(f"our arguments come before the admin's: {cmdline}")
        return {"cmdline": cmdline, "admin": admin, "ours": ours, "args": self.ours}

    def sabotage(self) -> dict[str, Any]:
        """Break something real: the binding as a plan that forgot the companion function would
        leave it — its line gone from the udev rule, and the initramfs rebuilt (initramfs-tools
        copies custom udev rules into it, and the rule does its work there). After a reboot
        `passthrough verify` must fail and name that function. Undo removes the rule (what is
        left of it is all ours) and rebuilds the initramfs without it."""
        rule = "/etc/udev/rules.d/40-passthrough-vfio.rules"
        r = self.sh(f"grep -c 'KERNEL==\"{COMPANION}\"' {rule} && sed -i '/{COMPANION}/d' {rule}")
        if r.returncode != 0:
            raise LabFailed(f"the applied rule has no line for {COMPANION}: {r.stderr.strip()}")
        r = self.sh("update-initramfs -u -k all")
        if r.returncode != 0:
            raise LabFailed(f"update-initramfs: {r.stderr.strip()[-500:]}")
        assert self.machine is not None
        self.machine.reboot()
        r = self.pt("verify --json")
        data = json.loads(r.stdout) if r.stdout.strip() else {}
        drivers = self.drivers(CARD_FUNCTIONS)
        if r.returncode == 0 or data.get("ok"):
            raise LabFailed(
                f"verify passed with the companion override removed (drivers {drivers})"
            )
        failed = [
            f"{c['id']}: {c['summary']}" for c in data.get("checks", []) if c["level"] == "FAIL"
        ]
        named = [f for f in failed if COMPANION in f]
        if not named or drivers[COMPANION] == "vfio-pci":
            raise LabFailed(f"verify failed without naming {COMPANION}: {r.stdout[-800:]}")
        return {"verify_rc": r.returncode, "failures": failed, "drivers": drivers}

    def undo(self) -> None:
        r = self.pt("undo --yes --json")
        if r.returncode != 0:
            raise LabFailed(f"undo: {r.stderr.strip()}")
        differ, after = self.changed_since_baseline()
        # /etc/default/grub is the admin's: undo keeps their edit made after apply
        if after.get(ADMIN_GRUB) == self.admin_grub:
            differ.remove(ADMIN_GRUB)
        if differ:
            raise LabFailed(f"undo left files changed: {differ[:10]}")
        if self.sh("grep -E 'iommu=pt|vfio' /boot/grub/grub.cfg").returncode == 0:
            raise LabFailed("undo's update-grub left our arguments in /boot/grub/grub.cfg")
        if self.sh(f"grep -q '{ADMIN_ARG}' /boot/grub/grub.cfg").returncode != 0:
            raise LabFailed("undo's update-grub lost the admin's argument")
        listing = self.sh("lsinitramfs /boot/initrd.img-$(uname -r)").stdout
        if "passthrough-vfio" in listing or "40-passthrough-vfio.rules" in listing:
            raise LabFailed("undo's update-initramfs left our files in the initramfs")

    def changed_since_baseline(self) -> tuple[list[str], dict[str, str]]:
        """What differs from the baseline: /etc byte for byte; /boot is regenerated by undo
        (update-grub, update-initramfs), never restored from a backup: the same files, without
        our arguments and modules. Also each file's checksum now."""
        now = self.sh(self.FILES).stdout
        before = dict(line.split("  ", 1)[::-1] for line in self.baseline.splitlines())
        after = dict(line.split("  ", 1)[::-1] for line in now.splitlines())
        differ = sorted(k for k in set(before) | set(after) if before.get(k) != after.get(k))
        differ = [d for d in differ if d.startswith("/etc/")]
        differ += sorted(k for k in set(before) ^ set(after) if k.startswith("/boot/"))
        return differ, after

    def back(self) -> dict[str, Any]:
        cmdline = self.sh("cat /proc/cmdline").stdout.strip()
        if "iommu=pt" in cmdline or "vfio" in cmdline:
            raise LabFailed(
                f"after undo and reboot the command line still has our arguments: {cmdline}"
            )
        if ADMIN_ARG not in cmdline.split():
            raise LabFailed(f"after undo and reboot the admin's argument is gone: {cmdline}")
        drivers = self.drivers(CARD_FUNCTIONS)
        if any(d == "vfio-pci" for d in drivers.values()):
            raise LabFailed(f"after undo and reboot: {drivers}")
        return {"drivers": drivers, "cmdline": cmdline}

    def _guarded(self, stages: Callable[[], dict[str, Any]]) -> dict[str, Any]:
        """Run the stages; keep the artifacts on failure; stop the machine in any case."""
        try:
            return stages()
        except Exception as exc:
            self.keep_artifacts()
            died = self.machine.exit_status() if self.machine is not None else None
            if died:  # the lab machine itself is gone: that is the news, not the symptom
                raise LabFailed(f"{exc} — the lab machine's QEMU exited, {died}") from exc
            raise
        finally:
            if self.machine is not None:
                self.machine.stop()

    def run_full(self, nested_break: bool = True) -> dict[str, Any]:
        """The whole chain; without ``nested_break`` the nested guest boots once, with the
        planner's layout (tests/lab/test_firmware_window.py boots the same kernel without it
        through OVMF, in seconds: CI's lab tier leaves the break here out)."""

        def stages() -> dict[str, Any]:
            def build() -> tuple[Path, Path]:
                key = self._key()
                return image.disk(self.work, (self.work / "id_lab.pub").read_text()), key

            disk, key = self.stage("image", build)
            self.stage(
                "boot (UEFI, GRUB from disk)",
                lambda: self.boot(disk, None, None, key, library=False),
            )
            host = self.stage(
                "provision host.yml (apply, Ansible reboot, verify)", self.provision_host
            )
            again = self.stage("provision host.yml again: 0 changed", self.provision_again)
            self.stage("verify", self.verify)
            guest = self.stage("guest under the lab host's libvirt (vm.yml)", self.guest)
            rendered = self.stage(
                "nested guest: initramfs, render with the planner", self.nested_prepare
            )
            planned = self.stage(
                "nested guest boots (planned layout), its view read",
                lambda: self.nested_alone(self.nested_planned, rendered),
            )
            unplanned = (
                self.stage(
                    "nested break: no window, 38 bits, BAR unassigned",
                    lambda: self.nested_alone(self.nested_break, rendered),
                )
                if nested_break
                else None
            )
            edit = self.stage(
                "admin edits /etc/default/grub after apply, update-grub", self.admin_edit
            )
            broken = self.stage(
                "break: companion override removed, reboot, verify fails", self.sabotage
            )
            admin = self.stage("admin's argument and ours in /proc/cmdline", self.admin_cmdline)
            self.stage("undo", self.undo)
            self.stage("reboot after undo", self.reboot)
            back = self.stage("back to the original", self.back)
            return {
                "ok": True,
                "accel": self.accel,
                "timings": self.timings,
                "provision_seconds": host["seconds"],
                "bare_host": host["bare"],
                "runtime": host["runtime"],
                "ansible_user": image.USER,
                "host_again": again,
                "guest": guest,
                "nested": planned,
                "nested_break": unplanned,
                "break": broken,
                "admin_edit": {
                    **admin,
                    "grub_cfg": edit["grub_cfg"],
                    "cmdline_after_undo": back["cmdline"],
                },
                "drivers_after_undo": back["drivers"],
            }

        return self._guarded(stages)

    def run(self) -> dict[str, Any]:
        def stages() -> dict[str, Any]:
            img, kernel, initrd, key = self.stage("image", self.build)
            self.stage("boot", lambda: self.boot(img, kernel, initrd, key))
            scan = self.stage("scan", self.scan)
            drivers = self.stage("bind", self.bind)
            return {
                "ok": True,
                "accel": self.accel,
                "timings": self.timings,
                "groups": scan["host"]["iommu"]["groups"],
                "drivers": drivers,
            }

        return self._guarded(stages)

    def keep_artifacts(self) -> None:
        self.artifacts.mkdir(parents=True, exist_ok=True)
        for name in ("console.log", "qemu-stderr.log"):
            if (self.work / name).exists():
                shutil.copy(self.work / name, self.artifacts / name)
        (self.artifacts / "commands.log").write_text("\n".join(self.log))
        for log in [*self.ansible_logs, *self.artifact_files]:
            if log.exists():
                shutil.copy(log, self.artifacts / log.name)
        self.say(f"[lab] artifacts kept in {self.artifacts}")


def parser(description: str | None) -> argparse.ArgumentParser:
    """The options every lab script takes."""
    ap = argparse.ArgumentParser(
        description=description, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument(
        "--keep", metavar="WORKDIR", help="work here and keep it (default: a temporary directory)"
    )
    ap.add_argument("--artifacts", default="lab-artifacts")
    ap.add_argument("--json", action="store_true")
    return ap


def lab_main(
    args: argparse.Namespace,
    name: str,
    run: Callable[[Path, Path, Callable[[str], None]], dict[str, Any]],
) -> int:
    """Run ``run(work, artifacts, say)`` in the work directory and report: its result as
    JSON, or one line with each stage's time."""
    work = Path(args.keep) if args.keep else Path(tempfile.mkdtemp(prefix="passthrough-lab-"))
    work.mkdir(parents=True, exist_ok=True)
    try:
        result = run(work, Path(args.artifacts), lambda m: print(m, file=sys.stderr))
    except (LabFailed, RuntimeError, TimeoutError) as exc:
        print(f"{name}: FAILED: {exc}", file=sys.stderr)
        return 1
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        total = sum(result["timings"].values())
        print(
            f"{name}: passed — "
            + ", ".join(f"{k} {v:.1f}s" for k, v in result["timings"].items())
            + f", total {total:.1f}s"
        )
    return 0


def main() -> int:
    ap = parser(__doc__)
    ap.add_argument(
        "--full",
        action="store_true",
        help="the whole chain: UEFI boot, provision (apply, reboot, verify), a guest, a "
        "deliberate break, undo, reboot",
    )
    ap.add_argument(
        "--no-nested-break",
        action="store_true",
        help="with --full: leave out the nested guest's second boot without the planner's "
        "layout (tests/lab/test_firmware_window.py makes that check without the lab host; "
        "CI's lab tier passes this)",
    )
    args = ap.parse_args()

    def run(work: Path, artifacts: Path, say: Callable[[str], None]) -> dict[str, Any]:
        lab = Lab(work, artifacts, say=say)
        return lab.run_full(not args.no_nested_break) if args.full else lab.run()

    return lab_main(args, "lab", run)


if __name__ == "__main__":
    raise SystemExit(main())
