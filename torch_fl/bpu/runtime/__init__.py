"""Executors (hbm / sim / eager) and the per-partition runtime that picks and calls them."""
