# SPDX-License-Identifier: Apache-2.0
"""Which Microsoft Secure Boot CAs a firmware variable store holds, read from its EFI
signature lists — standard library only (``guest check`` runs in a guest without pip).

Two sources: an OVMF variable store file (the ``nvram-template`` of a firmware descriptor,
or a domain's NVRAM), whose authenticated variables ``db`` and ``KEK`` hold the lists; and
a running system's efivarfs (``/sys/firmware/efi/efivars/db-<guid>``: four bytes of
attributes, then the lists). Each list of type EFI_CERT_X509_GUID holds DER certificates;
the subject's common name is read with a small DER walk (UEFI 2.10 §32.4.1 for the lists,
ITU-T X.690 for DER, RFC 5280 §4.1 for the certificate).

The facts about the CAs (Microsoft's "Windows Secure Boot certificate expiration and CA
updates", 2024-2026): the 2011 CAs expire in 2026 (the KEK CA 2011 and UEFI CA 2011 in June,
the Windows Production PCA 2011 in October); boot media and option ROMs signed since are
signed under the 2023 CAs, which a store holding only the 2011 ones does not trust.
"""

from __future__ import annotations

import struct
import uuid
from dataclasses import dataclass
from typing import Protocol

from .report import PASS, SKIP, WARN, GuestCheck

X509_GUID = uuid.UUID("a5c059a1-94e4-4aa7-87b5-ab155c2bf072")
GLOBAL_GUID = uuid.UUID("8be4df61-93ca-11d2-aa0d-00e098032b8c")  # PK, KEK
IMAGE_SECURITY_GUID = uuid.UUID("d719b2cb-3d3a-4596-a3bc-dad00e67656f")  # db, dbx
VARIABLE_START = 0x55AA
VAR_ADDED = 0x3F
AUTH_HEADER = struct.Struct("<HBBIQ16sIII16s")  # edk2's AUTHENTICATED_VARIABLE_HEADER
LIST_HEADER = struct.Struct("<16sIII")  # EFI_SIGNATURE_LIST
COMMON_NAME = bytes([0x06, 0x03, 0x55, 0x04, 0x03])  # OID 2.5.4.3

# subject CN → (year, what it signs)
MICROSOFT_CAS = {
    "Microsoft Corporation KEK CA 2011": (2011, "KEK: signs db and dbx updates"),
    "Microsoft Windows Production PCA 2011": (2011, "db: Windows boot manager"),
    "Microsoft Corporation UEFI CA 2011": (2011, "db: third-party loaders and option ROMs"),
    "Microsoft Corporation KEK 2K CA 2023": (2023, "KEK: signs db and dbx updates"),
    "Windows UEFI CA 2023": (2023, "db: Windows boot manager"),
    "Microsoft UEFI CA 2023": (2023, "db: third-party loaders"),
    "Microsoft Option ROM UEFI CA 2023": (2023, "db: option ROMs (GPU firmware)"),
}


@dataclass(frozen=True)
class StoreCas:
    """The certificates' subjects of ``db`` and ``KEK`` (None: the variable is absent)."""

    db: tuple[str, ...] | None
    kek: tuple[str, ...] | None

    @property
    def microsoft(self) -> dict[str, int]:
        """The Microsoft CAs held, by subject, with their year."""
        names = (self.db or ()) + (self.kek or ())
        return {n: MICROSOFT_CAS[n][0] for n in names if n in MICROSOFT_CAS}

    @property
    def only_2011(self) -> bool:
        """Microsoft's 2011 CAs and none of 2023: media signed since 2024 will not boot."""
        years = set(self.microsoft.values())
        return 2011 in years and 2023 not in years

    def summary(self) -> str:
        held = self.microsoft
        if not held:
            return "no Microsoft CA in db or KEK"
        return "; ".join(f"{n} ({MICROSOFT_CAS[n][1]})" for n in sorted(held))


def _der(data: bytes, pos: int) -> tuple[int, int, int]:
    """(tag, start of content, end of content) of the DER element at ``pos``."""
    if pos + 2 > len(data):
        raise ValueError("truncated DER")
    tag, first = data[pos], data[pos + 1]
    pos += 2
    if first < 0x80:
        length = first
    else:
        count = first & 0x7F
        if not 0 < count <= 4 or pos + count > len(data):
            raise ValueError("bad DER length")
        length = int.from_bytes(data[pos : pos + count], "big")
        pos += count
    if pos + length > len(data):
        raise ValueError("DER element past its end")
    return tag, pos, pos + length


def _children(data: bytes, start: int, end: int) -> list[tuple[int, int, int]]:
    out = []
    pos = start
    while pos < end:
        tag, s, e = _der(data, pos)
        out.append((tag, s, e))
        pos = e
    return out


def subject_cn(cert: bytes) -> str | None:
    """The common name of an X.509 certificate's subject; None where it has none."""
    try:
        _tag, s, e = _der(cert, 0)
        _tbs, ts, te = _children(cert, s, e)[0]  # tbsCertificate
        fields = _children(cert, ts, te)
        if fields and fields[0][0] == 0xA0:  # [0] version
            fields = fields[1:]
        # serialNumber, signature, issuer, validity, subject
        _subject, ns, ne = fields[4]
        for _rdn, rs, re_ in _children(cert, ns, ne):  # RelativeDistinguishedName (SET)
            for _atv, as_, ae in _children(cert, rs, re_):  # AttributeTypeAndValue
                parts = _children(cert, as_, ae)
                oid = cert[parts[0][1] - 2 : parts[0][2]]
                if oid == COMMON_NAME:
                    _value, vs, ve = parts[1]
                    return cert[vs:ve].decode("utf-8", errors="replace")
    except (ValueError, IndexError):
        return None
    return None


def signature_lists(data: bytes) -> tuple[str, ...]:
    """The subjects of the X.509 certificates in concatenated EFI signature lists (other
    types, hashes in dbx, are passed over)."""
    names: list[str] = []
    pos = 0
    while pos + LIST_HEADER.size <= len(data):
        kind, size, header, sig_size = LIST_HEADER.unpack_from(data, pos)
        if size < LIST_HEADER.size + header or pos + size > len(data):
            break  # not a list: what follows is not ours to read
        body = pos + LIST_HEADER.size + header
        if uuid.UUID(bytes_le=kind) == X509_GUID and sig_size > 16:
            for entry in range(body, pos + size - sig_size + 1, sig_size):
                name = subject_cn(data[entry + 16 : entry + sig_size])  # owner GUID first
                names.append(name or "(a certificate without a common name)")
        pos += size
    return tuple(names)


def variables(store: bytes) -> dict[tuple[str, uuid.UUID], bytes]:
    """The added authenticated variables of an edk2 variable store file (OVMF_VARS), by
    (name, vendor GUID)."""
    found: dict[tuple[str, uuid.UUID], bytes] = {}
    pos = 0
    marker = struct.pack("<H", VARIABLE_START)
    while (pos := store.find(marker, pos)) >= 0:
        if pos % 4 or pos + AUTH_HEADER.size > len(store):
            pos += 2
            continue
        header = AUTH_HEADER.unpack_from(store, pos)
        state, name_size, data_size, guid = header[1], header[7], header[8], header[9]
        name_at = pos + AUTH_HEADER.size
        end = name_at + name_size + data_size
        if state != VAR_ADDED or not 0 < name_size <= 1024 or end > len(store):
            pos += 4
            continue
        name = store[name_at : name_at + name_size].decode("utf-16-le", errors="replace")
        found[(name.rstrip("\0"), uuid.UUID(bytes_le=guid))] = store[name_at + name_size : end]
        pos = (end + 3) & ~3
    return found


def vars_file_cas(store: bytes) -> StoreCas:
    """``db`` and ``KEK`` of an OVMF variable store file."""
    found = variables(store)
    db = found.get(("db", IMAGE_SECURITY_GUID))
    kek = found.get(("KEK", GLOBAL_GUID))
    return StoreCas(
        db=signature_lists(db) if db is not None else None,
        kek=signature_lists(kek) if kek is not None else None,
    )


def efivar_cas(db: bytes | None, kek: bytes | None) -> StoreCas:
    """``db`` and ``KEK`` as efivarfs gives them (attributes first, four bytes)."""
    return StoreCas(
        db=signature_lists(db[4:]) if db is not None else None,
        kek=signature_lists(kek[4:]) if kek is not None else None,
    )


EFIVARS = "sys/firmware/efi/efivars"
DB_EFIVAR = f"{EFIVARS}/db-{IMAGE_SECURITY_GUID}"
KEK_EFIVAR = f"{EFIVARS}/KEK-{GLOBAL_GUID}"
SECURE_BOOT_EFIVAR = f"{EFIVARS}/SecureBoot-{GLOBAL_GUID}"

# What a store with only the 2011 CAs means, and what to do (host `check` and guest check).
ONLY_2011 = (
    "holds only Microsoft's 2011 CAs, which expire in 2026: Windows boot media and GPU option "
    "ROMs signed only under the 2023 CAs (Windows UEFI CA 2023, Microsoft UEFI CA 2023, Option ROM "
    "UEFI CA 2023) will not start under Secure Boot"
)
FIX_2011 = (
    "update the firmware package (an OVMF whose Microsoft-keys variable store enrols the 2023 "
    "CAs), or let Windows Update add them to the guest's own store (its db updates are signed "
    "by the KEK the store has)"
)
GUEST_CHECK = "secure-boot-cas"
GUEST_FIX_2011 = (
    "this store was copied from the host's template when the VM was made: let Windows Update "
    "add the 2023 CAs to it (their db and KEK updates are signed by the 2011 KEK it holds), or "
    "on the host update OVMF and recreate the VM's NVRAM (`virsh start --reset-nvram`)"
)


class _Root(Protocol):
    is_live: bool

    def isdir(self, rel: str) -> bool: ...
    def read_bytes(self, rel: str) -> bytes | None: ...


def secure_boot_state(var: bytes | None) -> str:
    """``on``/``off`` from efivarfs' SecureBoot (attributes, then one byte); ``unknown``."""
    if var is None or len(var) < 5:
        return "unknown"
    return "on" if var[-1] == 1 else "off"


def check_guest_cas(root: _Root) -> GuestCheck:
    """The Microsoft CAs in this guest's own db and KEK, read from efivarfs."""
    if not root.isdir("sys/firmware/efi"):
        why = "" if root.is_live else " in this root (or it was not recorded)"
        return GuestCheck(GUEST_CHECK, SKIP, f"not an EFI guest: no /sys/firmware/efi{why}")
    if not root.isdir(EFIVARS):
        return GuestCheck(GUEST_CHECK, SKIP, f"no efivars (/{EFIVARS} is not mounted or recorded)")
    db, kek = root.read_bytes(DB_EFIVAR), root.read_bytes(KEK_EFIVAR)
    if db is None and kek is None:
        return GuestCheck(GUEST_CHECK, SKIP, "no db or KEK variable: no Secure Boot keys enrolled")
    cas = efivar_cas(db, kek)
    state = secure_boot_state(root.read_bytes(SECURE_BOOT_EFIVAR))
    data = {"secure_boot": state, "db": list(cas.db or ()), "kek": list(cas.kek or ())}
    where = f"Secure Boot {state}; db and KEK"
    if cas.only_2011:
        return GuestCheck(
            GUEST_CHECK, WARN, f"{where}: {cas.summary()} — {ONLY_2011}", GUEST_FIX_2011, data
        )
    if 2023 in cas.microsoft.values():
        return GuestCheck(GUEST_CHECK, PASS, f"{where}: {cas.summary()}", data=data)
    return GuestCheck(
        GUEST_CHECK, SKIP, f"{where} hold no Microsoft CA (keys of its own)", data=data
    )
