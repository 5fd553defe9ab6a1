"""graphrun.testing: reusable helpers for tests of every layer.

Nothing in the library imports it (an import-linter contract). Real ``graphrun
serve`` processes come from the library itself: :mod:`graphrun.local.stores`
(``start_store``, ``start_stores``, ``StoreProcess.stop/kill/check``), and hosts
from :class:`graphrun.local.netns.NetnsNetwork` (network namespaces, root).

* :mod:`~graphrun.testing.graphs` — seeded synthetic graphs (homogeneous, heterogeneous; larger
  ``community_graph``, smaller ``random_graph``/``random_hetero_graph`` for sampling).
* :mod:`~graphrun.testing.store` — ``make_partition_dir``, in-process store servers
  (``StoreThread``, ``store_threads``).
* :mod:`~graphrun.testing.procs` — ``run_graphrun`` (the CLI of this checkout in a child
  process) and ``child_env``.
* :mod:`~graphrun.testing.threads` — an ``RpcServer`` in a background thread
  (``ServerThread``) and the ``BackgroundLoop`` it shares with ``StoreThread``.
"""
