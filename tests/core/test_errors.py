"""Typed errors: user messages, exit codes, and which ones are recoverable."""

from __future__ import annotations

import pytest

from forge import errors

ALL = [
    errors.ConfigError, errors.UsageError, errors.PluginError, errors.ModelError,
    errors.GGUFFormatError, errors.UnsupportedModelError, errors.ContextOverflowError,
    errors.ForgeRuntimeError, errors.OutOfMemoryError,
]  # fmt: skip


@pytest.mark.parametrize("cls", ALL)
def test_message_is_the_string(cls):
    err = cls("something precise went wrong")
    assert isinstance(err, errors.ForgeError)
    assert str(err) == err.message == "something precise went wrong"


@pytest.mark.parametrize(
    ("cls", "code"),
    [(errors.ConfigError, 2), (errors.UsageError, 2), (errors.ContextOverflowError, 2),
     (errors.PluginError, 1), (errors.ModelError, 1), (errors.GGUFFormatError, 1),
     (errors.ForgeRuntimeError, 1), (errors.OutOfMemoryError, 1)],
)  # fmt: skip
def test_exit_codes(cls, code):
    assert cls("x").exit_code == code


def test_recoverable_classification():
    recoverable = {cls for cls in ALL if cls("x").recoverable}
    assert recoverable == {errors.OutOfMemoryError}
    assert errors.BackendUnavailableError("hip", "no device").recoverable


def test_backend_unavailable_carries_backend_and_reason():
    err = errors.BackendUnavailableError("hip", "hip-python not installed")
    assert (err.backend, err.reason) == ("hip", "hip-python not installed")
    assert str(err) == "backend 'hip' is unavailable: hip-python not installed"
    assert err.exit_code == 1


def test_hierarchy():
    assert issubclass(errors.GGUFFormatError, errors.ModelError)
    assert issubclass(errors.UnsupportedModelError, errors.ModelError)
    assert issubclass(errors.OutOfMemoryError, errors.ForgeRuntimeError)
    with pytest.raises(errors.ForgeError):
        raise errors.OutOfMemoryError("out of memory")
