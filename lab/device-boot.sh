#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Run as root on a lent GPU guest (the device machine: a cloud VM, python3 without pip), from a
# plain copy of this checkout: boot truth on a host whose boot tools nobody in this project
# wrote. The live root is only read (plan, status, release with nothing on vfio); apply and undo
# run against a copy of the live root on a loop-mounted ext4 image in /dev/shm, so the host's
# own update-grub (its grub-mkconfig, its /etc/default/grub.d) does the work and nothing on the
# host is changed. Writes what it saw under $OUT (default ./device-out).
set -u
out="${OUT:-device-out}"
mkdir -p "$out"
pt() { timeout 300 python3 -m passthrough "$@"; }
log="$out/boot.txt"
say() { echo "== $*" >>"$log"; }
{
    say "os-release"; grep -E '^(PRETTY_NAME|VERSION_ID)=' /etc/os-release
    say "/proc/cmdline"; cat /proc/cmdline
    say "/etc/default/grub (no comments)"; grep -vE '^\s*(#|$)' /etc/default/grub
    say "/etc/default/grub.d"; for f in /etc/default/grub.d/*.cfg; do echo "-- $f"; grep -vE '^\s*(#|$)' "$f"; done
    say "grub-mkconfig reads grub.d?"; grep -n 'grub.d' "$(command -v grub-mkconfig)"
    say "linux lines of /boot/grub/grub.cfg"; grep -nE '^\s*linux' /boot/grub/grub.cfg | head -4
    say "mounts of / /boot /boot/efi"; findmnt -n -o TARGET,SOURCE,FSTYPE / /boot /boot/efi
} >>"$log" 2>&1

# the live host, read only
pt plan --iommu-only >"$out/live-plan.txt" 2>&1; echo "live plan rc=$?" >>"$out/rc.txt"
pt plan --iommu-only --json >"$out/live-plan.json" 2>"$out/live-plan.err"
pt status >"$out/live-status.txt" 2>&1; echo "live status rc=$?" >>"$out/rc.txt"
pt release --gpu 0000:00:06.0 --yes --json >"$out/live-release.json" 2>"$out/live-release.err"
echo "live release rc=$?" >>"$out/rc.txt"
readlink /sys/bus/pci/devices/0000:00:06.0/driver >"$out/driver-after-release.txt" 2>&1

# a copy of the live root on its own block device: grub-probe finds "/" there
copy=/mnt/ptroot
img=/dev/shm/ptroot.img
t0=$(date +%s%N)
truncate -s 48G "$img" && mkfs.ext4 -q -F "$img" && mkdir -p "$copy" && mount -o loop "$img" "$copy" || {
    echo "no loop-mounted copy: skipped apply/undo" >>"$out/rc.txt"; exit 0; }
for d in /*; do
    case "$d" in
        /proc|/sys|/dev|/run|/tmp|/mnt|/media|/lost+found|/snap|/home|/opt|/srv) mkdir -p "$copy$d" ;;
        *) cp -a --one-file-system "$d" "$copy/" 2>>"$out/copy.err" ;;
    esac
done
mkdir -p "$copy/boot/efi"
echo "copy: $(du -sh --apparent-size "$copy" | cut -f1) in $(( ($(date +%s%N) - t0) / 1000000 )) ms" >>"$log"
sha() { (cd "$copy" && find etc boot -xdev -type f -print0 | sort -z | xargs -0 sha256sum) ; }
sha >"$out/sha-before.txt" 2>/dev/null
pt plan --root "$copy" --iommu-only >"$out/copy-plan.txt" 2>&1; echo "copy plan rc=$?" >>"$out/rc.txt"
t1=$(date +%s%N)
pt apply --root "$copy" --iommu-only --yes --json >"$out/copy-apply.json" 2>"$out/copy-apply.err"; rc=$?
echo "copy apply rc=$rc in $(( ($(date +%s%N) - t1) / 1000000 )) ms" >>"$out/rc.txt"
{ say "copy after apply: linux lines"; grep -nE '^\s*linux' "$copy/boot/grub/grub.cfg" | head -4; } >>"$log" 2>&1
pt status --root "$copy" >"$out/copy-status.txt" 2>&1; echo "copy status rc=$?" >>"$out/rc.txt"
# a second apply: nothing to do
pt apply --root "$copy" --iommu-only --yes --json >"$out/copy-apply2.json" 2>"$out/copy-apply2.err"
echo "copy apply again rc=$?" >>"$out/rc.txt"
t2=$(date +%s%N)
pt undo --root "$copy" --yes --json >"$out/copy-undo.json" 2>"$out/copy-undo.err"; rc=$?
echo "copy undo rc=$rc in $(( ($(date +%s%N) - t2) / 1000000 )) ms" >>"$out/rc.txt"
{ say "copy after undo: linux lines"; grep -nE '^\s*linux' "$copy/boot/grub/grub.cfg" | head -4; } >>"$log" 2>&1
sha >"$out/sha-after.txt" 2>/dev/null
diff "$out/sha-before.txt" "$out/sha-after.txt" >"$out/sha-diff.txt"; echo "etc+boot diff rc=$?" >>"$out/rc.txt"
umount "$copy"; rm -f "$img"
cat "$out/rc.txt"
