# SPDX-License-Identifier: Apache-2.0
from passthrough.vm.validate.main import main

raise SystemExit(main())
