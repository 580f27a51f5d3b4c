"""`python -m tools.htsim`."""

from tools.htsim.compare import main

raise SystemExit(main())
