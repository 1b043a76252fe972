"""The shipped catalog: what both ends know about a box, as tables and parsers.

The control side plans with the same facts the agent acts on: which packages a source calls a branch's
driver, which distribution family takes which package manager, how `nvidia-smi topo -m` reads, what a PCI
address or a kernel CPU list means, the `path_prepend` rule, the persistenced flags. Kept inside `node/`
they made `rig/` and `plan/` import the agent (and an edit to an installer expire the rig cache); kept on
the control side the node could not have them. So they live here, shipped in the agent beside the
judge and imported by both ends: nothing outside `node/` imports the node package
(tests/unit/test_node_boundary.py).

Shipped inside the agent: Python 3.8, standard library only; it imports only itself, `protocol` and the
judge, never the node package. This file imports nothing, so a module that needs one table loads only it.
"""
