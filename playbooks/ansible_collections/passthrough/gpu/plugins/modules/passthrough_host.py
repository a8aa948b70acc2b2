#!/usr/bin/python
# SPDX-License-Identifier: Apache-2.0
"""Ansible module: prepare a host for GPU passthrough through the passthrough library.

The plan logic exists once, in the library; this module only maps its Plan onto Ansible's
contract: check mode computes and shows the diff without writing, ``changed`` is true
only when the plan had actions, and ``reboot_required`` says whether a reboot is due.
"""

from __future__ import annotations

DOCUMENTATION = r"""
module: passthrough_host
short_description: Plan and apply (or undo) GPU passthrough host changes
description:
  - Kernel arguments through the bootloader in use, vfio-pci binding (modprobe.d softdeps,
    initramfs, per-device overrides), with backups, a journal and undo.
  - Needs the C(passthrough) Python package on the target.
options:
  root:
    description: Host root to act on (a chroot or image for tests)
    type: str
    default: /
  gpus:
    description: "PCI addresses or vendor:device IDs; empty means every viable NVIDIA GPU"
    type: list
    elements: str
    default: []
  nvswitches:
    description: >-
      NVSwitch PCI addresses, or all, bound with every GPU for a guest that owns the whole
      NVLink domain; empty leaves the NVSwitches to the host (shared-NVSwitch mode)
    type: list
    elements: str
    default: []
  include_group:
    description: "Take every device of the cards' IOMMU groups"
    type: bool
    default: false
  allow_boot_gpu:
    description: Allow the boot VGA
    type: bool
    default: false
  iommu_pt:
    description: Add iommu=pt
    type: bool
    default: true
  hugepages:
    description:
      - Number of 1 GiB huge pages to reserve at boot; 0 for none (what an earlier apply
        reserved goes); left out, what an earlier apply reserved is kept
        (C(passthrough plan --hugepages-1g))
    type: int
  release:
    description:
      - Cards an earlier apply bound that go back to the host; without them a new plan keeps
        every card an earlier apply bound (C(passthrough plan --release))
    type: list
    elements: str
    default: []
  iommu_only:
    description:
      - Only the kernel arguments that turn the IOMMU on, no card (the first step on a host
        whose IOMMU is off; its groups are known only after the reboot)
    type: bool
    default: false
  state:
    description: present applies the plan; absent undoes every applied change
    type: str
    choices: [present, absent]
    default: present
  preflight:
    description:
      - Readiness check ids (see C(passthrough check)) that must pass before anything is
        planned; one that fails stops the task with its summary and fix. Read, planned and
        reported in this one call.
    type: list
    elements: str
    default: []
  vgpu_layout:
    description:
      - "NVIDIA vGPU layout: each card's quoted PCI address mapped to C({TYPE-NAME: COUNT}), one
        type per card, as in C(passthrough vgpu apply --layout) (docs/vgpu.md). Applied through
        the journal; a card already holding it is left alone, one holding another layout is
        refused. With a layout and no O(gpus), no whole card is handed to vfio-pci."
      - "O(state=absent) takes every vGPU layout back with the other changes."
    type: raw
  vgpu_run_root_tools:
    description:
      - On a root other than "/", run the root's own C(sriov-manage) (a test root's stand-in)
        to enable or disable VFs; never needed on a real host
    type: bool
    default: false
extends_documentation_fragment: passthrough.gpu.runtime
author: passthrough developers (!UNKNOWN)
"""

EXAMPLES = r"""
- name: Hand two cards to vfio-pci with 16 one-GiB huge pages
  passthrough.gpu.passthrough_host:
    gpus: ["0000:18:00.0", "0000:19:00.0"]
    hugepages: 16
  register: host_plan

- name: Two L40S-12Q vGPUs on one card, four L40S-24Q on another
  passthrough.gpu.passthrough_host:
    vgpu_layout:
      "0000:41:00.0": {L40S-12Q: 2}
      "0000:c1:00.0": {L40S-24Q: 4}

- name: Undo every applied change
  passthrough.gpu.passthrough_host:
    state: absent
"""

RETURN = r"""
changed:
  description: whether anything was (or in check mode would be) changed
  returned: always
  type: bool
reboot_required:
  description: whether a reboot is needed for the change to take effect
  returned: success
  type: bool
plan:
  description: the plan as passthrough plan --json prints it
  returned: when state is present, save where a vgpu_layout is given and no gpus
  type: dict
functions:
  description:
    - "the card functions (PCI addresses) the change hands to vfio-pci (present) or gives back
      to the host (absent); a guest holding one of them is in the way of the reboot"
  returned: success
  type: list
  elements: str
pending:
  description:
    - "regeneration commands an earlier apply left pending (they failed, or were cut off) that
      this task runs again (or in check mode would), as C(passthrough apply) does: the plan is
      empty then, C(changed) and C(reboot_required) are true"
  returned: when state is present
  type: list
  elements: list
vgpu:
  description:
    - "each card of O(vgpu_layout): card, mode, type, count, the VFs (or mdev parents) holding its
      vGPUs, and state: unchanged (in place already), planned (check mode) or applied (with
      its transaction)"
  returned: when vgpu_layout is given
  type: list
  elements: dict
vgpu_transactions:
  description: the journal transactions the vGPU layout was applied in, one per card
  returned: when a vGPU layout was applied
  type: list
  elements: str
vgpu_undone:
  description: how many vGPU layouts O(state=absent) took back (or in check mode would)
  returned: when state is absent and a vGPU layout was applied
  type: int
codes:
  description: "on a safety-policy refusal, its codes (docs/discovery.md \"Safety policy\")"
  returned: failure
  type: list
  elements: str
exit_code:
  description: "on a refusal, the exit code C(passthrough) gives for it (docs/cli.md)"
  returned: failure
  type: int
"""

from typing import Any  # noqa: E402 (Ansible wants DOCUMENTATION first)

from ansible.module_utils.basic import AnsibleModule  # noqa: E402
from ansible_collections.passthrough.gpu.plugins.module_utils.host_options import (  # noqa: E402
    HOST_OPTIONS,
)
from ansible_collections.passthrough.gpu.plugins.module_utils.package import (  # noqa: E402
    RUNTIME_OPTION,
    package_errors,
)

# what the module adds to the host options of passthrough/plan/options.py
MODULE_OPTIONS: dict[str, dict[str, object]] = {
    "root": {"type": "str", "default": "/"},
    "state": {"type": "str", "choices": ["present", "absent"], "default": "present"},
    "preflight": {"type": "list", "elements": "str", "default": []},
    "vgpu_layout": {"type": "raw"},
    "vgpu_run_root_tools": {"type": "bool", "default": False},
}


def argument_spec() -> dict[str, dict[str, Any]]:
    """The module's options: the host options of the package's table (generated into the
    collection's module_utils, so no package is needed to read them), then its own."""
    return {**HOST_OPTIONS, **MODULE_OPTIONS, **RUNTIME_OPTION}


def main() -> None:
    # The collection's action checks the same argument_spec() on the controller and, under the
    # runtime venv, runs passthrough/hosttask.py instead of this module: a rule given only
    # here (mutually_exclusive, required_if, ...) would not hold there; put it in both.
    module = AnsibleModule(
        argument_spec=argument_spec(),
        supports_check_mode=True,
    )
    with package_errors(module):
        # the body is the library's, shared with the command the collection's action runs
        # under the host's runtime venv (passthrough/hosttask.py)
        from passthrough.hosttask import run

        params = {k: v for k, v in module.params.items() if k != "runtime"}
        result = run(params, module.check_mode)
        if result.get("failed"):
            module.fail_json(**result)
        module.exit_json(**result)


if __name__ == "__main__":
    main()
