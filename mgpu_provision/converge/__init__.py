"""Converging boxes: apply's per-host sequence, the rolling rollout and the playbooks that select steps."""
