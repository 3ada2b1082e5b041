"""Development and operations tooling around the runtime: the local cluster (processes,
faults, load drivers, drills), the `pdserve` command and the stub generator. Nothing in
runtime/ or the services imports it."""
