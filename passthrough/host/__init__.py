# SPDX-License-Identifier: Apache-2.0
"""Reading hosts: a root directory (live, snapshot, fixture) or pyudev on a live host."""
