# SPDX-License-Identifier: Apache-2.0
"""The cluster path: the same host facts, options and policy as ``render``, written as
KubeVirt and Kubernetes objects (device-plugin route and DRA route), checked offline, and a
preflight a node must pass before it is labelled for GPU passthrough."""

# The choices of `kubevirt render` (here, not in kube.build, so its --help imports nothing)
ROUTES = ("device-plugin", "dra")
PROVIDERS = ("nvidia", "kubevirt")  # who publishes the PCI resources on the device-plugin route
# the VM options `kubevirt render` has no flag for (KubeVirt has no field for them: a spec
# file naming one is refused, kube/build.py _LIBVIRT_ONLY); --help shows only what it takes
KUBE_LEAVES_OUT = frozenset(
    {"rom", "disk", "base_image", "bridge", "network", "seed", "virt_type", "no_gpu"}
    | {"cdrom", "driver_iso", "disk_bus", "graphics", "headless", "usb_input", "topology"}
)
