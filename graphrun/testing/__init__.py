"""graphrun.testing: reusable helpers for tests of every layer (never imported by the library).

* :mod:`~graphrun.testing.graphs` — seeded synthetic graphs (homogeneous, heterogeneous; larger
  ``community_graph``, smaller ``random_graph``/``random_hetero_graph`` for sampling).
* :mod:`~graphrun.testing.store` — ``make_partition_dir``, in-process store servers
  (``StoreThread``, ``store_threads``).
* :mod:`~graphrun.testing.procs` — real ``graphrun serve`` processes: ``start_store``,
  ``start_stores``, ``StoreProcess.stop/kill/check`` (child failures re-raised as
  ``ChildFailed`` with the child's log).
* :mod:`~graphrun.testing.netns` — two network namespaces joined by a veth pair (root).
* :mod:`~graphrun.testing.threads` — an ``RpcServer`` in a background thread
  (``ServerThread``) and the ``BackgroundLoop`` it shares with ``StoreThread``.
"""
