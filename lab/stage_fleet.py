# SPDX-License-Identifier: Apache-2.0
"""The full chain's fleet stages: the lab host as an Ansible inventory, `passthrough provision`
of host.yml over SSH as the lab user (the runtime installed, apply, the Ansible reboot),
the same play again as a no-op, verify, and vm.yml's guest under the lab host's libvirt."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any
from xml.etree import ElementTree

import image
from labcore import CARD, CARD_FUNCTIONS, GUEST, NEGATIVE, NEGATIVE_PEER, VENV, LabCore, LabFailed


class FleetStages(LabCore):
    """provision (host.yml twice), verify, guest (vm.yml)."""

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
