# SPDX-License-Identifier: Apache-2.0
# Generated from passthrough/vm/options.py, the one table of guest options, by
# tests/test_options_ansible.py (pytest --regenerate-golden rewrites it): do not edit.
"""The passthrough_vm module's guest options as Ansible argument_spec entries, here so that
the module parses its arguments (and ansible-test reads them) without the package."""

from __future__ import annotations

import json
from typing import Any

GUEST_OPTIONS: dict[str, dict[str, Any]] = json.loads(
    r"""
{
  "name": {
    "type": "str",
    "required": true
  },
  "gpus": {
    "type": "list",
    "elements": "str",
    "default": []
  },
  "nvswitches": {
    "type": "list",
    "elements": "str",
    "default": []
  },
  "no_gpu": {
    "type": "bool",
    "default": false
  },
  "vcpus": {
    "type": "int",
    "default": 4
  },
  "memory_mib": {
    "type": "int",
    "default": 8192
  },
  "overcommit": {
    "type": "bool",
    "default": false
  },
  "disk": {
    "type": "str"
  },
  "base_image": {
    "type": "str"
  },
  "image_dir": {
    "type": "str",
    "default": "/var/lib/libvirt/images"
  },
  "bridge": {
    "type": "str"
  },
  "network": {
    "type": "str",
    "default": "default"
  },
  "seed": {
    "type": "str"
  },
  "cdrom": {
    "type": "str"
  },
  "driver_iso": {
    "type": "str"
  },
  "disk_bus": {
    "type": "str",
    "choices": [
      "virtio",
      "sata"
    ]
  },
  "secure_boot": {
    "type": "bool"
  },
  "tpm": {
    "type": "bool"
  },
  "usb_input": {
    "type": "bool"
  },
  "graphics": {
    "type": "str",
    "choices": [
      "vnc",
      "spice"
    ]
  },
  "headless": {
    "type": "bool",
    "default": false
  },
  "topology": {
    "type": "bool",
    "default": true
  },
  "profile": {
    "type": "str",
    "choices": [
      "linux",
      "windows"
    ],
    "default": "linux"
  },
  "hide": {
    "type": "bool",
    "default": true
  },
  "vendor_id": {
    "type": "str",
    "default": "passthrough"
  },
  "hide_hypervisor_cpuid": {
    "type": "bool",
    "default": false
  },
  "rom": {
    "type": "str",
    "default": "on"
  },
  "hugepages": {
    "type": "bool",
    "default": false
  },
  "numa_pin": {
    "type": "bool",
    "default": true
  },
  "iommufd": {
    "type": "bool",
    "default": false
  },
  "virt_type": {
    "type": "str",
    "choices": [
      "kvm",
      "qemu"
    ],
    "default": "kvm"
  }
}
"""
)
