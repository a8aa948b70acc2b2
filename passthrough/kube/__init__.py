# SPDX-License-Identifier: Apache-2.0
"""The cluster path: the same host facts, options and policy as ``render``, written as
KubeVirt and Kubernetes objects (device-plugin route and DRA route), checked offline, and a
preflight a node must pass before it is labelled for GPU passthrough."""

# The choices of `kubevirt render` (here, not in kube.build, so its --help imports nothing)
ROUTES = ("device-plugin", "dra")
PROVIDERS = ("nvidia", "kubevirt")  # who publishes the PCI resources on the device-plugin route
