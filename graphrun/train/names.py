"""The built-in tasks and the models each offers, by name (no torch: the job spec and
the operator validate ``training.model`` with it before anything starts).

The first model of a task is its default. Classes are in :mod:`graphrun.train.models`:

* ``sage`` — GraphSAGE (``SAGEConv``, mean), ``gcn`` — GCN (``GCNConv``), ``gat`` — GAT
  (``GATConv``, 4 heads in hidden layers);
* ``rgcn`` — R-GCN (Schlichtkrull et al. 2018, :mod:`graphrun.train.rgcn`): a weight per
  relation (from ``training.numBases`` shared bases when set), each relation's messages
  averaged on their own, one self-loop weight; ``hetero-sage`` — per relation a
  ``SAGEConv`` (its own neighbour and root weights), summed per destination type in a
  ``HeteroConv``.
"""

from __future__ import annotations

from typing import Literal, get_args

#: The built-in tasks: the one spelling of the list (the spec's ``training.task``, the
#: trainer's config and :data:`MODELS` take it from here).
Task = Literal["node-classification", "hetero-node-classification", "link-prediction"]
TASKS: tuple[Task, ...] = get_args(Task)
#: How a GraphSAGE layer aggregates: a scatter over the edges or a CSR product.
AggrPath = Literal["scatter", "csr"]

MODELS: dict[str, tuple[str, ...]] = {
    "node-classification": ("sage", "gcn", "gat"),
    "hetero-node-classification": ("rgcn", "hetero-sage"),
    "link-prediction": ("sage",),
}


def model_name(task: str, model: str | None) -> str:
    """The model ``task`` runs: ``model`` if the task offers it, else the task's default.
    Raises ValueError naming the known models."""
    known = MODELS.get(task)
    if known is None:
        raise ValueError(f"task: {task!r} is not one of {', '.join(MODELS)}")
    if model is None:
        return known[0]
    if model not in known:
        raise ValueError(f"model: {model!r} is not a model of {task} (known: {', '.join(known)})")
    return model
