"""What every verb of the agent stands on: its failure type, the one runner of commands, crash-safe writes."""
