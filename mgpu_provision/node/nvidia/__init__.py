"""The NVIDIA layer of a node: NVML (real or the twin's), its health readers, kernel logs, topology.

The only part of a node that a simulation replaces; `select.py` chooses the real or the simulated backend.
"""
