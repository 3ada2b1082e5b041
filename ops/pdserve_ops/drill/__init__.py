"""Release drills an operator runs against a cluster (docs/runbooks/rollback.md): a rollback, or a
promotion, under load, checked end to end. `cluster.py` is what a drill needs from the
cluster it runs against, with three implementations: the local cluster
(tooling/cluster/drill.py, in the server package, found by entry point),
Kubernetes (`kube.py`) and an in-memory fake for unit tests (`fake.py`).

`run.py` is the drills' sequences, `load.py` the load and the colocated comparison,
`checks.py` the verdicts, `report.py` the report (JSON and text); `pdctl drill` is
`cli_drill.py`, the operator's runbook docs/runbooks/rollback.md."""
