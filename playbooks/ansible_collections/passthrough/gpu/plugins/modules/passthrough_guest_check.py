#!/usr/bin/python
# SPDX-License-Identifier: Apache-2.0
"""Ansible module: `passthrough guest check` inside a guest; never changes anything.

The guest has no passthrough package: the checks come from the collection's
plugins/module_utils/passthrough_guest (passthrough/guest in this repository links to it),
which Ansible packs into the module it sends (one implementation for the CLI and the module).
"""

from __future__ import annotations

DOCUMENTATION = r"""
module: passthrough_guest_check
short_description: Does this guest see its passed-through GPU, and is the stack above it wired?
description:
  - Checks the GPU's PCI functions, BARs, driver, device nodes, NVRM kernel log lines, nvidia-smi,
    a CUDA vector add, the container runtime, the CDI spec and Kubernetes, as `passthrough guest check`.
  - Fails when a check that applies fails; with I(stage=hardware) only the checks that need
    nothing installed (the GPU's functions and BARs) can fail it.
options:
  root:
    description: Guest root to read (/ or an unpacked capture)
    type: str
    default: /
  stage:
    description: hardware (before anything is installed) or all (after the driver and runtime)
    type: str
    choices: [hardware, all]
    default: all
  compute:
    description: Run the CUDA vector add (live root only)
    type: bool
    default: true
  commands:
    description: Replay recorded tool outputs from this directory instead of running the tools
    type: path
  node:
    description: Kubernetes node name of this guest (default its hostname)
    type: str
  labels:
    description: Labels the node must carry (name to value)
    type: dict
    default: {}
author: passthrough developers (!UNKNOWN)
"""

EXAMPLES = r"""
- name: The guest sees its GPU (before anything is installed)
  passthrough.gpu.passthrough_guest_check:
    stage: hardware
    compute: false

- name: The whole stack, with the node labels the role set
  passthrough.gpu.passthrough_guest_check:
    stage: all
    labels:
      nvidia.com/gpu.present: "true"

- name: A capture taken elsewhere, with the tools' recorded outputs
  passthrough.gpu.passthrough_guest_check:
    root: /srv/captures/h100-guest
    commands: /srv/captures/h100-guest/commands
    compute: false
"""

RETURN = r"""
checks:
  description: Every check with its id, level (PASS, WARN, FAIL, SKIP), summary and fix.
  returned: always
  type: list
  elements: dict
gpus:
  description: The NVIDIA functions the guest sees, with their guest addresses and BARs.
  returned: always
  type: list
  elements: dict
virtual_machine:
  description: Whether the root is a virtual machine, the hypervisor and the evidence.
  returned: always
  type: dict
failures:
  description: One line per failed check that counts at this stage, with its fix.
  returned: always
  type: list
  elements: str
"""

from ansible.module_utils.basic import AnsibleModule  # noqa: E402 (Ansible wants DOCUMENTATION first)
from ansible_collections.passthrough.gpu.plugins.module_utils.passthrough_guest.check import (  # noqa: E402
    HARDWARE_CHECKS,
    run_guest_checks,
)
from ansible_collections.passthrough.gpu.plugins.module_utils.passthrough_guest.report import (  # noqa: E402
    FAIL,
)
from ansible_collections.passthrough.gpu.plugins.module_utils.passthrough_guest.root import (  # noqa: E402
    GuestRoot,
)
from ansible_collections.passthrough.gpu.plugins.module_utils.passthrough_guest.runner import (  # noqa: E402
    BadRecording,
    runner_for,
)


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "root": {"type": "str", "default": "/"},
            "stage": {"type": "str", "default": "all", "choices": ["hardware", "all"]},
            "compute": {"type": "bool", "default": True},
            "commands": {"type": "path"},
            "node": {"type": "str"},
            "labels": {"type": "dict", "default": {}},
        },
        supports_check_mode=True,
    )
    p = module.params
    root = GuestRoot(p["root"])
    if not root.isdir("sys") and not root.isdir("proc"):
        module.fail_json(msg=f"root {p['root']}: not a guest root (no sys, no proc)")
    runner = runner_for(root.is_live, p["commands"])
    try:
        report = run_guest_checks(
            root, runner, compute=p["compute"], node=p["node"], labels=p["labels"]
        )
    except BadRecording as exc:
        module.fail_json(msg=f"commands {p['commands']}: {exc}")
    data = report.to_json()
    counted = [c for c in report.checks if p["stage"] == "all" or c.id in HARDWARE_CHECKS]
    failures = [f"{c.id}: {c.summary} (fix: {c.fix})" for c in counted if c.level == FAIL]
    result = {
        "changed": False,
        "checks": data["checks"],
        "gpus": data["gpus"],
        "virtual_machine": data["virtual_machine"],
        "failures": failures,
    }
    if failures:
        module.fail_json(msg="; ".join(failures), **result)
    module.exit_json(**result)


if __name__ == "__main__":
    main()
