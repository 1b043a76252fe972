"""The agent's verbs, one module each (`facts`, `apply`, `reclaim`, `smoke`), loaded only when called."""
