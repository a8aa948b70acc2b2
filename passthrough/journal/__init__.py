# SPDX-License-Identifier: Apache-2.0
"""Carrying out a plan on a host: journal, atomic files, apply, undo and drift, status, verify, bind."""
