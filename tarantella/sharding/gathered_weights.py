"""ZeRO stage 3 (shard="weights"): each rank keeps its own variables only; a layer's weights are gathered
for its forward pass, gathered again for its backward pass, and freed after each.

Note [Weights gathered layer by layer]
Each trainable variable belongs, whole, to one rank (Note [Whole variables to
owners, balanced by bytes] in owners.py); the other ranks release it
(Note [Releasing a variable] in tarantella/stage_state.py), or never
give it storage when the model was built in tnt.deferred_weights(). The
model's units (its top-level layers, and the layers of nested Functional and
Sequential models) each run their `call` as one differentiable function of
their inputs and of the values of the variables this rank owns
(tf.custom_gradient):
- forward: the owners send the unit's weights, the others receive them (the
  engine's point-to-point channels, as the hand-over of stage 1), and the
  layer's own `call` runs inside a Keras StatelessScope that maps each
  variable to its gathered value (the mechanism Keras gives JAX's stateless
  calls). Nothing else holds the gathered values, so TensorFlow frees them
  once the layer's operations have read them;
- backward: the unit's weights are gathered again, its forward is run again
  on the same inputs under a GradientTape, and the tape gives the gradients
  of the inputs and of every weight. Each weight's gradient goes to its owner,
  which adds the ranks' gradients in the order of the allreduce it replaces
  (Note [Gradients summed on their owners] in gradients_to_owners.py), so the
  owner's variable receives the sum over the ranks, as stage 2's does.
Recomputing costs one more forward pass of the model per step: TensorFlow
keeps the tensors a gradient needs inside the recorded operation that made
them, so a weight read by the forward pass would otherwise stay alive until
its backward pass, and the whole model would be held at the end of the
forward pass. The recomputed pass gives the bits of the first (the same
operations on the same inputs), so the gradients are those of unsharded
training, as long as TensorFlow runs the operations as written: Grappler's
arithmetic optimizer (on by default) rewrites element-wise arithmetic by the
shape of the graph around it, and a recomputed forward feeding only its
gradient is another shape than a forward whose results also flow on. A relu
layer keeps its bits; gelu's rounds differently (measured in
tests/keras/programs/stage3_arithmetic.py); with the optimizer off (exact
mode turns it off) every layer is unsharded training's bit for bit.
The unit's other state (BatchNormalization's moving statistics, the seed
states of random layers) is not sharded: it is read once before the forward
pass, both passes read that value (so a random layer draws the same mask
twice), and the forward pass's updates of it are written after it (the
recomputed pass's are dropped). Losses a layer adds in `call` are outputs of
the function too, so their gradients flow.
A unit's weights are gathered when the previous unit's inputs exist (one
unit ahead: its transfer overlaps the previous unit's compute), and, in the
backward pass, when the gradient of the unit's outputs exists; at most two
units' gathered weights exist at a time, beside the weights this rank owns.
Note [Every rank runs every unit's backward pass]
A GradientTape runs a recorded operation's gradient only on the way from the
target to a source it was asked about, and a rank's sources are the weights
it owns: a rank owning none of the first layers' weights would skip their
backward passes, in which their owners wait for its gradients. Every unit
therefore also reads one scalar variable, the anchor, that the tape is asked
about on every rank (its gradient, zero, is dropped): every rank traces every
unit's backward pass.
Note [Every received value is waited for]
A received value a pass does not need would be pruned from the graph on the
receiving rank, and its owner's send would wait for a receive that is never
posted: a bias in a backward pass (its gradient does not need it), an
Embedding's table (its gradient needs only the indices), every weight of
a unit this rank owns none of, whose backward pass computes nothing this rank
uses, and, on an owner, the gradients of its weights when a tape is asked
about other variables (a model's own train_step with two optimizers asks one
tape twice: each call runs every unit's backward pass). A control dependency
did not keep it (observed: with one, such a model still hung), so each receive
also gives a token
computed from its data (its first element), added to the counter that keeps
the sends (Note [Sends are kept by a counter] in send_counter.py). An owner
posts its sends when the receivers post their receives (the same inputs), not
at the start of the step.
An argument passed twice (MultiHeadAttention(x, x)) is two inputs of the
function, each with its own gradient. Bits: where a tensor feeds several
operations inside a layer and others outside it (a Transformer's residual
stream feeds the attention's query, key and value and the residual add),
unsharded training's tape adds all its gradients at once, the gathered layer
adds its own first: the sums may differ by rounding (on the language model of
tests/keras/programs/sharded_weights.py: 3e-8 after one epoch of SGD, 1.2e-6
after two of AdamW, where unsharded is 3.9e-6 from serial). Everywhere else
the gradients are unsharded training's bit for bit.
Note [Weights gathered for a model's own train_step]
A model's own train_step asks its tape about self.trainable_variables and
hands the gradients to optimizer.apply (Note [Distributing through the
optimizer] in tarantella/keras/distributed_optimizer.py). Under shard="weights"
this rank holds no storage for most of them, and its gradients must be summed
in the backward pass, the anchor among the sources (Note above). So while
tnt.Model traces that step, GradientTape.gradient, asked about gathered
weights, asks the tape for the owned ones and the anchor, with the upstream
gradient share = n_r / N (the weight of this rank's micro-batch in the global
batch's loss, which unsharded training applies to the summed gradients
instead: the same values, rounded once more or less where share is not a power
of two), and gives None for the others; the wrapped optimizer then applies the
owned sums without reducing them again. Other tapes (the units' own backward
passes among them) are TensorFlow's. A step that asks about the gathered
weights twice (a GAN's two optimizers, one tape each or one persistent tape)
is refused: each call runs every unit's backward pass and its transfers, and
two calls were observed to wait on each other's gradients until the timeout.
Weights read outside a unit's call would read zeros on the ranks that do not
own them, so models that do so are refused: weight regularizers (Keras reads
them in the loss, outside the layers), variables outside the units, a
variable shared by two units.
"""
from __future__ import annotations

import contextlib

import keras
import numpy as np
import tensorflow as tf
from keras.src.backend.common.stateless_scope import StatelessScope
from keras.src.backend.common.variables import AutocastScope, get_autocast_scope

from tarantella import channels as peer_channels, collectives, stage_state, tf_ops
from tarantella.step import sparse_gradients
from tarantella.step.graph_allreduce import unchained
from tarantella.sharding.gradients_to_owners import GradientsToOwners
from tarantella.sharding.owners import variable_bytes
from tarantella.sharding.send_counter import SendCounter
from tarantella.sharding.spread_transfers import SpreadTransfers, data_token
from tarantella.timeline import graph_marks

__all__ = ["WeightGathering", "gathering_of", "values_from_owners"]

_TAPE_GRADIENT = tf.GradientTape.gradient   # TensorFlow's own (tapes_sum_on_owners replaces it for a while)


class WeightGathering:
    """Made on every rank alike, in the same order (opens channels). `variables`, `owners`: the model's trainable
    variables and their owning ranks (a variable's tag is its index)."""

    def __init__(self, variables: list, owners: list, rank: int, size: int):
        self.rank, self.size = rank, size
        self.variables, self.owners = list(variables), list(owners)
        self._owner_and_tag = {id(v): (owner, tag) for tag, (v, owner) in enumerate(zip(variables, owners))}
        # Storage dtypes, taken outside any AutocastScope (in which a variable reports its compute dtype)
        self._dtype = {id(v): tf.as_dtype(v.dtype) for v in variables}
        self._channels = peer_channels.open_channels()
        self._spread = SpreadTransfers(rank, size, self._channels, graph_marks.GATHERED)
        self._backward_tags = len(variables)   # a backward pass's tags follow the forward pass's
        self.to_owners = GradientsToOwners(rank, size, peer_channels.open_channels(),
                                           sum(variable_bytes(v) for v in variables))
        self.sends = SendCounter("tnt_gathered_weight_sends")
        self._gate = tf.Variable(0, dtype=tf.int32, trainable=False, name="tnt_gather_gate")  # never written
        # Note [Every rank runs every unit's backward pass]
        self.anchor = tf.Variable(0.0, trainable=True, name="tnt_gathered_units_anchor")
        self._ops = tf_ops.load_ops()
        self._last_inputs = (None, [])  # (graph, inputs) of the unit called last: the forward's prefetch

    def summed_on_owners(self, gradients: list, variables: list) -> dict:
        """Traced, the same call on every rank: {id(variable): its gradient summed over the ranks} for the
        variables this rank owns. An Embedding's per-sample gradient stays sparse, every rank's slices in rank
        order (Note [Sparse gradients stay sparse] in tarantella/step/sparse_gradients.py); the others are
        summed on their owners as stage 2 sums them."""
        sparse = [i for i, g in enumerate(gradients) if sparse_gradients.is_per_sample(g)]
        dense = [i for i in range(len(gradients)) if i not in sparse]
        summed = {}
        if dense:
            owners, tags = zip(*[self._owner_and_tag[id(variables[i])] for i in dense])
            sums = self.to_owners([_dense(gradients[i], variables[i], self._dtype[id(variables[i])]) for i in dense],
                                  list(owners), list(tags))
            summed.update((id(variables[i]), total) for i, total in zip(dense, sums))
        if sparse:
            # Note [A blocking gather waits for the step's transfers] (sparse_gradients.py)
            transfers_done = [self.sends.after([]), self.to_owners.sends.after([])]
            gathered = sparse_gradients.gather([gradients[i] for i in sparse], [variables[i] for i in sparse], None,
                                               after=transfers_done)
            summed.update((id(variables[i]), slices) for i, slices in zip(sparse, gathered) if self.owns(variables[i]))
        return summed

    @staticmethod
    def marked(gradients: list) -> list:
        """The owned gradients, noted by the timeline as produced and reduced (they are both by now)."""
        return [g if g is None or isinstance(g, tf.IndexedSlices)
                else graph_marks.mark(graph_marks.mark(g, graph_marks.GRADIENT), graph_marks.REDUCED)
                for g in gradients]

    def whole_values(self, root: int | None = None) -> list:
        """Collective: every trainable variable's value (numpy), from its owner, on every rank (root=None) or on
        `root` only (the others get an empty list)."""
        values = values_from_owners(self.variables, self.owners, self.rank, self.size)
        return values if root is None or root == self.rank else []

    @contextlib.contextmanager
    def whole_on(self, root: int):
        """Collective: inside, `root` holds every weight (to write the whole model to a file); the weights it does
        not own are released again after."""
        values = self.whole_values(root)
        lent = []
        if self.rank == root:
            for variable, owner, value in zip(self.variables, self.owners, values):
                if owner != root:
                    stage_state.materialize(variable, value)
                    lent.append(variable)
        try:
            yield
        finally:
            for variable in lent:
                stage_state.release(variable)

    def hold_all(self) -> None:
        """Not a collective: every weight gets storage (zeros for those this rank does not own), to load a file
        of the whole model into; `release_unowned` gives it back."""
        for variable in self.variables:
            if stage_state.is_released(variable):
                stage_state.materialize(variable, np.zeros(tuple(variable.shape), variable.dtype))

    def release_unowned(self) -> None:
        for variable, owner in zip(self.variables, self.owners):
            if owner != self.rank and not stage_state.is_released(variable):
                stage_state.release(variable)

    def whole_weights(self, model_weights: list) -> list:
        """Collective: the values of `model_weights` (a model's weights, trainable or not) on every rank."""
        gathered = dict(zip(map(id, self.variables), self.whole_values()))
        return [gathered[id(v)] if id(v) in gathered else v.numpy() for v in model_weights]

    def gradients(self, tape, target, variables: list, output_gradients=None) -> list:
        """The tape's gradients of `target` (times `output_gradients`, as tape.gradient takes them) for the
        variables this rank owns (summed over the ranks by the units' backward passes), None for the gathered
        weights it does not own (it holds no storage a tape could watch); other sources as the tape gives them."""
        asked = [v for v in variables if self.owner_of(v) in (None, self.rank)]
        gradients = _TAPE_GRADIENT(tape, target, asked + [self.anchor],   # Note [Every rank runs ...]
                                   output_gradients=output_gradients)[:-1]
        by_variable = dict(zip(map(id, asked), gradients))
        return [by_variable.get(id(v)) for v in variables]

    @contextlib.contextmanager
    def tapes_sum_on_owners(self, share):
        """Inside (a model's own train_step, traced): a GradientTape asked about the gathered weights gives the
        gradients of share x its target, summed over the ranks, for those this rank owns, and None for the others
        (Note [Weights gathered for a model's own train_step])."""
        gathering = self
        calls = []

        def gradient(tape, target, sources, output_gradients=None, unconnected_gradients=None):
            flat = tf.nest.flatten(sources)
            if all(gathering.owner_of(source) is None for source in flat):
                return _TAPE_GRADIENT(tape, target, sources, output_gradients,
                                      unconnected_gradients or tf.UnconnectedGradients.NONE)
            calls.append(tape)
            if len(calls) > 1:   # every call runs every unit's backward pass; two were seen to wait on each other
                raise ValueError("tarantella: shard='weights' takes one tape.gradient call of the gathered weights "
                                 "per train_step, and this one asks again (a GAN's two optimizers); ask once for "
                                 "all of them, or use shard='gradients'")
            targets = tf.nest.flatten(target)
            given = tf.nest.flatten(output_gradients) if output_gradients is not None else [None] * len(targets)
            upstream = [tf.fill(tf.shape(t), tf.cast(share, t.dtype)) if g is None else g * tf.cast(share, g.dtype)
                        for t, g in zip(targets, given)]
            return tf.nest.pack_sequence_as(sources, gathering.gradients(tape, targets, flat, upstream))

        tf.GradientTape.gradient = gradient
        try:
            yield
        finally:
            tf.GradientTape.gradient = _TAPE_GRADIENT

    def owns(self, variable) -> bool:
        return self._owner_and_tag[id(variable)][0] == self.rank

    def owner_of(self, variable) -> int | None:
        """The rank that holds `variable`, None if it is not one of the gathered weights."""
        owner_and_tag = self._owner_and_tag.get(id(variable))
        return None if owner_and_tag is None else owner_and_tag[0]

    def install(self, units: list) -> None:
        """Each unit's call runs gathered from now on (Note above)."""
        for unit in units:
            if not getattr(unit, "_tnt_gathered", False):
                unit.call = self._gathered_call(unit, unit.call)
                unit._tnt_gathered = True

    def gather(self, variables: list, owned_values: dict, after, backward: bool) -> list:
        """Traced, the same call on every rank: each variable's value, sent by its owner (whose `owned_values`
        hold it) to every other rank; the receives are posted once `after` exists."""
        channels = self._channels
        # A read of a variable nobody writes, after `after`: a read of the send counter would also wait for every
        # send counted before it to complete (automatic control dependencies order it after those writes).
        with tf.control_dependencies(tf.nest.flatten(after)):
            posted = tf.identity(self._gate.read_value())
        values, tokens, received = [], [], []
        for variable in variables:
            owner, tag = self._owner_and_tag[id(variable)]
            tag += self._backward_tags * backward
            dtype = self._dtype[id(variable)]
            parts = self._spread.parts(variable.shape, dtype)
            if parts is not None:   # Note [Spread transfers]: through every rank
                value = None
                if owner == self.rank:
                    with tf.control_dependencies([posted]):   # sent when the receivers post (Note above)
                        value = tf.identity(owned_values[id(variable)])
                value, sends, receive_tokens = self._spread.broadcast(value, owner, tuple(variable.shape), dtype,
                                                                      tag, posted, parts)
                values.append(value if owner != self.rank else owned_values[id(variable)])
                tokens.extend(sends)
                received.extend(receive_tokens)
                continue
            if owner == self.rank:
                value = owned_values[id(variable)]
                with tf.control_dependencies([posted]):   # sent when the receivers post (Note above)
                    sent = tf.identity(value)
                for peer in range(self.size):
                    if peer != self.rank:
                        token = unchained(self._ops.tnt_send(sent, channels=channels.id, peer=peer, tag=tag))
                        tokens.append(graph_marks.mark(token, graph_marks.GATHERED))  # timeline only
                values.append(value)
            else:
                values.append(graph_marks.mark(unchained(self._ops.tnt_receive(
                    posted, T=dtype, shape=tuple(variable.shape), channels=channels.id,
                    peer=owner, tag=tag)), graph_marks.GATHERED))  # timeline only
                # Note [Every received value is waited for]: a receive is kept by a token read from its data
                received.append(data_token(values[-1]))
        self.sends.count(tokens + received)
        return values

    def _prefetch_after(self, inputs: list) -> list:
        """What this unit's forward gather waits for: the previous unit's inputs in the same graph (one unit
        ahead, Note above), else its own."""
        graph = None if tf.executing_eagerly() else tf.compat.v1.get_default_graph()
        (last_graph, last), self._last_inputs = self._last_inputs, (graph, inputs)
        return last if last and graph is not None and last_graph is graph else inputs

    def _gathered_call(self, unit, call):
        gathering = self

        def gathered_call(*args, **kwargs):
            if any(isinstance(item, keras.KerasTensor) for item in tf.nest.flatten((args, kwargs))):
                return call(*args, **kwargs)   # symbolic: shapes only, no value is read
            weights = list(unit.trainable_variables)
            others = [v for v in unit.variables if not v.trainable]
            flat = tf.nest.flatten((args, kwargs))
            at = [i for i, item in enumerate(flat) if tf.is_tensor(item)]
            unique = [flat[i] for i in at]   # one input per argument, also when two are one tensor (Note above)
            owned = [v for v in weights if gathering.owns(v)]
            before = [tf.convert_to_tensor(v._value) for v in others]   # Note above: both passes read these
            prefetch_after = gathering._prefetch_after(unique)
            autocast = get_autocast_scope()   # the layer's mixed precision, for the backward pass too
            count = len(unique)

            def run(tensors, gathered, record_updates):
                items = list(flat)
                for i, tensor in zip(at, tensors):
                    items[i] = tensor
                call_args, call_kwargs = tf.nest.pack_sequence_as((args, kwargs), items)
                mapping = list(zip(weights, gathered)) + list(zip(others, before))
                with StatelessScope(state_mapping=mapping, collect_losses=True, initialize_variables=False) as scope, \
                        AutocastScope(autocast.dtype if autocast is not None else None):
                    outputs = call(*call_args, **call_kwargs)
                updates = [(v, scope.get_current_value(v)) for v in others] if record_updates else []
                return outputs, list(scope.losses), updates

            structure = {}

            @tf.custom_gradient
            def unit_function(*inputs):
                tensors, owned_values = inputs[:count], dict(zip(map(id, owned), inputs[count:-1]))
                gathered = gathering.gather(weights, owned_values, prefetch_after, backward=False)
                outputs, losses, updates = run(tensors, gathered, record_updates=True)
                structure["outputs"] = outputs
                structure["updates"] = updates
                flat_outputs = tf.nest.flatten(outputs) + losses

                def grad(*upstream, variables=None):
                    values = gathering.gather(weights, owned_values, list(upstream), backward=True)
                    # each argument its own tensor, so that each gets its own gradient (MultiHeadAttention(x, x))
                    arguments = [tf.identity(t) for t in tensors]
                    differentiable = [t for t in arguments if t.dtype.is_floating]
                    with tf.GradientTape(watch_accessed_variables=False) as tape:
                        tape.watch(differentiable)
                        tape.watch(values)
                        again, again_losses, _ = run(arguments, values, record_updates=False)
                    targets = tf.nest.flatten(again) + again_losses
                    grads = tape.gradient(targets, differentiable + values, output_gradients=list(upstream))
                    by_input = dict(zip(map(id, differentiable), grads[:len(differentiable)]))
                    input_grads = [by_input.get(id(t)) for t in arguments]
                    by_weight = gathering.summed_on_owners(grads[len(differentiable):], weights)
                    return (input_grads + [by_weight.get(id(v)) for v in owned] + [tf.zeros([])],
                            [None] * len(variables or []))

                return flat_outputs, grad

            results = unit_function(*unique, *[tf.convert_to_tensor(v._value) for v in owned],
                                    tf.convert_to_tensor(gathering.anchor))
            results = list(results) if isinstance(results, (list, tuple)) else [results]
            output_count = len(tf.nest.flatten(structure["outputs"]))
            for variable, value in structure["updates"]:
                if value is not None:
                    variable.assign(value)
            for loss in results[output_count:]:
                unit.add_loss(loss)
            return tf.nest.pack_sequence_as(structure["outputs"], results[:output_count])

        return gathered_call


def _dense(gradient, variable, dtype):
    """A weight's gradient as a dense tensor (an Embedding's arrives as IndexedSlices); zeros if unused."""
    if gradient is None:
        return tf.zeros(variable.shape, dtype)
    if isinstance(gradient, tf.IndexedSlices):
        return tf.convert_to_tensor(gradient)
    return gradient


def values_from_owners(variables: list, owners: list, rank: int, size: int, group=None) -> list:
    """Collective (over `group`, None: the world, whose members rank, size and owners count): each variable's
    value (numpy) as its owner holds it, on every rank."""
    values = []
    for variable, owner in zip(variables, owners):
        buffer = (np.array(variable.numpy(), copy=True) if owner == rank
                  else np.empty(tuple(variable.shape), variable.dtype))
        if size > 1:
            buffer = np.array(collectives.broadcast(buffer, root=owner, group=group), copy=True)
        values.append(buffer)
    return values


def gathering_of(variables: list) -> WeightGathering | None:
    """The gathering of a model sharded by shard_weights whose weights `variables` are (some of), else None."""
    gatherings = {id(g): g for g in (getattr(v, "_tnt_gathering", None) for v in variables) if g is not None}
    return next(iter(gatherings.values())) if len(gatherings) == 1 else None
