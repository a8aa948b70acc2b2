#!/usr/bin/python
"""Ansible module: render, validate and define/start a GPU guest through the passthrough library."""

from __future__ import annotations

DOCUMENTATION = r"""
module: passthrough_vm
short_description: Render, validate and define (and start) a GPU passthrough guest
options:
  root: {description: Host root whose facts shape the guest, type: str, default: /}
  uri: {description: libvirt connection URI, type: str, default: "qemu:///system"}
  name: {description: Domain name, type: str, required: true}
  vcpus: {description: vCPUs, type: int, default: 4}
  memory_mib: {description: Memory in MiB, type: int, default: 8192}
  gpus: {description: PCI addresses of the cards, type: list, elements: str, default: []}
  disk: {description: An existing disk image, type: str}
  base_image: {description: A cloud image to put a qcow2 overlay on, type: str}
  image_dir: {description: Where the overlay goes, type: str, default: /var/lib/libvirt/images}
  bridge: {description: Host bridge, type: str}
  network: {description: 'libvirt network ("none" for no NIC)', type: str, default: default}
  seed: {description: cloud-init seed ISO, type: str}
  profile: {description: linux or windows, type: str, default: linux, choices: [linux, windows]}
  hide: {description: Hide the hypervisor from the NVIDIA driver, type: bool, default: true}
  vendor_id: {description: Hyper-V vendor_id, type: str, default: passthrough}
  rom: {description: on, off or a ROM file, type: str, default: "on"}
  hugepages: {description: Huge-page backed, locked memory, type: bool, default: false}
  state: {description: running, defined or absent, type: str, default: running, choices: [running, defined, absent]}
  virt_type: {description: "kvm, or qemu for software emulation (TCG) where /dev/kvm does not work", type: str, default: kvm, choices: [kvm, qemu]}
  require_handed_over: {description: Refuse cards the host has not handed to vfio-pci (bound now or by its last apply), type: bool, default: true}
author: passthrough developers
"""

from ansible.module_utils.basic import AnsibleModule  # noqa: E402 (Ansible wants DOCUMENTATION first)


def main() -> None:
    spec_args = {
        "root": {"type": "str", "default": "/"},
        "uri": {"type": "str", "default": "qemu:///system"},
        "name": {"type": "str", "required": True},
        "vcpus": {"type": "int", "default": 4},
        "memory_mib": {"type": "int", "default": 8192},
        "gpus": {"type": "list", "elements": "str", "default": []},
        "disk": {"type": "str"},
        "base_image": {"type": "str"},
        "image_dir": {"type": "str", "default": "/var/lib/libvirt/images"},
        "bridge": {"type": "str"},
        "network": {"type": "str", "default": "default"},
        "seed": {"type": "str"},
        "profile": {"type": "str", "default": "linux", "choices": ["linux", "windows"]},
        "hide": {"type": "bool", "default": True},
        "vendor_id": {"type": "str", "default": "passthrough"},
        "rom": {"type": "str", "default": "on"},
        "hugepages": {"type": "bool", "default": False},
        "state": {"type": "str", "default": "running", "choices": ["running", "defined", "absent"]},
        "virt_type": {"type": "str", "default": "kvm", "choices": ["kvm", "qemu"]},
        "require_handed_over": {"type": "bool", "default": True},
    }
    module = AnsibleModule(argument_spec=spec_args, supports_check_mode=True)
    try:
        from passthrough.errors import PassthroughError
        from passthrough.host.discover import discover
        from passthrough.vm import libvirt_ops as lv
        from passthrough.vm.render import render
        from passthrough.vm.spec import VmOptions, build_spec
        from passthrough.vm.validate import validate_text
    except ImportError as exc:
        module.fail_json(
            msg=f"the passthrough Python package is not installed on the target ({exc})"
        )
        return
    p = module.params
    try:
        exists = True
        try:
            current = lv.status(p["uri"], p["name"])
        except lv.LibvirtError as exc:
            if "no domain" not in str(exc):
                raise
            exists, current = False, {}
        if p["state"] == "absent":
            if exists and not module.check_mode:
                if current.get("active"):
                    lv.stop(p["uri"], p["name"], force=True)
                lv.undefine(p["uri"], p["name"])
            module.exit_json(changed=exists)
        host = discover(p["root"])
        # the module's options carry VmOptions' names: every one of them maps straight across
        known = VmOptions.__dataclass_fields__
        opts = VmOptions(
            **{k: v for k, v in p.items() if k in known and k != "gpus"}, gpus=tuple(p["gpus"])
        )
        spec = build_spec(host, opts)
        if p["require_handed_over"]:
            from passthrough.apply import last_applied
            from passthrough.host.root import HostRoot

            tx = last_applied(HostRoot(p["root"])) or {}
            planned = set(tx.get("functions", []))
            drivers = {str(f.address): f.driver for f in host.functions}
            for card in spec.cards:
                for fn in card.functions:
                    addr = str(fn.host)
                    if drivers.get(addr) != "vfio-pci" and addr not in planned:
                        module.fail_json(
                            msg=f"{p['name']}: {addr} is not handed over to vfio-pci on this host "
                            "(run host.yml for it first, or list it in passthrough_gpus)"
                        )
                        return
        xml = render(spec)
        errors = [f for f in validate_text(xml.encode(), p["name"], host) if f.severity == "error"]
        if errors:
            module.fail_json(msg="; ".join(f.text() for f in errors))
        changed = not exists or (p["state"] == "running" and not current.get("active"))
        diff = (
            {"before": "", "after": xml, "after_header": f"domain {p['name']}"}
            if not exists
            else {}
        )
        if module.check_mode or not changed:
            module.exit_json(
                changed=changed,
                xml=xml,
                warnings_list=list(spec.warnings),
                diff=diff,
                status=current,
            )
        if not exists:
            overlay = (spec.base_image, spec.overlay) if spec.base_image and spec.overlay else None
            status = lv.define(p["uri"], xml, p["name"], overlay, start_it=p["state"] == "running")
        else:
            lv.start(p["uri"], p["name"])
            status = lv.status(p["uri"], p["name"])
        module.exit_json(
            changed=True, xml=xml, status=status, diff=diff, warnings_list=list(spec.warnings)
        )
    except PassthroughError as exc:
        # a safety-policy refusal carries its codes (README "Safety policy") for tools
        module.fail_json(msg=str(exc), codes=list(getattr(exc, "codes", ())))


if __name__ == "__main__":
    main()
