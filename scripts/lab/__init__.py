"""Board lab: an emulated RDK-like aarch64 board (16 KB or 64 KB pages) for provisioning tests.

This file only re-exports; the submodules import each other directly (`from scripts.lab.cache
import lookup`), never through the package, so nothing here can tie them in a cycle.
"""

from scripts.lab.readiness import DEFAULT_PAGE_SIZE, available, capability

__all__ = ["DEFAULT_PAGE_SIZE", "available", "capability"]
