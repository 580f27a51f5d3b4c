"""`python -m tools.testbed`: hands over to `tools.testbed.cli.main`."""

import sys

from tools.testbed.cli import main

sys.exit(main())
