"""`python -m tools.job`: hands over to `tools.job.cli.main`."""

import sys

from tools.job.cli import main

sys.exit(main())
