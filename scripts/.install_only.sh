#!/usr/bin/env bash
# One command per job on a fresh Debian 12 machine (README "Quick start"):
#   bash scripts/setup.sh demo   install what passthrough needs, then run the main job
#                                 (check + scan) on a bundled sample host
#   bash scripts/setup.sh test   install what the test suite needs, then run all of it
#   bash scripts/setup.sh lab    install what the lab needs, then run its whole chain on a
#                                 real kernel under QEMU (as root; README "The lab")
# Safe to re-run: apt and pip skip what is already there.
set -euo pipefail

mode="${1:-demo}"
case "$mode" in demo|test|lab) ;; *) echo "usage: $0 demo|test|lab" >&2; exit 2 ;; esac
cd "$(dirname "$0")/.."

SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi

# System packages: a compiler, pkg-config and libvirt's headers build libvirt-python
# (PyPI ships no wheels for it); libudev is what pyudev loads.
packages=(python3 python3-venv python3-dev gcc pkg-config libvirt-dev libudev1 libvirt-clients)
if [ "$mode" != demo ]; then
    # umockdev: recorded devices for the pyudev tests; pciutils: lspci cross-checks
    # fixtures and is the benchmark's reference.
    # gir1.2-umockdev-1.0 + the headers PyGObject builds against: a UMockdev test bed
    # that emits bind/unbind uevents; debootstrap: the chroot apply/undo test.
    packages+=(umockdev gir1.2-umockdev-1.0 libgirepository1.0-dev libcairo2-dev pciutils bash debootstrap)
    # libvirt-clients + libxml2-utils: virt-xml-validate and the RelaxNG schemas; a real
    # libvirtd with the QEMU driver and OVMF for the domain tests.
    packages+=(libvirt-clients libxml2-utils libvirt-daemon libvirt-daemon-driver-qemu qemu-system-x86 ovmf qemu-utils)
    # the lab: an ext4 image straight from a directory, SSH into the lab machine
    packages+=(e2fsprogs openssh-client grub-efi-amd64-bin grub-common dosfstools mtools fdisk)
fi
missing=()
for p in "${packages[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ "${#missing[@]}" -gt 0 ]; then
    echo "==> installing system packages: ${missing[*]}"
    $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

if [ ! -x .venv/bin/python ]; then
    echo "==> creating .venv"
    python3 -m venv .venv
fi
extra=""
[ "$mode" = test ] && extra="[test]"
echo "==> installing passthrough${extra} into .venv"
.venv/bin/python -m pip install -q --upgrade pip >/dev/null
.venv/bin/python -m pip install -q -e ".${extra}"

echo INSTALL-DONE
