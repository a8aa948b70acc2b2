# SPDX-License-Identifier: Apache-2.0
# Generated from passthrough/plan/options.py, the one table of host options, by
# tests/test_options_ansible.py (pytest --regenerate-golden rewrites it): do not edit.
"""The passthrough_host module's host options as Ansible argument_spec entries, here so that
the module parses its arguments (and ansible-test reads them) without the package."""

from __future__ import annotations

import json
from typing import Any

HOST_OPTIONS: dict[str, dict[str, Any]] = json.loads(
    r"""
{
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
  "include_group": {
    "type": "bool",
    "default": false
  },
  "allow_boot_gpu": {
    "type": "bool",
    "default": false
  },
  "release": {
    "type": "list",
    "elements": "str",
    "default": []
  },
  "iommu_only": {
    "type": "bool",
    "default": false
  },
  "iommu_pt": {
    "type": "bool",
    "default": true
  },
  "hugepages": {
    "type": "int",
    "default": null
  }
}
"""
)
