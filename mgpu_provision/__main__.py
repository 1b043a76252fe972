"""`python -m mgpu_provision` runs the CLI, as the installed `mgpu-provision` does."""

from .entry import main

main()
