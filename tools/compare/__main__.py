"""`python -m tools.compare`."""

from tools.compare.cli import main

raise SystemExit(main())
