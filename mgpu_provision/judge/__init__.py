"""The shipped judge: every decision about a box that a node must be able to make alone, as pure functions.

Whether the GPUs are healthy, whether they and their links are what the rig names, whether the loaded
driver is the pinned one, whether Fabric Manager runs at its version, whether a managed file is still what
apply wrote: each is decided here once, over the plain facts the agent's `facts` verb reports (a dict, as
its JSON) and a plain expectation record (`records.Expectation`, JSON-serialisable). The control side's
`plan` turns the findings into Changes; a node (the node check, under Slurm's prolog) turns them into its
own verdict.

Shipped inside the agent: Python 3.8, standard library only, and no import of the node package (the node
imports the judge, never the other way round). This file imports nothing, so that a node module which needs
one judge module does not load them all; `verdict.judge_node` runs every check.
"""
