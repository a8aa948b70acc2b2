"""A cloud-init NoCloud seed: an ISO 9660 image labelled ``cidata`` holding ``user-data``
and ``meta-data``, so the guest comes up with a user and an SSH key Ansible can use."""

from __future__ import annotations

import io
import json
import os
import re

from passthrough.errors import PassthroughError

USER_RE = re.compile(r"^[a-z_][a-z0-9_-]{0,31}$")
KEY_RE = re.compile(
    r"^(ssh-(rsa|ed25519|dss)|ecdsa-sha2-nistp(256|384|521)|sk-[a-z0-9@.-]+) [A-Za-z0-9+/=]+( [^\n]*)?$"
)


class BadSeed(PassthroughError):
    pass


def user_data(user: str, keys: list[str], hostname: str) -> str:
    if not USER_RE.match(user):
        raise BadSeed(f"user {user!r}: not a valid Linux user name")
    for key in keys:
        if not KEY_RE.match(key):
            raise BadSeed(f"ssh key {key[:30]!r}...: not an OpenSSH public key line")
    # JSON is valid YAML: no quoting surprises whatever the key comment holds.
    doc = {
        "hostname": hostname,
        "users": [
            {
                "name": user,
                "sudo": "ALL=(ALL) NOPASSWD:ALL",
                "shell": "/bin/bash",
                "lock_passwd": True,
                "ssh_authorized_keys": keys,
            }
        ],
        "ssh_pwauth": False,
        "package_update": False,
    }
    return "#cloud-config\n" + json.dumps(doc, indent=2) + "\n"


def write_seed(path: str, hostname: str, user: str, key_file: str) -> None:
    import pycdlib

    try:
        with open(key_file) as fh:
            keys = [line.strip() for line in fh if line.strip() and not line.startswith("#")]
    except OSError as exc:
        raise BadSeed(f"--ssh-key {key_file}: {exc.strerror}") from None
    if not keys:
        raise BadSeed(f"--ssh-key {key_file}: no public key in it")
    files = {
        "user-data": user_data(user, keys, hostname).encode(),
        "meta-data": f"instance-id: {hostname}\nlocal-hostname: {hostname}\n".encode(),
    }
    iso = pycdlib.PyCdlib()
    iso.new(interchange_level=3, joliet=3, rock_ridge="1.09", vol_ident="cidata")
    for name, data in files.items():
        short = name.replace("-", "").upper()[:8] + ".;1"
        iso.add_fp(io.BytesIO(data), len(data), f"/{short}", rr_name=name, joliet_path=f"/{name}")
    tmp = f"{path}.tmp"
    iso.write(tmp)
    iso.close()
    os.replace(tmp, path)
