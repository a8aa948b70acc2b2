# SPDX-License-Identifier: Apache-2.0
"""What a person or a machine reads: json.py (the scan/v1 document), text.py (trees and tables)."""
