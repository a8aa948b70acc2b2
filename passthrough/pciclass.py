# SPDX-License-Identifier: Apache-2.0
"""PCI class codes: the constants decisions use, the words output shows, and what is a bridge."""

from __future__ import annotations

# Base classes and subclasses (PCI Code and ID Assignment spec): the 16-bit subclass is
# ``class_code >> 8``, the base class ``class_code >> 16``.
CLASS_DISPLAY = 0x03
SUBCLASS_SCSI = 0x0100
SUBCLASS_IDE = 0x0101
SUBCLASS_RAID = 0x0104
SUBCLASS_SATA = 0x0106
SUBCLASS_NVME = 0x0108
SUBCLASS_ETHERNET = 0x0200
SUBCLASS_INFINIBAND = 0x0207
SUBCLASS_NETWORK_OTHER = 0x0280  # Wi-Fi cards, among others
SUBCLASS_VGA = 0x0300
SUBCLASS_3D = 0x0302
SUBCLASS_DISPLAY_OTHER = 0x0380
SUBCLASS_AUDIO_HDA = 0x0403
SUBCLASS_HOST_BRIDGE = 0x0600
SUBCLASS_ISA_BRIDGE = 0x0601
SUBCLASS_PCI_BRIDGE = 0x0604
SUBCLASS_PCI_BRIDGE_SEMI = 0x0609
SUBCLASS_OTHER_BRIDGE = 0x0680  # an NVSwitch's class
SUBCLASS_SYSTEM_OTHER = 0x0880
SUBCLASS_USB = 0x0C03
SUBCLASS_SMBUS = 0x0C05
SUBCLASS_SERIAL_OTHER = 0x0C80  # UCSI (USB Type-C) on a card
SUBCLASS_CRYPTO_OTHER = 0x1080
SUBCLASS_SIGNAL_OTHER = 0x1180

# The words output uses for a function's kind, by subclass.
CLASS_WORDS = {
    SUBCLASS_SCSI: "SCSI controller",
    SUBCLASS_IDE: "IDE controller",
    SUBCLASS_RAID: "RAID controller",
    SUBCLASS_SATA: "SATA controller",
    SUBCLASS_NVME: "NVMe controller",
    SUBCLASS_ETHERNET: "Ethernet controller",
    SUBCLASS_INFINIBAND: "InfiniBand controller",
    SUBCLASS_NETWORK_OTHER: "network controller",
    SUBCLASS_VGA: "VGA controller",
    SUBCLASS_3D: "3D controller",
    SUBCLASS_DISPLAY_OTHER: "display controller",
    SUBCLASS_AUDIO_HDA: "audio device",
    SUBCLASS_HOST_BRIDGE: "host bridge",
    SUBCLASS_ISA_BRIDGE: "ISA bridge",
    SUBCLASS_PCI_BRIDGE: "PCI bridge",
    SUBCLASS_PCI_BRIDGE_SEMI: "PCI bridge",
    SUBCLASS_OTHER_BRIDGE: "bridge",
    SUBCLASS_USB: "USB controller",
    SUBCLASS_SMBUS: "SMBus controller",
    SUBCLASS_SERIAL_OTHER: "serial bus controller",
}


def is_pci_bridge(class_code: int) -> bool:
    """A PCI-to-PCI bridge (root port, switch port): it has a secondary bus."""
    return class_code >> 8 in (SUBCLASS_PCI_BRIDGE, SUBCLASS_PCI_BRIDGE_SEMI)
