"""graphrun.placement: where a job's tasks run, decided by simulation.

A leaf package: numpy, msgspec, pydantic, pyyaml (numba when installed) and graphrun's
bottom modules (errors, files, names, wire); no torch, no zmq, nothing of the runtime. The
pieces, from input to plan:

- :mod:`.cluster` — machines (cpu, memory, gpus, NIC egress/ingress) from YAML;
- :mod:`.job` — tasks (store per partition, samplers, trainers, PS) and demands;
- :mod:`.profile` — per-iteration times and bytes as empirical distributions; the
  JSON-lines batch-record schema the runtime emits; built-in synthetic profiles;
- :mod:`.workload` — (cluster, job, placement) -> :class:`.dag.Dag` of compute and flows;
- :mod:`.oes` — the event-driven fluid simulator (priority / fair / FIFO);
- :mod:`.bounds` — lower bounds (port, compute, chain, energetic);
- :mod:`.cost`, :mod:`.search`, :mod:`.baselines` — scoring, IFS / ETP / annealing,
  co-location / random / first-fit / exhaustive;
- :mod:`.plan` — the PlacementPlan file; :mod:`.planner` — IFS + ETP in one call;
- :mod:`.simgrid_check` — cross-check of the fluid model against SimGrid.
"""
