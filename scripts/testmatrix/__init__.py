"""Declarative test matrix: `matrix.yaml` lanes + capability-keyed expectations.

Modules, one job each: `schema` (validate matrix.yaml), `capabilities` (detect what this machine
has), `platforms` (named capability profiles for dry runs), `plugin` (pytest plugin applying
expectations), `runner` (run a matrix: plan, run each lane, report), `update` (propose
expectation changes from junit results). The runner's parts: `request` (the run's inputs,
`MatrixRun`, and their usage checks), `results` (a lane's buckets and files), `lanes` (run one
pytest or ruff lane), `processes` (the lane's subprocess, signals, streams), `junit` (complete and
repair a lane's junit XML), `output` (plan, tables, summaries), `rerun` (earlier runs' outputs and
--rerun-failed).
"""
