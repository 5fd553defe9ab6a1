"""What every section of the GraphJob spec shares: the API identity, name patterns,
the upper bounds of every count, and the base model (camelCase keys, unknown keys
refused, frozen)."""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field
from pydantic.alias_generators import to_camel

from graphrun.names import MAX_TRAINERS  # noqa: F401 (the spec's bound, shared)

API_VERSION = "graphrun.io/v1alpha1"
KIND = "GraphJob"
PLAN_KIND = "PlacementPlan"

# A DNS-1123 label (machine names, node-label values).
NAME_PATTERN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"
# A job's name: a DNS-1035 label (a letter first), because the operator names a Service
# after it (``<name>-workers``) and Service names must be DNS-1035 labels; at most 40
# characters, so every child name (``<name>-partitioner``, ``<name>-worker-1023``) stays a
# legal label of at most 63.
JOB_NAME_PATTERN = r"^[a-z]([-a-z0-9]*[a-z0-9])?$"
JOB_NAME_MAX = 40
# A Kubernetes label key: an optional DNS-subdomain prefix and '/', then a name.
LABEL_KEY_PATTERN = (
    r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?"
    r"[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$"
)
ENTRY_POINT_PATTERN = r"^[A-Za-z_][\w.]*:[A-Za-z_]\w*$"

# Upper bounds of the counts a spec gives. Each sizes memory (model layers, a mini-batch,
# a number of processes, ...) or a loop; they are far above what a job needs and far
# below what would make an allocator fail minutes into the job with a traceback: a
# value above one is refused up front, naming the field (``hidden: 1e10`` was an
# allocator traceback from every trainer).
MAX_MACHINES = 1024
MAX_PARTS = 4096
MAX_ROLES = 16384  # store servers + trainers + sampler workers of a job
MAX_EPOCHS = 1_000_000
MAX_BATCH_SIZE = 1 << 20  # seeds per mini-batch and trainer
MAX_FANOUT = 100_000  # neighbours per seed and layer
MAX_LAYERS = 16  # len(fanouts): one model layer each
MAX_EDGE_TYPES = 4096  # keys of fanoutsPerEtype
MAX_HIDDEN = 1 << 16  # hidden channels
MAX_EMBEDDING_DIM = 1 << 14  # learnable embedding width, per node
MAX_NEGATIVES = 1024  # negative samples per positive edge
MAX_EVAL_NEGATIVES = 100_000
MAX_EDGE_COUNT = 1 << 40  # edgesPerEpoch, evalSubset
MAX_ARGS = 4096  # entry point / script arguments
MAX_SEED = 2**63 - 1
MAX_RESTARTS = 1000  # runPolicy.backoffLimit
MAX_SECONDS = 366 * 24 * 3600  # every duration of a run policy: a year

PRESERVE = {"x-kubernetes-preserve-unknown-fields": True}
FreeForm = Annotated[dict[str, Any], Field(json_schema_extra=PRESERVE)]
Scalar = Annotated[int | float | str | bool, Field(json_schema_extra=PRESERVE)]


class SpecModel(BaseModel):
    model_config = ConfigDict(
        alias_generator=to_camel,
        populate_by_name=True,
        extra="forbid",
        frozen=True,
        allow_inf_nan=False,  # `lr: .inf` trained to NaN and succeeded
    )
