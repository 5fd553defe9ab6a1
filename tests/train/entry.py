"""A user entry point for tests: it only sees the context."""

from graphrun.train.context import TrainContext


def main(ctx: TrainContext) -> dict:
    return {
        "rank": ctx.rank,
        "world_size": ctx.world_size,
        "args": list(ctx.args),
        "seeds": int(ctx.data.seeds("train").numel()),
    }
