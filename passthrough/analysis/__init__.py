# SPDX-License-Identifier: Apache-2.0
"""Judging a discovered host: viability (what a card is), policy (findings), checks (readiness)."""
