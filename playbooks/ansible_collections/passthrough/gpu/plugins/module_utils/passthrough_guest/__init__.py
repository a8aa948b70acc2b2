# SPDX-License-Identifier: Apache-2.0
"""What a guest sees of its passed-through GPU (standard library only: runs in guests
where the package is not installed)."""
