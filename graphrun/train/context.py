"""The one object a trainer's code receives: :class:`TrainContext`.

Built-in tasks and user entry points (``module:function``, called as
``function(ctx)``) get the same context — the trainer's rank, the world size, the
device, the graph data (seeds, loaders, embeddings; in-process or served by the
store), the configuration and where to write metrics — and read no environment
variables.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from graphrun.train.config import TrainConfig
from graphrun.train.data import GraphData
from graphrun.train.ddp import DDPConfig
from graphrun.train.metrics import MetricsLog
from graphrun.train.suspend import StopFlag


@dataclass(frozen=True)
class TrainContext:
    config: TrainConfig
    data: GraphData
    ddp: DDPConfig
    metrics: MetricsLog
    graph: Any = None  # the distributed graph handle (graphrun.distributed.DistGraph) if any
    # set once the trainer is told to stop (SIGTERM): an entry point may check it between
    # steps, write its checkpoint and raise graphrun.errors.Suspended (built-in tasks do)
    stop: StopFlag | None = None
    ps: Any = None  # graphrun.train.ps.PSSettings: dense parameters on parameter servers
    elastic: Any = None  # graphrun.train.elastic.Regroup: re-form without a lost machine

    @property
    def rank(self) -> int:
        return self.ddp.rank

    @property
    def world_size(self) -> int:
        return self.ddp.world_size

    @property
    def device(self) -> torch.device:
        return self.ddp.device

    @property
    def is_main(self) -> bool:
        return self.ddp.rank == 0

    @property
    def args(self) -> tuple[str, ...]:
        """The user's arguments (``training.args`` of the job)."""
        return self.config.args
