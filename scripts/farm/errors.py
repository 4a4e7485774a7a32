"""The farm's one error class, in a module of its own so every farm module can raise it."""

from __future__ import annotations


class FarmError(RuntimeError):
    """The farm could not do what was asked; the message names the place and the cause."""
