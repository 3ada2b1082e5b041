"""The SLA autoscaler: sizes the prefill, decode and mixed pools for the observed load.

    observe.py    the routers' /metrics -> ObservedLoad (rate, prompt and output lengths)
    recommend.py  the planner (sim.plan) -> Target: the least GPUs that meet the SLOs
    policy.py     Target -> Decision: hysteresis, cool-down, a bound on each step (pure)
    scaler.py     the interface that resizes pools; kube.py (Deployments' scale
                  subresource) and tooling/cluster/autoscale.py (the local launcher) implement it
    loop.py       one decision every interval, each recorded with its reason
    __main__.py   `python -m autoscaler --kube` (locally: tooling/cluster/autoscale.py)

`pdctl autoscale status` shows what it decided and why (docs/autoscaler.md).
"""
