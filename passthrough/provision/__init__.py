"""Provisioning a fleet: the Ansible playbooks driven through ansible-runner (runner.py)."""
