# SPDX-License-Identifier: Apache-2.0
"""The XML namespaces of a libvirt domain, named in one place.

Small and import-free on purpose: validate imports it, and validate's start-up time matters
in CI (render pulls in Jinja2, the planner its tables)."""

from __future__ import annotations

# render's <passthrough:policy> marker under <metadata> (a rendered domain says so itself)
POLICY_NS = "https://passthrough.dev/xmlns/policy/1"
# libvirt's QEMU extension: <qemu:commandline> with <qemu:arg value='...'/>
QEMU_NS = "http://libvirt.org/schemas/domain/qemu/1.0"

# The prefixes a field's path may use (``metadata/policy:policy``, ``qemu:commandline``).
NSMAP = {"passthrough": POLICY_NS, "policy": POLICY_NS, "qemu": QEMU_NS}
