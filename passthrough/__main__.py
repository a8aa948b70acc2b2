from passthrough.cli import main

raise SystemExit(main())
