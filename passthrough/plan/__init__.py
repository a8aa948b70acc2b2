# SPDX-License-Identifier: Apache-2.0
"""Planning host changes: a list of actions computed from discovery, shown before applied."""
