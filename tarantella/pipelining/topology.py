"""Which rank runs which pipeline stage of which data-parallel replica.

Ranks of one pipeline are consecutive (stage = rank % stages, replica =
rank // stages): the activations between neighbouring stages are the heaviest
traffic, and consecutive ranks usually share a node. The replicas of one stage
form a sub-group that averages that stage's gradients.
"""
from __future__ import annotations

import dataclasses

__all__ = ["Placement", "place", "check_stage_count"]


@dataclasses.dataclass(frozen=True)
class Placement:
    rank: int
    size: int
    num_stages: int

    @property
    def num_replicas(self) -> int:
        return self.size // self.num_stages

    @property
    def stage(self) -> int:
        return self.rank % self.num_stages

    @property
    def replica(self) -> int:
        return self.rank // self.num_stages

    def rank_of(self, replica: int, stage: int) -> int:
        return replica * self.num_stages + stage

    def peer(self, stage: int) -> int:
        """The rank running `stage` in this rank's replica."""
        return self.rank_of(self.replica, stage)

    @property
    def is_first_stage(self) -> bool:
        return self.stage == 0

    @property
    def is_last_stage(self) -> bool:
        return self.stage == self.num_stages - 1


def check_stage_count(num_stages: int, size: int, data_parallel: bool) -> None:
    if num_stages < 1:
        raise ValueError(f"tarantella: a pipeline needs at least 1 stage, got {num_stages}")
    if size % num_stages:
        raise ValueError(f"tarantella: {num_stages} pipeline stages do not divide the {size} ranks of the job; "
                         f"every data-parallel replica needs one rank per stage: run on a multiple of "
                         f"{num_stages} ranks, or change the number of stages (SplitLayers / num_pipeline_stages)")
    if size > num_stages and not data_parallel:
        raise ValueError(f"tarantella: {size} ranks for a {num_stages}-stage pipeline leaves "
                         f"{size // num_stages} replicas; pipelining alone needs exactly {num_stages} ranks; "
                         f"use parallel_strategy=tnt.ParallelStrategy.ALL for pipelining with data parallelism")


def place(rank: int, size: int, num_stages: int, data_parallel: bool = True) -> Placement:
    check_stage_count(num_stages, size, data_parallel)
    return Placement(rank, size, num_stages)
