"""The backend's error classes: one base, so `except BpuError` catches every refusal of ours.

Each class also derives from the builtin its callers caught before (ValueError for bad settings,
OSError for the cache, RuntimeError for compile failures), so existing handlers keep working.
"""

from __future__ import annotations


class BpuError(Exception):
    """Base of every error the bpu backend raises on purpose (message names the problem + fix)."""
