#!/usr/bin/python
# SPDX-License-Identifier: Apache-2.0
"""Ansible module: render, validate and define/start a GPU guest through the passthrough library."""

from __future__ import annotations

DOCUMENTATION = r"""
module: passthrough_vm
short_description: Render, validate and define (and start) a GPU passthrough guest
description:
  - Renders the guest's domain XML from the host's facts, validates it (libvirt's schema and
    the passthrough policy), defines it and starts it.
  - An existing domain is compared with the rendered XML as far as the rendered XML speaks
    (what libvirt adds on its own, such as addresses, MACs and controllers, is left out);
    where it differs the module reports C(changed), shows the difference with C(--diff) and,
    outside check mode, redefines the domain (a running one takes the new definition at its
    next start).
  - The guest options are the ones C(passthrough render) takes; the module's argument_spec is
    generated from the same table (passthrough/vm/options.py) into the collection's
    module_utils, and this list is checked against it by the test suite.
  - Needs the C(passthrough) Python package on the target.
options:
  root:
    description: Host root whose facts shape the guest
    type: str
    default: /
  uri:
    description: libvirt connection URI
    type: str
    default: "qemu:///system"
  name:
    description: Domain name
    type: str
    required: true
  gpus:
    description: PCI addresses or vendor:device IDs of the cards; empty means every viable NVIDIA GPU
    type: list
    elements: str
    default: []
  nvswitches:
    description: >-
      NVSwitch PCI addresses, or all, with every GPU: a guest that owns the whole NVLink domain
      (Fabric Manager runs in it); a partial selection is refused
    type: list
    elements: str
    default: []
  no_gpu:
    description: A guest without a card, knowingly (no card to pass through is refused otherwise)
    type: bool
    default: false
  vcpus:
    description: "vCPUs (at most the host's logical CPUs)"
    type: int
    default: 4
  memory_mib:
    description: "Memory in MiB (at most the host's RAM unless overcommit)"
    type: int
    default: 8192
  overcommit:
    description: Allow more guest memory than the host has RAM
    type: bool
    default: false
  disk:
    description: An existing disk image
    type: str
  base_image:
    description: A cloud image to put a qcow2 overlay on
    type: str
  image_dir:
    description: Where the overlay goes
    type: str
    default: /var/lib/libvirt/images
  bridge:
    description: Host bridge
    type: str
  network:
    description: "libvirt network (\"none\" for no NIC)"
    type: str
    default: default
  seed:
    description: cloud-init seed ISO
    type: str
  profile:
    description: Guest OS profile
    type: str
    default: linux
    choices: [linux, windows]
  hide:
    description: Hide the hypervisor from the NVIDIA driver
    type: bool
    default: true
  vendor_id:
    description: Hyper-V vendor_id (1 to 12 characters)
    type: str
    default: passthrough
  hide_hypervisor_cpuid:
    description: Also clear the CPUID hypervisor bit (costs Windows its Hyper-V enlightenments)
    type: bool
    default: false
  rom:
    description: "The cards' option ROM: on, off or an absolute ROM file path"
    type: str
    default: "on"
  hugepages:
    description: Huge-page backed, locked memory
    type: bool
    default: false
  numa_pin:
    description: "Pin vCPUs and memory to the GPUs' NUMA node"
    type: bool
    default: true
  iommufd:
    description: >-
      The cards on iommufd (/dev/iommu and each function's /dev/vfio/devices/vfioN) instead of
      the legacy vfio container; refused where the host, QEMU or libvirt lacks it
    type: bool
    default: false
  virt_type:
    description: kvm, or qemu for software emulation (TCG) where /dev/kvm does not work
    type: str
    default: kvm
    choices: [kvm, qemu]
  cdrom:
    description: An installer ISO (absolute path), a SATA CD-ROM booted first, then the disk
    type: str
  driver_iso:
    description: A second CD-ROM (absolute path), virtio-win for a Windows guest's virtio disk
    type: str
  disk_bus:
    description: "The disk's bus; default: sata for Windows without driver_iso, else virtio"
    type: str
    choices: [virtio, sata]
  secure_boot:
    description: "Secure Boot with Microsoft keys enrolled; default: on for Windows, off for Linux"
    type: bool
  tpm:
    description: "An emulated TPM 2.0 (tpm-crb, swtpm); default: on for Windows, off for Linux"
    type: bool
  usb_input:
    description: "A USB tablet and keyboard; default: on for Windows, off for Linux"
    type: bool
  graphics:
    description: "A console on 127.0.0.1; default: vnc for Windows, none for Linux"
    type: str
    choices: [vnc, spice]
  headless:
    description: No graphical console (the serial console stays)
    type: bool
    default: false
  topology:
    description: One socket with the vCPUs as cores (threads as the host's SMT where they divide)
    type: bool
    default: true
  state:
    description: running, defined or absent
    type: str
    default: running
    choices: [running, defined, absent]
  require_handed_over:
    description: Refuse cards the host has not handed to vfio-pci (bound now or by its last apply)
    type: bool
    default: true
  existing_disk:
    description:
      - "With I(base_image), what to do when a file is already at the overlay's path (it may be
        a guest's disk holding its data, for example after C(state=absent)): C(refuse) fails
        with nothing changed, C(reuse) keeps it as it is, C(overwrite) replaces it with a new
        overlay (its data is lost). The result's C(disk.action) says which happened (created,
        reused or overwritten)."
    type: str
    default: refuse
    choices: [refuse, reuse, overwrite]
  planned_functions:
    description:
      - PCI functions the host plan of this run hands to vfio-pci (the passthrough_host result's
        plan.functions), counted as handed over; in check mode that plan was not applied.
    type: list
    elements: str
    default: []
extends_documentation_fragment: passthrough.gpu.runtime
author: passthrough developers (!UNKNOWN)
"""

EXAMPLES = r"""
- name: A Linux guest with two H100s, on an overlay of a cloud image
  passthrough.gpu.passthrough_vm:
    name: gpu-vm
    gpus: ["0000:18:00.0", "0000:19:00.0"]
    vcpus: 16
    memory_mib: 131072
    base_image: /var/lib/libvirt/images/debian-12-genericcloud-amd64.qcow2
    seed: /var/lib/libvirt/images/gpu-vm-seed.iso

- name: Render and validate only (nothing defined)
  passthrough.gpu.passthrough_vm:
    name: gpu-vm
    state: defined
  check_mode: true

- name: Remove the guest
  passthrough.gpu.passthrough_vm:
    name: gpu-vm
    state: absent
"""

RETURN = r"""
xml:
  description: the rendered domain XML
  returned: unless state is absent
  type: str
status:
  description: "the domain's state from libvirt (name, active, ...)"
  returned: unless state is absent
  type: dict
warnings_list:
  description: what the spec noted but did not refuse (NUMA, unchecked host facts)
  returned: unless state is absent
  type: list
  elements: str
disk:
  description: "with base_image, the overlay: path, base and action (created, reused, overwritten)"
  returned: when a new domain was defined on a base image
  type: dict
codes:
  description: "on a safety-policy refusal, its codes (docs/discovery.md \"Safety policy\")"
  returned: failure
  type: list
  elements: str
"""

from typing import Any  # noqa: E402 (Ansible wants DOCUMENTATION first)

from ansible.module_utils.basic import AnsibleModule  # noqa: E402
from ansible_collections.passthrough.gpu.plugins.module_utils.package import (  # noqa: E402
    RUNTIME_OPTION,
    package_errors,
)
from ansible_collections.passthrough.gpu.plugins.module_utils.vm_options import (  # noqa: E402
    GUEST_OPTIONS,
)

# what the module adds to the guest options of passthrough/vm/options.py
MODULE_OPTIONS: dict[str, dict[str, object]] = {
    "root": {"type": "str", "default": "/"},
    "uri": {"type": "str", "default": "qemu:///system"},
    "state": {"type": "str", "default": "running", "choices": ["running", "defined", "absent"]},
    "require_handed_over": {"type": "bool", "default": True},
    "planned_functions": {"type": "list", "elements": "str", "default": []},
    "existing_disk": {
        "type": "str",
        "default": "refuse",
        "choices": ["refuse", "reuse", "overwrite"],
    },
}


# how the module says what to do with a disk already at the overlay's path
CHOOSE = "existing_disk: reuse keeps it as it is, overwrite replaces it"


def argument_spec() -> dict[str, dict[str, Any]]:
    """The module's options: the guest options of the package's table (generated into the
    collection's module_utils, so no package is needed to read them), then its own."""
    return {**GUEST_OPTIONS, **MODULE_OPTIONS, **RUNTIME_OPTION}


def _absent(module: AnsibleModule, dom: Any) -> None:
    from passthrough.vm import libvirt_ops as lv

    p = module.params
    if dom is not None and not module.check_mode:
        if dom.isActive():
            lv.stop(p["uri"], p["name"], force=True)
        lv.undefine(p["uri"], p["name"])
    module.exit_json(changed=dom is not None)


def _rendered(module: AnsibleModule) -> tuple[str, Any]:
    """The guest's XML from the host's facts, validated; (xml, spec). Fails the module on a
    card not handed over or on a validation error."""
    from passthrough.host.discover import discover
    from passthrough.vm.render import render
    from passthrough.vm.spec import VmOptions, build_spec
    from passthrough.vm.validate import validate_text

    p = module.params
    host = discover(p["root"])
    # the module's options carry VmOptions' names: every one of them maps straight across
    known = VmOptions.__dataclass_fields__
    opts = VmOptions(
        **{k: v for k, v in p.items() if k in known and k not in ("gpus", "nvswitches")},
        gpus=tuple(p["gpus"]),
        nvswitches=tuple(p["nvswitches"]),
    )
    spec = build_spec(host, opts)
    if p["require_handed_over"]:
        from passthrough.host.modalias import is_vfio
        from passthrough.host.root import HostRoot
        from passthrough.journal.applied import last_applied

        record = last_applied(HostRoot(p["root"]))
        planned = set(record.functions if record else ()) | set(p["planned_functions"])
        drivers = {str(f.address): f.driver for f in host.functions}
        for card in spec.cards:
            for fn in card.functions:
                addr = str(fn.host)
                if not is_vfio(drivers.get(addr)) and addr not in planned:
                    module.fail_json(
                        msg=f"{p['name']}: {addr} is not handed over to vfio-pci (or a variant) on this host "
                        "(run host.yml for it first, or list it in passthrough_gpus)"
                    )
    xml = render(spec)
    errors = [f for f in validate_text(xml.encode(), p["name"], host) if f.severity == "error"]
    if errors:
        module.fail_json(msg="; ".join(f.text() for f in errors))
    return xml, spec


def _run(module: AnsibleModule, conn: Any) -> None:
    """The domain brought to the wanted state: defined as rendered (redefined where the
    existing one differs, with the difference as the diff) and, for running, started."""
    import libvirt
    from ansible_collections.passthrough.gpu.plugins.module_utils.domain import (
        compare,
        inactive_xml,
        lookup,
        with_uuid,
    )

    from passthrough.vm import libvirt_ops as lv
    from passthrough.vm.disk import ExistingDisk, decide

    p = module.params
    dom = lookup(conn, p["name"])
    if p["state"] == "absent":
        _absent(module, dom)
        return
    xml, spec = _rendered(module)
    warnings = list(spec.warnings)
    before, after = compare(inactive_xml(dom), xml) if dom is not None else ("", xml)
    differs = before != after
    active = dom is not None and bool(dom.isActive())
    starting = p["state"] == "running" and not active
    changed = differs or starting
    diff = {}
    if differs:
        diff = {
            "before": before,
            "after": after,
            "before_header": f"domain {p['name']} (libvirt)",
            "after_header": f"domain {p['name']} (rendered)",
        }
    if differs and active:
        warnings.append(f"{p['name']} is running: its new definition applies from its next start")
    overlay = (spec.base_image, spec.overlay) if spec.base_image and spec.overlay else None
    if module.check_mode or not changed:
        status = lv.status(p["uri"], p["name"]) if dom is not None else {}
        disk = {}
        if dom is None and overlay is not None:  # what defining would do with the disk
            action = decide(*overlay, ExistingDisk(p["existing_disk"]), CHOOSE)
            disk = {"disk": {"path": overlay[1], "base": overlay[0], "action": action}}
        module.exit_json(
            changed=changed, xml=xml, warnings_list=warnings, diff=diff, status=status, **disk
        )
    if dom is None:
        status = lv.define(
            p["uri"],
            xml,
            p["name"],
            overlay,
            start_it=p["state"] == "running",
            existing=ExistingDisk(p["existing_disk"]),
            choose=CHOOSE,
        )
    else:
        if differs:
            try:
                conn.defineXML(with_uuid(xml, dom.UUIDString()))
            except libvirt.libvirtError as exc:
                raise lv.LibvirtError(
                    f"{p['uri']} refused the new definition of {p['name']}: "
                    f"{exc.get_error_message()}"
                ) from None
        if starting:
            lv.start(p["uri"], p["name"])
        status = lv.status(p["uri"], p["name"])
    disk = {"disk": status.pop("disk")} if "disk" in status else {}
    module.exit_json(
        changed=True, xml=xml, status=status, diff=diff, warnings_list=warnings, **disk
    )


def main() -> None:
    spec_args = argument_spec()
    module = AnsibleModule(argument_spec=spec_args, supports_check_mode=True)
    with package_errors(module):
        # the binding first: where it is missing, package_errors names the distro's package
        # that provides it (the runtime's venv sees the system's site packages)
        import libvirt  # noqa: F401

        from passthrough.vm import libvirt_ops as lv

        p = module.params
        conn = lv.connect(p["uri"])
        try:
            _run(module, conn)
        finally:
            conn.close()


if __name__ == "__main__":
    main()
