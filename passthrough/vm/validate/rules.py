# SPDX-License-Identifier: Apache-2.0
"""The rule catalogue: every code ``validate`` can report, its layer, severity and why.

Codes are stable (CI configs select and ignore them); layers say which part of the
validator spoke: ``file`` (the file itself), ``schema`` (libvirt's RelaxNG), ``policy``
(what this project knows about passthrough), ``host`` (needs host facts) and ``libvirt``
(a define on a real connection). The host layer also reports the safety policy's and the
address check's codes (each finding keeps its own severity); they are in the catalogue
from the start.
"""

from __future__ import annotations

from passthrough.errors import PassthroughError

# Start-up matters (CI hooks run validate once per file): neither typing, dataclasses nor
# passthrough.model (dozens of dataclasses) is imported until a finding is made.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Iterable

    from passthrough.model import Finding, Severity
    from passthrough.pciaddr import PciAddress as Address


class Rule:
    __slots__ = ("code", "layer", "rationale", "severity")

    def __init__(self, code: str, layer: str, severity: str, rationale: str) -> None:
        self.code = code
        self.layer = layer
        self.severity = severity  # a passthrough.model.Severity value
        self.rationale = rationale


_E, _W, _I = "error", "warning", "info"

CATALOGUE: tuple[Rule, ...] = (
    Rule("file-unreadable", "file", _E, "the file is missing or cannot be read; the batch goes on"),
    Rule("xml-malformed", "file", _E, "not well-formed XML: nothing else can be checked"),
    Rule("xml-not-domain", "file", _E, "the root element is not <domain>"),
    Rule(
        "schema", "schema", _E, "libvirt's RelaxNG schema rejects the element (libvirt would too)"
    ),
    Rule(
        "schema-iommufd",
        "schema",
        _W,
        "a hostdev on iommufd checked against a schema older than the attribute (libvirt "
        "12.1): the rest of the domain was checked without it",
    ),
    Rule(
        "pci-address-duplicate",
        "policy",
        _E,
        "two devices at one guest PCI address: libvirt refuses to define it",
    ),
    Rule(
        "pci-function0",
        "policy",
        _E,
        "a passed-through device on a guest slot without function 0: the guest never scans it",
    ),
    Rule(
        "pci-multifunction",
        "policy",
        _E,
        "function 0 of a guest slot holding several functions says multifunction='off': "
        "QEMU exposes only function 0 (left out, libvirt's QEMU driver sets it on)",
    ),
    Rule("hostdev-source", "policy", _E, "a PCI hostdev whose host address cannot be read"),
    Rule(
        "hostdev-iommufd-value",
        "policy",
        _E,
        "a hostdev's <driver iommufd=...> other than yes or no: libvirt refuses it",
    ),
    Rule(
        "hyperv-vendor-id-value",
        "policy",
        _E,
        "an enabled Hyper-V vendor_id must be 1-12 characters without commas (QEMU's limit)",
    ),
    Rule(
        "gpu-scope",
        "policy",
        _I,
        "GPU rules apply only to hostdevs that host facts or render's metadata call GPU functions",
    ),
    Rule(
        "gpu-hide-kvm",
        "policy",
        _E,
        "a GPU guest with the KVM signature visible: older NVIDIA drivers stop with code 43 "
        "(opt out with <passthrough:policy hide='off'/>)",
    ),
    Rule(
        "gpu-vendor-id",
        "policy",
        _E,
        "a GPU guest without an enabled Hyper-V vendor_id: the driver sees the hypervisor's own",
    ),
    Rule(
        "gpu-one-slot",
        "policy",
        _W,
        "a card's functions spread over several guest slots; drivers expect them side by side",
    ),
    Rule(
        "gpu-functions",
        "policy",
        _E,
        "a multi-function card renumbered in the guest or passed without its function 0",
    ),
    Rule(
        "hostdev-duplicate",
        "policy",
        _E,
        "the same host device passed twice: libvirt refuses it (hostdev already exists)",
    ),
    Rule(
        "host-missing", "host", _E, "the hostdev's source address is not a PCI function on the host"
    ),
    Rule(
        "host-whole-card",
        "host",
        _E,
        "a GPU card passed without all its functions: they share a reset and an IOMMU group",
    ),
    Rule(
        "host-iommufd",
        "host",
        _E,
        "hostdevs on iommufd where the host (kernel options, /dev/iommu, vfio cdevs), "
        "QEMU (9.0+) or libvirt (12.1+) lacks it: the guest does not start",
    ),
    Rule(
        "host-vgpu-vf-rebound",
        "host",
        _E,
        "a vGPU VF (NVIDIA vendor VFIO) given managed='yes' or <driver name='vfio'/>: libvirt "
        "would move it off the nvidia driver, and its vGPU with it",
    ),
    Rule(
        "host-secure-boot-2011",
        "host",
        _W,
        "a Secure Boot domain whose variable store template holds only Microsoft's 2011 CAs: "
        "media and option ROMs signed under the 2023 CAs do not start",
    ),
    Rule("libvirt-refused", "libvirt", _E, "the libvirt connection given refuses to define it"),
)


def _host_rules() -> tuple[Rule, ...]:
    """The host layer's other voices: the safety policy's codes (``root-disk-in-group``,
    ``large-bar``, ...) the address check's (``mmio-window-too-small``, ...) and the memlock
    estimate's (``memlock-short``), known
    before any file is read so that --select/--ignore, --list-rules and SARIF know them,
    each with the severity the policy table gives it on a host prepared as validate assumes
    (a boot VGA told, not refused). ``unknown-device`` is left out: ``host-missing`` says
    it, on every hostdev."""
    from passthrough.analysis import codes

    return tuple(
        Rule(code, "host", codes.severity(code, codes.PREPARED), entry.meaning)
        for code, entry in codes.POLICY.items()
        if code != codes.UNKNOWN_DEVICE
    )


# The whole catalogue, fixed at import: nothing is added while files are checked.
RULES: dict[str, Rule] = {r.code: r for r in (*CATALOGUE, *_host_rules())}


class DomainFinding:
    """A ``model.Finding`` placed in a file: which layer, which element (XPath and line)."""

    __slots__ = ("file", "finding", "layer", "line", "xpath")

    def __init__(self, finding: Finding, file: str, layer: str, xpath: str, line: int) -> None:
        self.finding = finding
        self.file = file
        self.layer = layer
        self.xpath = xpath
        self.line = line  # 1-based; 0 when unknown (e.g. an unreadable file)

    def __repr__(self) -> str:
        return f"DomainFinding({self.text()!r})"

    @property
    def code(self) -> str:
        return self.finding.code

    @property
    def severity(self) -> Severity:
        return self.finding.severity

    @property
    def message(self) -> str:
        return self.finding.message

    def text(self) -> str:
        # A path that long cannot even exist (a 100 KB argument): shortened for people;
        # JSON, SARIF and JUnit keep the file name whole.
        from passthrough.errors import echo_path

        file = echo_path(self.file)
        where = f"{file}:{self.line}" if self.line else file
        return f"{where}: {self.severity} {self.code} [{self.layer}] {self.xpath}: {self.message}"

    def as_json(self) -> dict[str, object]:
        return {
            "code": self.code,
            "rule": self.code,  # the v1 name of "code", kept for existing consumers
            "layer": self.layer,
            "severity": str(self.severity),
            "xpath": self.xpath,
            "line": self.line,
            "message": self.message,
        }


def make(
    code: str,
    message: str,
    file: str,
    xpath: str,
    line: int,
    devices: tuple[Address, ...] = (),
    severity: str | None = None,
    layer: str | None = None,
) -> DomainFinding:
    from passthrough.model import Finding, Severity

    rule = RULES.get(code)
    sev = Severity(severity or (rule.severity if rule else "error"))
    lay = layer or (rule.layer if rule else "host")
    return DomainFinding(Finding(code, sev, message, devices), file, lay, xpath, line)


def _matches(code: str, layer: str, pattern: str) -> bool:
    return code == pattern or code.startswith(pattern.rstrip("-") + "-") or layer == pattern


class Selection:
    """Which codes are reported: ``select`` (codes, prefixes or layers; empty = all) minus
    ``ignore``; ``strict`` makes warnings fail too."""

    __slots__ = ("ignore", "select", "strict")

    def __init__(
        self, select: tuple[str, ...] = (), ignore: tuple[str, ...] = (), strict: bool = False
    ) -> None:
        for pattern in (*select, *ignore):
            if not any(_matches(r.code, r.layer, pattern) for r in RULES.values()):
                raise PassthroughError(
                    f"validate: unknown rule or prefix {pattern!r} "
                    "(see passthrough validate --list-rules)"
                )
        self.select = select
        self.ignore = ignore
        self.strict = strict

    def wants(self, f: DomainFinding) -> bool:
        if self.select and not any(_matches(f.code, f.layer, p) for p in self.select):
            return False
        return not any(_matches(f.code, f.layer, p) for p in self.ignore)

    def keep(self, findings: Iterable[DomainFinding]) -> list[DomainFinding]:
        return [f for f in findings if self.wants(f)]

    def fails(self, f: DomainFinding) -> bool:
        # Severity is a StrEnum: compared by value, so this needs no import
        return f.severity == "error" or (self.strict and f.severity == "warning")
