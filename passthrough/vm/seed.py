# SPDX-License-Identifier: Apache-2.0
"""A cloud-init NoCloud seed: an ISO 9660 image labelled ``cidata`` holding ``user-data``
and ``meta-data``, so the guest comes up with a user and an SSH key Ansible can use.

Every value is checked before anything is written (hostname, user, key lines, where the
ISO goes), and both files are written as JSON (valid YAML) so no value can add a key.
"""

from __future__ import annotations

import base64
import binascii
import io
import json
import os
import re
import struct

from passthrough.errors import PassthroughError
from passthrough.inputs import Unreadable, read_text

USER_RE = re.compile(r"^[a-z_][a-z0-9_-]{0,31}$")
# RFC 1123: dot-separated labels of letters, digits and '-', 1 to 63 each, no '-' at either
# end; 253 characters in all
LABEL_RE = re.compile(r"^[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?$")
KEY_TYPE_RE = re.compile(r"^(ssh-(rsa|ed25519|dss)|ecdsa-sha2-nistp(256|384|521)|sk-[a-z0-9@.-]+)$")


class BadSeed(PassthroughError):
    def __init__(self, field_name: str, why: str) -> None:
        super().__init__(f"{field_name}: {why}")
        self.field = field_name


def _show(text: str) -> str:
    shown = repr(text)
    return shown if len(shown) <= 60 else shown[:57] + "..."


def check_hostname(hostname: str) -> None:
    labels = hostname.split(".")
    if not hostname or len(hostname) > 253 or not all(LABEL_RE.fullmatch(x) for x in labels):
        raise BadSeed(
            "--hostname",
            f"{_show(hostname)} is not a host name (dot-separated labels of letters, digits "
            "and '-', 1 to 63 each)",
        )


def check_user(user: str) -> None:
    if not USER_RE.fullmatch(user):
        raise BadSeed("--user", f"{_show(user)} is not a valid Linux user name")


def check_key_line(line: str, where: str) -> None:
    """``TYPE BASE64 [COMMENT]`` whose base64 really is a key of that type (its blob starts
    with the type's name)."""
    if "PRIVATE KEY" in line:
        raise BadSeed(where, "this is a private key: give the .pub file")
    kind, _, rest = line.partition(" ")
    blob_text, _, comment = rest.partition(" ")
    if not KEY_TYPE_RE.fullmatch(kind) or any(ord(c) < 0x20 or ord(c) == 0x7F for c in comment):
        raise BadSeed(where, f"{_show(line)} is not an OpenSSH public key line")
    try:
        blob = base64.b64decode(blob_text, validate=True)
        (size,) = struct.unpack(">I", blob[:4])
        named = blob[4 : 4 + size].decode("ascii")
    except (binascii.Error, struct.error, UnicodeDecodeError):
        named = ""
    if named != kind:
        raise BadSeed(where, f"{_show(line)}: the key data is not a {kind} key")


def read_keys(key_file: str) -> list[str]:
    where = f"--ssh-key {key_file}"
    try:
        text = read_text(key_file, "a public key file")
    except Unreadable as exc:
        raise BadSeed(where, str(exc)) from None
    keys = [line.strip() for line in text.splitlines() if line.strip()]
    keys = [k for k in keys if not k.startswith("#")]
    if not keys:
        raise BadSeed(where, "no public key in it")
    for number, key in enumerate(keys, 1):
        check_key_line(key, f"{where} (key {number})")
    return keys


def check_output(path: str) -> None:
    """The ISO goes into an existing directory, as a file (never over a directory)."""
    parent = os.path.dirname(os.path.abspath(path))
    if os.path.isdir(path):
        raise BadSeed("--output", f"{path} is a directory")
    if not os.path.isdir(parent):
        raise BadSeed("--output", f"{parent} is not an existing directory")


def user_data(user: str, keys: list[str], hostname: str) -> str:
    check_user(user)
    check_hostname(hostname)
    for number, key in enumerate(keys, 1):
        check_key_line(key, f"--ssh-key (key {number})")
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


def meta_data(hostname: str) -> str:
    check_hostname(hostname)
    return json.dumps({"instance-id": hostname, "local-hostname": hostname}, indent=2) + "\n"


def write_seed(path: str, hostname: str, user: str, key_file: str) -> None:
    import pycdlib

    check_hostname(hostname)
    check_user(user)
    check_output(path)
    keys = read_keys(key_file)
    files = {
        "user-data": user_data(user, keys, hostname).encode(),
        "meta-data": meta_data(hostname).encode(),
    }
    iso = pycdlib.PyCdlib()
    iso.new(interchange_level=3, joliet=3, rock_ridge="1.09", vol_ident="cidata")
    for name, data in files.items():
        short = name.replace("-", "").upper()[:8] + ".;1"
        iso.add_fp(io.BytesIO(data), len(data), f"/{short}", rr_name=name, joliet_path=f"/{name}")
    tmp = f"{path}.tmp"
    try:
        iso.write(tmp)
        os.replace(tmp, path)
    finally:
        iso.close()
        if os.path.exists(tmp):
            os.unlink(tmp)
