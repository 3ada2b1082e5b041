"""pdserve's capacity tools: a discrete-event simulator of a pdserve cluster
(sim/cluster.py), the profiles it runs on (sim/profile.py, sim/gpu.py), the
placement planner behind `pdctl plan` (sim/plan.py). docs/design.md, "The
simulator", says how it is built and where it is known to be wrong.

Nothing here imports a service's process code: the router's pricing and decision
(router/pricing, router/requests/planner.py) are called as the live router calls
them, over snapshots the simulator builds."""
