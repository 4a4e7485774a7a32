"""The tooling's bottom layer: facts and mechanisms every command shares, with no policy.

Each module here imports only the standard library (and its siblings), so provisioning, the
invoke tasks and the test matrix can all use it before torch, torch_fl's extension or any
third-party package exists. `provision/` and `scripts/` import it; it imports neither, and
scripts/check_imports.py fails the lint lane when that changes (docs/architecture.md).

This file only documents the package: import the modules themselves
(`from provision.floor import exitcodes`).
"""
