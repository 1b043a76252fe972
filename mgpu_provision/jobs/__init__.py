"""The control side of each fleet job: who is asked what, in which order, and the verdict (no views).

A command reads `commands/<verb>.py` → `jobs/<verb>.py` → the agent's `node/verbs/<verb>.py`.
"""
