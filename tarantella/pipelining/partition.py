"""Cutting a functional Keras model into pipeline stages.

Every operation of the model gets a stage, either from the SplitLayers
(`stages_from_split_layers`) or from the automatic balancing
(tarantella/pipelining/balance.py). `partition` then builds, for each stage, a
Keras sub-model of the SAME layer objects (so weights are shared with the
user's model and nothing is copied) plus the list of tensors that cross
between stages.

Note [Edges go straight to their consumer]
A tensor produced in stage p and consumed in stages q1, q2 > p travels once
to each consumer, directly (one Edge per consumer), not hop by hop through the
stages in between. Model outputs count as consumed by the last stage, which
computes the loss; an output produced earlier travels there and is passed
through. In backprop each edge carries the gradient the other way, and the
producer sums the gradients of all edges of one tensor.
"""
from __future__ import annotations

import dataclasses

import keras

from tarantella.pipelining.split_layer import SplitLayer, check_single_tensor

__all__ = ["Edge", "StagePlan", "Partition", "graph_of", "stages_from_split_layers", "partition"]


@dataclasses.dataclass(frozen=True)
class Edge:
    """One tensor travelling from stage `source` to stage `target` (Note [Edges go straight to their consumer])."""
    id: int              # position in Partition.edges; part of the message tag
    tensor_name: str
    source: int
    target: int
    shape: tuple         # without the batch dimension, fully defined
    dtype: str

    @property
    def differentiable(self) -> bool:
        return self.dtype.startswith(("float", "bfloat"))


@dataclasses.dataclass
class StagePlan:
    stage: int
    model: keras.Model | None    # the stage's layers (the user's layer objects); None if not built here
    input_edges: list[int]       # edges whose tensors are the sub-model's inputs, in its input order
    output_edges: list[list[int]]  # per sub-model output: the edges it is sent on
    layer_names: list[str]
    # Last stage only: per model output (flattened), ("computed", i) = sub-model output i,
    # ("received", edge id) = a tensor received from an earlier stage.
    model_outputs: list[tuple[str, int]] = dataclasses.field(default_factory=list)


@dataclasses.dataclass
class Partition:
    num_stages: int
    edges: list[Edge]
    stages: list[StagePlan]

    def edges_into(self, stage: int) -> list[Edge]:
        return [edge for edge in self.edges if edge.target == stage]

    def edges_out_of(self, stage: int) -> list[Edge]:
        return [edge for edge in self.edges if edge.source == stage]

    def describe(self) -> str:
        lines = []
        for plan in self.stages:
            crossing = [self.edges[e].tensor_name for e in plan.input_edges]
            lines.append(f"stage {plan.stage}: {len(plan.layer_names)} operation(s) "
                         f"[{', '.join(plan.layer_names)}]" + (f"; receives {crossing}" if crossing else ""))
        return "\n".join(lines)


@dataclasses.dataclass
class Graph:
    """The model's operations in topological order, with tensors as ids."""
    operations: list                 # keras Operations (InputLayers included)
    inputs_of: list[list[int]]       # tensor ids each operation consumes
    outputs_of: list[list[int]]      # tensor ids each operation produces
    tensors: dict                    # id -> KerasTensor
    model_inputs: list[int]          # flattened keras.tree order of model.input
    model_outputs: list[int]         # flattened keras.tree order of model.output


def graph_of(model: keras.Model) -> Graph:
    if not hasattr(model, "operations") or not hasattr(model, "input"):
        raise TypeError("tarantella: pipelining needs a functional Keras model (keras.Model(inputs, outputs)), "
                        f"got {type(model).__name__}; subclassed models cannot be cut into stages")
    try:
        model_input = model.input
    except (AttributeError, ValueError) as error:
        raise TypeError("tarantella: pipelining needs a functional Keras model with defined inputs "
                        f"(keras.Model(inputs, outputs) or a built Sequential): {error}") from None
    _check_no_shared_layers(model)
    operations, inputs_of, outputs_of, tensors = [], [], [], {}
    for operation in model.operations:
        try:
            consumed = [] if isinstance(operation, keras.layers.InputLayer) else keras.tree.flatten(operation.input)
            produced = keras.tree.flatten(operation.output)
        except (AttributeError, ValueError, RuntimeError):
            raise ValueError(f"tarantella: the layer {operation.name!r} is called more than once in the model "
                             f"(a shared layer); pipelining does not support shared layers yet") from None
        if isinstance(operation, SplitLayer):
            check_single_tensor(operation.name, operation.input)
        _check_no_nested_split(operation)
        operations.append(operation)
        inputs_of.append([id(t) for t in consumed])
        outputs_of.append([id(t) for t in produced])
        tensors.update({id(t): t for t in consumed + produced})
    return Graph(operations, inputs_of, outputs_of, tensors,
                 [id(t) for t in keras.tree.flatten(model_input)], [id(t) for t in keras.tree.flatten(model.output)])


def _check_no_shared_layers(model: keras.Model) -> None:
    """The cut assigns stages per layer, so a layer called twice in the model (a shared layer) could
    end up on both sides of a cut with one set of weights; Keras's `layer.input` would silently
    describe only its first call. Refused before anything is built."""
    by_depth = getattr(model, "_nodes_by_depth", None)
    if by_depth is None:
        calls = {id(op): len(getattr(op, "_inbound_nodes", [])) for op in model.operations}
    else:
        calls = {}
        for nodes in by_depth.values():
            for node in nodes:
                calls[id(node.operation)] = calls.get(id(node.operation), 0) + 1
    for operation in model.operations:
        if calls.get(id(operation), 1) > 1 and not isinstance(operation, keras.layers.InputLayer):
            raise ValueError(f"tarantella: the layer {operation.name!r} is called {calls[id(operation)]} times in the "
                             f"model (a shared layer); a pipeline cuts the model by layer and cannot share one "
                             f"layer's weights across a cut: give each call its own layer, or train without "
                             f"pipelining")


def _check_no_nested_split(operation) -> None:
    """A SplitLayer inside a nested model would be silently ignored: the cut sees only the outer graph."""
    stack = list(getattr(operation, "layers", []) if isinstance(operation, keras.Model) else [])
    while stack:
        layer = stack.pop()
        if isinstance(layer, SplitLayer):
            raise ValueError(f"tarantella: the SplitLayer {layer.name!r} is inside the nested model "
                             f"{operation.name!r}; pipeline cuts are made only in the outer functional model: "
                             f"put the SplitLayer in the outer model, between calls of its nested models")
        if isinstance(layer, keras.Model):
            stack.extend(layer.layers)


def stages_from_split_layers(graph: Graph) -> list[int]:
    """Stage of each operation: the most SplitLayers on any path from the inputs to it."""
    stage_of_tensor: dict[int, int] = {}
    stages = []
    for operation, consumed, produced in zip(graph.operations, graph.inputs_of, graph.outputs_of):
        stage = max((stage_of_tensor[t] for t in consumed), default=0)
        stages.append(stage)
        after = stage + 1 if isinstance(operation, SplitLayer) else stage
        stage_of_tensor.update({t: after for t in produced})
    # A SplitLayer's output belongs to the next stage, but the layer (an identity) runs in its input's stage.
    return stages


def _check_inputs_on_first_stage(graph: Graph, stage_of_op: list[int]) -> None:
    model_inputs = set(graph.model_inputs)
    for operation, consumed, stage in zip(graph.operations, graph.inputs_of, stage_of_op):
        late = [graph.tensors[t].name for t in consumed if t in model_inputs]
        if late and stage > 0:
            raise ValueError(
                f"tarantella: the layer {operation.name!r} in pipeline stage {stage} reads the model input(s) "
                f"{late} directly, but all model inputs must be consumed by the first stage (only stage 0 "
                f"reads the data); move the SplitLayer(s) so that {operation.name!r} comes before them, or "
                f"pass the input through the cut with its own SplitLayer")


def _edge_shape(tensor, name: str) -> tuple:
    shape = tuple(tensor.shape[1:])
    if any(dim is None for dim in shape):
        raise ValueError(f"tarantella: the tensor {name!r} crosses between pipeline stages but its shape "
                         f"{tuple(tensor.shape)} is not fully defined beyond the batch dimension; the receiving "
                         f"stage must know its size: give the model's Input layers fixed shapes")
    return shape


def partition(model: keras.Model, graph: Graph, stage_of_op: list[int], num_stages: int,
              build_stage: int | None = None) -> Partition:
    """Sub-models and edges for `stage_of_op` (one stage per operation of `graph`). With
    `build_stage`, only that stage's sub-model is built (the others' `model` is None)."""
    present = sorted(set(stage for op, stage in zip(graph.operations, stage_of_op)
                         if not isinstance(op, keras.layers.InputLayer)))
    if present != list(range(num_stages)):
        missing = sorted(set(range(num_stages)) - set(present))
        raise ValueError(f"tarantella: the model splits into stages {present}, but {num_stages} stages were "
                         f"asked for; stage(s) {missing} would hold no layers. With SplitLayers, the number of "
                         f"stages is one more than the number of SplitLayers on the longest path; set "
                         f"num_pipeline_stages to that (or leave it unset)")
    _check_inputs_on_first_stage(graph, stage_of_op)
    producer_stage = {}
    for consumed, produced, stage in zip(graph.inputs_of, graph.outputs_of, stage_of_op):
        producer_stage.update({t: stage for t in produced})
    model_inputs = set(graph.model_inputs)
    last = num_stages - 1

    consumers: dict[int, set[int]] = {}   # tensor -> later stages that need it
    for consumed, stage in zip(graph.inputs_of, stage_of_op):
        for t in consumed:
            if t not in model_inputs and producer_stage[t] < stage:
                consumers.setdefault(t, set()).add(stage)
    for t in graph.model_outputs:
        if t in model_inputs:
            raise ValueError(f"tarantella: the model input {graph.tensors[t].name!r} is also a model output; "
                             f"a pipelined model's outputs must be computed by its layers")
        if producer_stage[t] < last:
            consumers.setdefault(t, set()).add(last)

    # Edge ids are message tags: order them by graph position, the same on every rank (tensor names are
    # not: Keras numbers them per process).
    position = {t: (i, j) for i, produced in enumerate(graph.outputs_of) for j, t in enumerate(produced)}
    edges, edge_ids = [], {}
    for t in sorted(consumers, key=lambda t: position[t]):
        for target in sorted(consumers[t]):
            tensor = graph.tensors[t]
            edge = Edge(len(edges), tensor.name, producer_stage[t], target, _edge_shape(tensor, tensor.name),
                        str(keras.backend.standardize_dtype(tensor.dtype)))
            edges.append(edge)
            edge_ids[(t, target)] = edge.id

    stages = []
    for stage in range(num_stages):
        ops = [i for i, s in enumerate(stage_of_op) if s == stage
               and not isinstance(graph.operations[i], keras.layers.InputLayer)]
        consumed = {t for i in ops for t in graph.inputs_of[i]}
        produced = [t for i in ops for t in graph.outputs_of[i]]
        if stage == 0:
            inputs, input_edges = list(graph.model_inputs), []
        else:
            input_edges = sorted(edge_ids[(t, stage)] for t in consumed if (t, stage) in edge_ids)
            id_of_edge = {e: t for (t, target), e in edge_ids.items() if target == stage}
            inputs = [id_of_edge[e] for e in input_edges]
        outputs = [t for t in produced if t in consumers]
        output_edges = [[edge_ids[(t, target)] for target in sorted(consumers[t])] for t in outputs]
        model_outputs = []
        if stage == last:
            for t in graph.model_outputs:
                if producer_stage[t] == last:
                    if t not in outputs:
                        outputs.append(t)
                        output_edges.append([])
                    model_outputs.append(("computed", outputs.index(t)))
                else:
                    model_outputs.append(("received", edge_ids[(t, last)]))
        if not outputs:
            raise ValueError(f"tarantella: pipeline stage {stage} computes nothing that a later stage or the loss "
                             f"uses (its layers: {[graph.operations[i].name for i in ops]}); move the SplitLayers")
        sub_model = None
        if build_stage is None or build_stage == stage:
            sub_model = keras.Model([graph.tensors[t] for t in inputs], [graph.tensors[t] for t in outputs],
                                    name=f"{model.name}_stage_{stage}")
        stages.append(StagePlan(stage, sub_model, input_edges, output_edges,
                                [graph.operations[i].name for i in ops], model_outputs))
    return Partition(num_stages, edges, stages)
