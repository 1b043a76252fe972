"""One module per managed concern; each turns desired state and facts into Changes, purely."""
