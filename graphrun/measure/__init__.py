"""Cluster measurement (``graphrun probe``): what hosts and the links between them can do,
measured on local or netns hosts (:mod:`~graphrun.measure.probe`) or by the Kubernetes
probe's members (:mod:`~graphrun.measure.member`), into a placement cluster file."""
