"""The NVIDIA Container Toolkit's packages: what the plan puts in a `container-toolkit` step and the node
installs.

All four at one version, as NVIDIA's install guide installs them
(docs.nvidia.com/datacenter/cloud-native/container-toolkit/latest/install-guide.html, "Installing with
Apt/Dnf/Zypper": NVIDIA_CONTAINER_TOOLKIT_VERSION for each), from NVIDIA's libnvidia-container repository.

Shipped inside the agent: Python 3.8, standard library only.
"""

TOOLKIT_PACKAGES = (
    "nvidia-container-toolkit",
    "nvidia-container-toolkit-base",
    "libnvidia-container-tools",
    "libnvidia-container1",
)
