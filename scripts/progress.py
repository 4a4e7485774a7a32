"""Moved to provision/floor/progress.py; this name stays until scripts/testmatrix imports the new one."""

from provision.floor.progress import heartbeat, load

__all__ = ["heartbeat", "load"]
