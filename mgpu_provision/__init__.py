"""mgpu-provision: declarative provisioning for multi-GPU training boxes.

This package is also shipped, in part, to the nodes inside the agent zipapp; keep this module free of
imports so that the node side (stdlib only, Python 3.8+) can import the package.
"""

__version__ = "0.1.0"
