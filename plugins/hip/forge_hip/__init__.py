"""forge_hip: the HIP backend plugin (AMD GPUs through hip-python, NVIDIA GPUs through cuda-python).

Importing this package imports no GPU library: probing and runtimes load them on demand.
"""

from forge_hip.backend import HipBackend
from forge_hip.plugin import FORGE_HOOK_API, forge_register_backends

__all__ = ["FORGE_HOOK_API", "HipBackend", "forge_register_backends"]
