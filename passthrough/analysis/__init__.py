"""Judging a discovered host: viability (what a card is), policy (findings), checks (readiness)."""
