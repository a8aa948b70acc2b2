#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Run on a lent GPU guest (the device machine: a cloud VM with an NVIDIA card passed through,
# python3 without pip), from a plain copy of this checkout: the guest end of the chain, live.
# Writes what it saw under $OUT (default ./device-out). Nothing on the guest is changed.
set -u
out="${OUT:-device-out}"
mkdir -p "$out"
pt() { python3 -m passthrough "$@"; }
{
    echo "== uname"; uname -a
    echo "== os-release"; grep -E '^(PRETTY_NAME|VERSION_ID)=' /etc/os-release
    echo "== lspci nvidia"; lspci -nn -d 10de: 2>/dev/null
    echo "== iommufd pieces (kernel config, /dev/iommu, modules)"
    cfg="/boot/config-$(uname -r)"
    { [ -r "$cfg" ] && grep -E 'CONFIG_(IOMMUFD|VFIO|VFIO_DEVICE_CDEV|VFIO_PCI)[= ]' "$cfg"; } ||
        { [ -r /proc/config.gz ] && zcat /proc/config.gz | grep -E 'CONFIG_(IOMMUFD|VFIO|VFIO_DEVICE_CDEV)[= ]'; }
    ls -l /dev/iommu /dev/vfio 2>&1
    grep -E '^(iommufd|vfio)' /proc/modules
} > "$out/facts.txt" 2>&1
pt --version > "$out/version.txt" 2>&1
pt guest check --json > "$out/guest-check.json" 2> "$out/guest-check.err"; echo "guest check rc=$?" >> "$out/rc.txt"
pt guest check > "$out/guest-check.txt" 2>&1
pt scan --json > "$out/scan.json" 2> "$out/scan.err"; echo "scan rc=$?" >> "$out/rc.txt"
pt check --json > "$out/check.json" 2> "$out/check.err"; echo "check rc=$?" >> "$out/rc.txt"
pt check > "$out/check.txt" 2>&1
pt snapshot -o "$out/snapshot.tar.gz" > "$out/snapshot.txt" 2>&1; echo "snapshot rc=$?" >> "$out/rc.txt"
# start-up: a new interpreter each time, beside the bare interpreter (5 each, alternating)
TIMEFORMAT="%R %U %S"
for i in 1 2 3 4 5; do
    { echo -n "python -c pass "; { time python3 -c pass; } 2>&1; } >> "$out/startup.txt"
    { echo -n "passthrough --version "; { time python3 -m passthrough --version >/dev/null; } 2>&1; } >> "$out/startup.txt"
    { echo -n "passthrough scan --help "; { time python3 -m passthrough scan --help >/dev/null; } 2>&1; } >> "$out/startup.txt"
done
ls -la "$out"
