"""The ``GraphJob`` spec: one YAML file drives the local backend and the Kubernetes operator.

::

    apiVersion: graphrun.io/v1alpha1
    kind: GraphJob
    metadata: {name: sage}
    spec:
      graph:     {dataset: data/products}     # or {generator: {name: community, params: {...}}}
      partition: {method: metis, parts: 2, balanceTrain: true, haloHops: 1, output: parts/}
      runtime:   {machines: 2, storeServersPerMachine: 1, trainersPerMachine: 1,
                  samplerWorkersPerTrainer: 0, hosts: local}
      training:  {task: node-classification, epochs: 10, batchSize: 1000, fanouts: [25, 10]}
                 # or {entryPoint: "mypkg.train:main", args: [...]}
                 # or {script: train.py, args: [...]}
      placement: {}                                     # co-located (default), or
                                                        # {assignments: {"trainer:0": m1, ...}}
                                                        # or {planFile: plan.yaml}
                                                        # or {plan: {machines: [...],
                                                        #     assignments: {...}}} (inline)
      runPolicy: {backoffLimit: 0, activeDeadlineSeconds: 3600, cleanPodPolicy: Running}
      # Kubernetes only (the local backend ignores them):
      image: ghcr.io/graphrun/graphrun:0.1.0
      sharedVolume: {claimName: graphrun-data, mountPath: /data}
      replicaSpecs: {partitioner: {template: {...}}, worker: {template: {...}}}

YAML keys are camelCase; Python attributes are snake_case. Every model forbids unknown
keys, so a typo is an error naming the field. :func:`load_job` turns every problem into
one :class:`~graphrun.errors.SpecError` line: ``job.yaml: spec.runtime.trainersPerMachine:
Input should be greater than 0``. :func:`graphjob_json_schema` exports the JSON Schema
(the operator's CRD schema is generated from it).

Roles (see ``job_roles``) follow the shared naming: ``store:<part>`` (main store server of a
partition), ``store:<part>:<b>`` (its backup b >= 1), ``trainer:<rank>``,
``sampler:<rank>:<w>``, ``ps:<j>`` (parameter server j, ``training.sync: ps``).
Machines are named ``m0``, ``m1``, ... unless
``runtime.machineNames`` says otherwise.

One module per section, imported from here (``from graphrun.job.spec import GraphJob``):
:mod:`~graphrun.job.spec.base` (API identity, name patterns, upper bounds, the base
model), :mod:`~graphrun.job.spec.data` (graph, partition), :mod:`~graphrun.job.spec.runtime`,
:mod:`~graphrun.job.spec.training`, :mod:`~graphrun.job.spec.placement`,
:mod:`~graphrun.job.spec.policy` (run policy), :mod:`~graphrun.job.spec.job` (the document,
the Kubernetes-only fields, loading) and :mod:`~graphrun.job.spec.roles` (roles and their
machines).
"""

from __future__ import annotations

from graphrun.job.spec.base import (
    API_VERSION,
    ENTRY_POINT_PATTERN,
    JOB_NAME_MAX,
    JOB_NAME_PATTERN,
    KIND,
    LABEL_KEY_PATTERN,
    MAX_ARGS,
    MAX_BATCH_SIZE,
    MAX_EDGE_COUNT,
    MAX_EDGE_TYPES,
    MAX_EMBEDDING_DIM,
    MAX_EPOCHS,
    MAX_EVAL_NEGATIVES,
    MAX_FANOUT,
    MAX_HIDDEN,
    MAX_LAYERS,
    MAX_MACHINES,
    MAX_NEGATIVES,
    MAX_PARTS,
    MAX_RESTARTS,
    MAX_ROLES,
    MAX_SECONDS,
    MAX_SEED,
    MAX_TRAINERS,
    NAME_PATTERN,
    PLAN_KIND,
    PRESERVE,
    FreeForm,
    Scalar,
    SpecModel,
)
from graphrun.job.spec.data import (
    GENERATOR_BOUNDS,
    STORE_ADDRESS_PATTERN,
    GeneratorSpec,
    GraphSource,
    PartitionSpec,
    StoreRef,
)
from graphrun.job.spec.job import (
    GraphJob,
    GraphJobSpec,
    Metadata,
    ReplicaSpec,
    ReplicaSpecs,
    SharedVolume,
    format_validation_error,
    graphjob_json_schema,
    load_job,
    loads_job,
    parse_job,
)
from graphrun.job.spec.placement import (
    QUANTITY_PATTERN,
    RESOURCE_NAME,
    MachineResources,
    PlacementSpec,
    Quantity,
)
from graphrun.job.spec.policy import (
    FailurePolicy,
    ReplicaGroup,
    RunPolicy,
    SchedulingPolicy,
    SuccessPolicy,
    TargetGroup,
)
from graphrun.job.spec.roles import (
    Role,
    job_roles,
    plan_assignments,
    replica_machine,
    resolve_placement,
)
from graphrun.job.spec.runtime import ElasticSpec, RuntimeSpec, StoreFeatures
from graphrun.job.spec.training import Fanout, Task, TrainingSpec

__all__ = [
    "API_VERSION",
    "ENTRY_POINT_PATTERN",
    "GENERATOR_BOUNDS",
    "JOB_NAME_MAX",
    "JOB_NAME_PATTERN",
    "KIND",
    "LABEL_KEY_PATTERN",
    "MAX_ARGS",
    "MAX_BATCH_SIZE",
    "MAX_EDGE_COUNT",
    "MAX_EDGE_TYPES",
    "MAX_EMBEDDING_DIM",
    "MAX_EPOCHS",
    "MAX_EVAL_NEGATIVES",
    "MAX_FANOUT",
    "MAX_HIDDEN",
    "MAX_LAYERS",
    "MAX_MACHINES",
    "MAX_NEGATIVES",
    "MAX_PARTS",
    "MAX_RESTARTS",
    "MAX_ROLES",
    "MAX_SECONDS",
    "MAX_SEED",
    "MAX_TRAINERS",
    "NAME_PATTERN",
    "PLAN_KIND",
    "PRESERVE",
    "QUANTITY_PATTERN",
    "RESOURCE_NAME",
    "STORE_ADDRESS_PATTERN",
    "ElasticSpec",
    "FailurePolicy",
    "Fanout",
    "FreeForm",
    "GeneratorSpec",
    "GraphJob",
    "GraphJobSpec",
    "GraphSource",
    "MachineResources",
    "Metadata",
    "PartitionSpec",
    "PlacementSpec",
    "Quantity",
    "ReplicaGroup",
    "ReplicaSpec",
    "ReplicaSpecs",
    "Role",
    "RunPolicy",
    "RuntimeSpec",
    "Scalar",
    "SchedulingPolicy",
    "SharedVolume",
    "SpecModel",
    "StoreFeatures",
    "StoreRef",
    "SuccessPolicy",
    "TargetGroup",
    "Task",
    "TrainingSpec",
    "format_validation_error",
    "graphjob_json_schema",
    "job_roles",
    "load_job",
    "loads_job",
    "parse_job",
    "plan_assignments",
    "replica_machine",
    "resolve_placement",
]
