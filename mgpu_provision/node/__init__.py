"""The node agent: one small program shipped to each node that answers `facts` and carries out `apply` steps.

Everything in this package runs on the node with its own `python3` (3.8+, standard library only), so that a
box needs nothing installed before the tool can read it. `__main__.py` is the door (the envelope, the request
check, verb dispatch); `verbs/` holds the verbs, `nvidia/` the NVIDIA layer (the only part a simulation
replaces), `packages/` the package installers, `host/` the rest of the box, `core/` what all of them use.
"""
