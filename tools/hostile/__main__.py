"""`python -m tools.hostile`."""

from tools.hostile.cli import main

raise SystemExit(main())
