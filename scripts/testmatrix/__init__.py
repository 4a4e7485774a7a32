"""Declarative test matrix: `matrix.yaml` lanes + capability-keyed expectations.

Modules, one job each: `schema` (validate matrix.yaml), `capabilities` (detect what this machine
has), `platforms` (named capability profiles for dry runs), `plugin` (pytest plugin applying
expectations), `runner` (run lanes, bucket outcomes, report), `update` (propose expectation
changes from junit results).
"""
