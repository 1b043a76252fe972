"""The DDP smoke test: the program run on nodes under torchrun, and its control side."""
