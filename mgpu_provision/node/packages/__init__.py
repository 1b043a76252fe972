"""Installing NVIDIA's packages: names per source, apt, dnf, the runfile, their systemd units."""
