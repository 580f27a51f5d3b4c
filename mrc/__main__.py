"""`python -m mrc`: the same entry point as the `mrc` command (`mrc.cli.main`)."""

from __future__ import annotations

import sys

from mrc.cli import main

if __name__ == "__main__":
    sys.exit(main())
