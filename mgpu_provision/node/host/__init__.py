"""What a node is outside the NVIDIA layer: processes, files, network and CPUs, PCI addresses, its torch."""
