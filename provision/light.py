"""Moved to provision/floor/light.py; this name stays until scripts/testmatrix imports the new one."""

from provision.floor.light import LIGHT, PACKAGE_DIR, load, path_of

__all__ = ["LIGHT", "PACKAGE_DIR", "load", "path_of"]
