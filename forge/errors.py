"""Typed errors. Each carries a message meant for users and says whether it is recoverable.

Recoverable errors are ones a caller may handle by falling back (another backend) or retrying
(a transient resource shortage); the rest mean the input or the installation must change.
The CLI maps `exit_code` to its process exit status: 2 for usage/config errors, 1 otherwise.
"""

from __future__ import annotations


class ForgeError(Exception):
    """Base of every error forge raises on purpose."""

    recoverable: bool = False
    exit_code: int = 1

    def __init__(self, message: str):
        super().__init__(message)
        self.message = message

    def __str__(self) -> str:
        return self.message


class ConfigError(ForgeError):
    """A configuration value is unknown, of the wrong type or out of range."""

    exit_code = 2


class UsageError(ForgeError):
    """The command line or an API call was used wrongly."""

    exit_code = 2


class PluginError(ForgeError):
    """A plugin failed to import, register, or declared an incompatible hook API version."""


class BackendUnavailableError(ForgeError):
    """The requested backend cannot run here; recoverable by falling back to another backend."""

    recoverable = True

    def __init__(self, backend: str, reason: str):
        super().__init__(f"backend {backend!r} is unavailable: {reason}")
        self.backend = backend
        self.reason = reason


class ModelError(ForgeError):
    """A model file cannot be used: malformed, unsupported, or inconsistent."""


class GGUFFormatError(ModelError):
    """The GGUF file is malformed: bad magic/version, truncation, out-of-range data."""


class UnsupportedModelError(ModelError):
    """The file is well formed but uses an architecture or weight type forge does not support."""


class ContextOverflowError(ForgeError):
    """A prompt (plus requested tokens) does not fit the model's context window."""

    exit_code = 2


class ForgeRuntimeError(ForgeError):
    """Execution failed on a backend (a kernel, a driver call)."""


class OutOfMemoryError(ForgeRuntimeError):
    """Not enough (device) memory; recoverable by falling back or freeing memory."""

    recoverable = True
