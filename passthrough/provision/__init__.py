# SPDX-License-Identifier: Apache-2.0
"""Provisioning a fleet: the Ansible playbooks driven through ansible-runner (runner.py)."""
