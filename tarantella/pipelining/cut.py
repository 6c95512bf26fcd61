"""Deciding where the model is cut: at its SplitLayers, or automatically."""
from __future__ import annotations

import logging

import keras

from tarantella import collectives, runtime
from tarantella.pipelining.split_layer import SplitLayer
from tarantella.pipelining import balance
from tarantella.pipelining.partition import Graph, stages_from_split_layers

__all__ = ["choose_stages"]

logger = logging.getLogger("tarantella")


def choose_stages(model: keras.Model, graph: Graph, num_pipeline_stages: int | None, size: int,
                  data_parallel: bool, balance_by: str = "time") -> tuple[list[int], int]:
    """(stage of each operation, number of stages). Collective when the cut is automatic."""
    has_splits = any(isinstance(op, SplitLayer) for op in graph.operations)
    if has_splits:
        stages = stages_from_split_layers(graph)
        count = max(stages) + 1
        if num_pipeline_stages is not None and num_pipeline_stages != count:
            raise ValueError(f"tarantella: the model's SplitLayers cut it into {count} stages, but "
                             f"num_pipeline_stages={num_pipeline_stages}; leave num_pipeline_stages unset or "
                             f"make them agree")
        return stages, count
    if num_pipeline_stages is None:
        if data_parallel:
            raise ValueError("tarantella: the model has no SplitLayer; with data parallelism, say how many "
                             "pipeline stages to cut it into (num_pipeline_stages=...)")
        num_pipeline_stages = size
    if balance_by not in ("time", "parameters"):
        raise ValueError(f"tarantella: balance_by must be 'time' or 'parameters', got {balance_by!r}")
    cuts = None
    if runtime.is_master_rank():
        costs, unit = None, "parameters"
        if balance_by == "time":
            costs, unit = balance.measure_costs(model, graph), "s"
        if costs is None:
            costs, unit = balance.parameter_costs(graph), "parameters"
        cuts = balance.balanced_cut(costs, num_pipeline_stages, balance.earliest_cut(graph))
        _announce(graph, costs, cuts, unit)
    cuts = collectives.broadcast_object(cuts, root=runtime.get_master_rank()) if size > 1 else cuts
    return balance.stages_from_cut(len(graph.operations), cuts), num_pipeline_stages


def _announce(graph: Graph, costs: list[float], cuts: list[int], unit: str) -> None:
    bounds = [0] + cuts + [len(costs)]
    lines = [f"tarantella: automatic pipeline cut into {len(bounds) - 1} stages, balancing "
             f"{'measured time per layer' if unit == 's' else 'parameter count'}:"]
    for stage, (start, stop) in enumerate(zip(bounds, bounds[1:])):
        names = [op.name for op in graph.operations[start:stop] if not isinstance(op, keras.layers.InputLayer)]
        cost = sum(costs[start:stop])
        shown = f"{cost * 1e3:.2f} ms" if unit == "s" else f"{int(cost)} parameters"
        lines.append(f"  stage {stage}: {names[0]} .. {names[-1]} ({len(names)} layers, {shown})")
    print("\n".join(lines), flush=True)
