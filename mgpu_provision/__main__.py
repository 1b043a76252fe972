"""`python -m mgpu_provision` runs the CLI."""

import sys

from .cli import main

sys.exit(main())
