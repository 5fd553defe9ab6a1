"""graphrun.serving: online answers from a trained job's checkpoint over the running store.

* :mod:`~graphrun.serving.model` — a job's model, built as its trainer built it, with its
  checkpoint's weights;
* :mod:`~graphrun.serving.protocol` — the Open Inference Protocol (KServe v2 REST)
  requests and answers, checked against the endpoint's bounds;
* :mod:`~graphrun.serving.engine` — one forward for a micro-batch of queries: node ids
  sampled from the store (the job's fanouts and a seed, or every neighbour) or a new
  node's features and edges, features through the trainers' path, or the rows
  ``graphrun infer embed`` wrote (:mod:`~graphrun.serving.embed`);
* :mod:`~graphrun.serving.app` — the HTTP endpoint (Starlette on uvicorn): routes,
  bearer token, micro-batching, Prometheus metrics, readiness from a store probe.

docs/serving.md is the user's page.
"""
