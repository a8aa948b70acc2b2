# SPDX-License-Identifier: Apache-2.0
"""Kernel arguments through the boot tool a host really uses: one module per family.

Each family module holds its edit (a :class:`~passthrough.boot.base.Bootloader`: where the
configured arguments live and the actions that change them, the regeneration command
included) and its read-back (what the next boot reads after that command ran):

- ``grub``: GRUB as each distro's grub-mkconfig reads /etc/default/grub (the shell
  readers ``shellvars`` and ``shellvalue`` beside it), and grub.cfg's default entry;
- ``loaderentries``: kernel-install, systemd-boot and BLS entries (/etc/kernel/cmdline),
  unified kernel images (their ``.cmdline`` read by ``uki``);
- ``grubby``, ``kernelstub``, ``proxmox``, ``rpmostree``, ``nixos``: one each;
- ``linefiles``: the line files several families share (kernel-install's cmdline, ``options``);
- ``families``: the table ``plan`` consults (``for_host``) and the read-back of each family.

Which family a root uses is a fact of discovery (``passthrough.host.boot``), made once when
the host is read, so that ``scan`` and ``check`` show it without importing any editor.
"""
