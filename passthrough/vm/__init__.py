# SPDX-License-Identifier: Apache-2.0
"""Guests: spec, domain XML, validation, libvirt."""
