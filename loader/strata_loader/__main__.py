"""`python -m strata_loader` runs the CLI."""

import sys

from .cli import main

sys.exit(main())
