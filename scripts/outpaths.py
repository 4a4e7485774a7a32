"""Moved to provision/floor/outpaths.py; this name stays until scripts/testmatrix imports the new one."""

from provision.floor.outpaths import dir_problem, file_problem, lookup_problem, shown

__all__ = ["dir_problem", "file_problem", "lookup_problem", "shown"]
