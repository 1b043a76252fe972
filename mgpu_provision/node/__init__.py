"""The node agent: one small program shipped to each node that answers `facts` and carries out `apply` steps.

Everything in this package except `bundle.py` runs on the node with its own `python3` (3.8+, standard
library only), so that a box needs nothing installed before the tool can read it. `bundle.py` is the control
side's builder of the zipapp.
"""
