"""Stand-in for the vendor hbdk4 package (tests only; see ../README.md)."""

__version__ = "4.0.0+standin"
