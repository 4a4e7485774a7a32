"""The board farm: find, hold and use boards through labgrid (docs/farm.md).

labgrid only finds and holds boards (coordinator, places, reservations, locks); everything done
on a board goes through this project's own SSH target (provision/target.py, host keys checked).
"""
