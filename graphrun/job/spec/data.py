"""The spec's graph and partition sections: where the graph comes from and how it is cut."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import AfterValidator, Field, model_validator

from graphrun.job.spec.base import MAX_PARTS, Scalar, SpecModel
from graphrun.names import STORE_ADDRESS_PATTERN, store_address

#: upper bounds of the generator's sizes (``graphrun generate`` flags, camelCase)
GENERATOR_BOUNDS: dict[str, float] = {
    "nodes": 1 << 32, "avgDegree": 100_000, "featDim": 1 << 16, "classes": 1 << 20,
    "chunks": MAX_PARTS,
}  # fmt: skip


class GeneratorSpec(SpecModel):
    """A synthetic graph made by ``graphrun generate <name>`` with these parameters."""

    name: Literal["community", "academic"] = Field(
        description="the generator: community (homogeneous, classes as communities) or "
        "academic (heterogeneous: papers, authors, institutions)"
    )
    params: dict[str, Scalar] = Field(
        default_factory=dict,
        description="generator flags, e.g. {nodes: 100000, avgDegree: 20, seed: 0}",
    )

    @model_validator(mode="after")
    def _bounded(self) -> GeneratorSpec:
        for key, bound in GENERATOR_BOUNDS.items():
            v = self.params.get(key)
            if isinstance(v, int | float) and not isinstance(v, bool) and v > bound:
                raise ValueError(f"params.{key}: {v:g} is more than {bound:g}")
        return self


class StoreRef(SpecModel):
    """A running store (``graphrun serve``) the job uses instead of partitioning and
    serving the graph itself. It is shared: the job never stops it. Its key comes from a
    file (``graphrun run``) or a Secret holding ``job.key`` (the operator)."""

    addresses: list[
        Annotated[str, Field(pattern=STORE_ADDRESS_PATTERN), AfterValidator(store_address)]
    ] = Field(
        min_length=1,
        description="the main server of every partition, partition order (tcp://host:port)",
    )
    key_file: str | None = Field(
        default=None, min_length=1,
        description="graphrun run: the store's key file (relative to the job file)",
    )  # fmt: skip
    key_secret: str | None = Field(
        default=None, min_length=1, max_length=253,
        description="Kubernetes: a Secret in the job's namespace holding the store's job.key",
    )  # fmt: skip

    @model_validator(mode="after")
    def _a_key(self) -> StoreRef:
        if self.key_file is None and self.key_secret is None:
            raise ValueError("give keyFile (graphrun run) or keySecret (Kubernetes)")
        return self


class GraphSource(SpecModel):
    """Where the graph comes from: a dataset directory, a generator, or a running store."""

    dataset: str | None = Field(
        default=None, min_length=1, description="a dataset directory (graphrun-dataset format)"
    )
    generator: GeneratorSpec | None = None
    store: StoreRef | None = None

    @model_validator(mode="after")
    def _one_source(self) -> GraphSource:
        if sum(x is not None for x in (self.dataset, self.generator, self.store)) != 1:
            raise ValueError("give exactly one of dataset, generator, store")
        return self


# --- partition --------------------------------------------------------------------------


class PartitionSpec(SpecModel):
    """How the graph is cut. ``parts`` defaults to ``runtime.machines``."""

    mode: Literal["single", "parallel", "distributed"] = Field(
        default="single",
        description="single: one process; parallel: every core of one machine (KaMinPar); "
        "distributed: every machine of the job, one rank each (XtraPuLP-style label "
        "propagation over gloo), reading a chunked dataset",
    )
    method: Literal["metis", "random", "kaminpar"] | None = Field(
        default=None, description="algorithm (default metis; kaminpar in parallel mode)"
    )
    parts: int | None = Field(
        default=None, gt=0, le=MAX_PARTS,
        description="number of partitions (default: runtime.machines)",
    )  # fmt: skip
    balance_train: bool = Field(
        default=False, description="balance training nodes (train_mask) across parts too"
    )
    balance_edges: bool = Field(default=False, description="balance owned edges across parts too")
    halo_hops: int = Field(
        default=1, ge=0, le=4, description="hops of halo nodes stored with each partition"
    )
    output: str | None = Field(
        default=None, min_length=1, description="partition directory; default <name>-parts"
    )

    @model_validator(mode="after")
    def _mode_fits(self) -> PartitionSpec:
        if self.mode == "distributed" and self.method is not None:
            raise ValueError(
                f"method: {self.method!r} runs on one machine; mode 'distributed' runs "
                "label propagation on every machine"
            )
        if self.mode == "parallel" and self.method not in (None, "kaminpar"):
            raise ValueError(
                f"method: {self.method!r} runs in one process; mode 'parallel' uses kaminpar"
            )
        return self

    @property
    def algorithm(self) -> str:
        """The method that runs: as given, else kaminpar in parallel mode, xtrapulp in
        distributed mode, else metis."""
        default = {"parallel": "kaminpar", "distributed": "xtrapulp"}.get(self.mode, "metis")
        return self.method or default

    def cli_args(self) -> list[str]:
        """``graphrun partition`` flags for this spec (after DATASET OUT --parts N)."""
        args = ["--mode", self.mode]
        args += [] if self.mode == "distributed" else ["--method", self.algorithm]
        args += ["--halo", str(self.halo_hops)]
        args += ["--balance-train"] if self.balance_train else []
        return args + (["--balance-edges"] if self.balance_edges else [])
