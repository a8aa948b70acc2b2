# SPDX-License-Identifier: Apache-2.0
"""NVIDIA vGPU on a host: each card's mode read from sysfs (discover), a layout planned by
type name (plan), applied and taken back through the journal (apply), re-applied at boot
(unit), and handed to guests (hostdev)."""
