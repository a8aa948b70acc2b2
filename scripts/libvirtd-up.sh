#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Start a real libvirtd with the QEMU driver on a machine without systemd (CI, containers).
# Idempotent; needs root. The test suite calls it; so can you.
set -euo pipefail
[ "$(id -u)" -eq 0 ] || { echo "libvirtd-up: run as root" >&2; exit 2; }
getent group kvm >/dev/null || groupadd -r kvm
getent group libvirt-qemu >/dev/null || groupadd -r libvirt-qemu
id libvirt-qemu >/dev/null 2>&1 || useradd -r -g kvm -s /usr/sbin/nologin libvirt-qemu
mkdir -p /var/log/libvirt /var/run/libvirt /var/lib/libvirt/images /etc/libvirt
conf=/etc/libvirt/qemu.conf
touch "$conf"
# QEMU as root: this machine has no per-VM uid setup (a lab/CI daemon, not production)
grep -q '^user = "root"' "$conf" || printf 'user = "root"\ngroup = "root"\n' >> "$conf"
# virtlogd keeps QEMU's log and each started domain's console log: no domain starts without it
# (a socket left by a virtlogd that was killed does not count: it is removed and one started)
if [ -x /usr/sbin/virtlogd ] && ! pgrep -x virtlogd >/dev/null; then
    rm -f /run/libvirt/virtlogd-sock /run/libvirt/virtlogd-admin-sock
    /usr/sbin/virtlogd -d
    for _ in $(seq 1 50); do [ -S /run/libvirt/virtlogd-sock ] && break; sleep 0.1; done
fi
if virsh -c qemu:///system version >/dev/null 2>&1; then
    exit 0
fi
/usr/sbin/libvirtd -d
for _ in $(seq 1 100); do
    virsh -c qemu:///system version >/dev/null 2>&1 && exit 0
    sleep 0.1
done
echo "libvirtd-up: libvirtd did not answer on qemu:///system" >&2
exit 1
