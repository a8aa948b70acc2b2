#!/usr/bin/python
# SPDX-License-Identifier: Apache-2.0
"""Ansible module: the KubeVirt node preflight (passthrough kubevirt preflight) as facts."""

from __future__ import annotations

DOCUMENTATION = r"""
module: passthrough_kubevirt_preflight
short_description: May this node be labelled for GPU passthrough VMs?
description:
  - The checks of C(passthrough kubevirt preflight) on a Kubernetes node that is to run KubeVirt
    VMs with whole GPUs; every function of each card on vfio-pci (or on no driver), the
    cards' IOMMU groups viable under the same policy as C(passthrough plan), the large-BAR fit
    of a KubeVirt guest. Changes nothing.
  - I(labels) holds the node label to set (C(nvidia.com/gpu.workload.config=vm-passthrough)) only
    when every check passed, so a task that applies I(labels) labels passing nodes only.
  - Needs the C(passthrough) Python package on the target.
options:
  root:
    description: Host root to read
    type: str
    default: /
  gpus:
    description: PCI addresses or vendor:device IDs of the cards; empty takes every NVIDIA GPU
    type: list
    elements: str
    default: []
  nvswitches:
    description:
      - NVSwitch PCI addresses, or C(all), that a VM owning the whole NVLink domain takes with
        every GPU (the CLI's C(--nvswitch)); they are checked as cards too. A partial
        selection fails the task, naming it. Empty leaves the NVSwitches to the host.
    type: list
    elements: str
    default: []
  memory:
    description: Guest memory the large-BAR fit assumes (MiB, or with a G/M suffix)
    type: str
    default: 8G
author: passthrough developers (!UNKNOWN)
"""

EXAMPLES = r"""
- name: Preflight of this node
  passthrough.gpu.passthrough_kubevirt_preflight:
  register: preflight

- name: Label the node only when it passed
  kubernetes.core.k8s:
    state: patched
    definition:
      apiVersion: v1
      kind: Node
      metadata:
        name: "{{ inventory_hostname }}"
        labels: "{{ preflight.labels }}"
  delegate_to: localhost
  when: preflight.labels | length > 0
"""

RETURN = r"""
ok:
  description: whether every check passed
  returned: always
  type: bool
labels:
  description: the node labels to set; empty unless every check passed
  returned: always
  type: dict
checks:
  description: every check with its id (a code), level (PASS, WARN, FAIL), summary and fix
  returned: always
  type: list
  elements: dict
failures:
  description: one line per failed check
  returned: always
  type: list
  elements: str
"""

from ansible.module_utils.basic import AnsibleModule  # noqa: E402 (Ansible wants DOCUMENTATION first)
from ansible_collections.passthrough.gpu.plugins.module_utils.package import package_errors  # noqa: E402


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "root": {"type": "str", "default": "/"},
            "gpus": {"type": "list", "elements": "str", "default": []},
            "nvswitches": {"type": "list", "elements": "str", "default": []},
            "memory": {"type": "str", "default": "8G"},
        },
        supports_check_mode=True,
    )
    with package_errors(module):
        from passthrough.host.discover import discover
        from passthrough.kube.preflight import preflight
        from passthrough.vm.options import size_mib

        memory = size_mib(module.params["memory"], "memory")
        report = preflight(
            discover(module.params["root"]),
            tuple(module.params["gpus"]),
            memory,
            nvswitches=tuple(module.params["nvswitches"]),
        )
        data = report.as_json()
        module.exit_json(
            changed=False,
            ok=data["ok"],
            labels=data["labels"],
            checks=data["checks"],
            failures=[f"{c['id']}: {c['summary']}" for c in data["checks"] if c["level"] == "FAIL"],
        )


if __name__ == "__main__":
    main()
