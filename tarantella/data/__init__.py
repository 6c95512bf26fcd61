"""Global batches -> per-rank micro-batches, each rank reading only its own samples where it can.

user_input           THE entry point: any user input (tf.data, arrays, PyDataset, generator) -> this
                     rank's micro-batch stream (`distribute`); used by fit/evaluate/predict and
                     tnt.distribute_dataset
rank_pipeline        a batched tf.data pipeline rewritten so that each rank maps only its own samples
                     (Note [Rewriting the user's pipeline]); the plan, or why it falls back
dataset_graph        the links of a tf.data pipeline read from its Python objects, re-applied elsewhere
distributed_dataset  the stream's element format; slicing of global batches read in full; arrays
python_input         keras.utils.PyDataset read per rank (batch kN+r of each group of N, Note [Reading a
                     PyDataset per rank]); generators read in full
batch_exchange       the all-to-all exchange of micro-batches between ranks (the engine's alltoallv)
from_function        distribute_datasets_from_function: each rank builds its own pipeline (file sharding)
order_check          the ranks must agree on the sample order: a rolling fingerprint of every batch, compared
batching             the arithmetic only (no TensorFlow): micro-batch sizes and offsets
"""
__all__: list[str] = []
