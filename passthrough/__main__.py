# SPDX-License-Identifier: Apache-2.0
from passthrough.cli import main

raise SystemExit(main())
