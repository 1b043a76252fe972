"""The plan: what differs between the rig file and each box, decided by pure functions over facts."""
