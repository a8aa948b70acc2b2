from passthrough.vm.validate.main import main

raise SystemExit(main())
