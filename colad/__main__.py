"""`python -m colad`: the same entry point as the `colad` console script."""

import sys

from colad.cli import main

sys.exit(main())
