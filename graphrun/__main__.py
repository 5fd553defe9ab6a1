from graphrun.cli import main

raise SystemExit(main())
