"""Reaching the fleet: host targets, SSH connections, agent sessions, the worker pool and the agent bundle."""
