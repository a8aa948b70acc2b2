# SPDX-License-Identifier: Apache-2.0
"""Reset risk of a card, with the reason: a reset shared with other devices, or a family
known not to come back after a guest stops."""

from __future__ import annotations

from passthrough.model import CheckResult, GpuVerdict, Host, Level

AMD = 0x1002
# AMD families whose function-level/bus reset leaves the card unusable until the host
# reboots (the device IDs the out-of-tree vendor-reset module handles).
NO_RESET_FAMILIES: dict[str, frozenset[int]] = {
    "Vega 10": frozenset(
        {0x6860, 0x6861, 0x6862, 0x6863, 0x6864, 0x6867, 0x6868, 0x6869, 0x686A, 0x686B}
        | {0x686C, 0x686D, 0x686E, 0x687F}
    ),
    "Vega 20": frozenset({0x66A0, 0x66A1, 0x66A2, 0x66A3, 0x66A4, 0x66A7, 0x66AF}),
    "Navi 10": frozenset({0x7310, 0x7312, 0x7318, 0x7319, 0x731A, 0x731B, 0x731E, 0x731F}),
    "Navi 12": frozenset({0x7360, 0x7362}),
    "Navi 14": frozenset({0x7340, 0x7341, 0x7347, 0x734F}),
}


def known_no_reset(vendor_id: int, device_id: int) -> str | None:
    if vendor_id != AMD:
        return None
    for family, ids in NO_RESET_FAMILIES.items():
        if device_id in ids:
            return family
    return None


def reset_checks(host: Host, verdicts: list[GpuVerdict]) -> list[CheckResult]:
    """One ``reset-risk`` warning per card at risk, naming the reason."""
    results: list[CheckResult] = []
    for v in verdicts:
        gpu = v.gpu.primary
        family = known_no_reset(gpu.vendor_id, gpu.device_id)
        if family:
            results.append(
                CheckResult(
                    "reset-risk",
                    Level.WARN,
                    f"{gpu.address}: AMD {family} ({gpu.id}) is known not to come back after "
                    "a guest stops (its reset leaves it unusable until the host reboots)",
                    "load the vendor-reset module before starting the guest, or reboot the "
                    "host between guests",
                )
            )
        if gpu.reset_methods == ("bus",):
            results.extend(_bus_reset(host, v))
    return results


def _bus_reset(host: Host, v: GpuVerdict) -> list[CheckResult]:
    """A bus reset resets everything below the bridge: a warning when that is more than the
    card (its own functions go to the guest together)."""
    gpu = v.gpu.primary
    mine = {f.address for f in v.gpu.functions}
    bus = (gpu.address.domain, gpu.address.bus)
    others = [
        str(f.address)
        for f in host.functions
        if (f.address.domain, f.address.bus) == bus and f.address not in mine
    ]
    if not others:
        return []
    return [
        CheckResult(
            "reset-risk",
            Level.WARN,
            f"{gpu.address}: only a bus reset (reset_method is 'bus'), which resets everything "
            f"on bus {bus[0]:04x}:{bus[1]:02x} with it: {', '.join(others)}",
            "pass those functions to the same guest, or move the card to a slot of its own",
        )
    ]
