"""Global batches -> per-rank micro-batches.

batching             the arithmetic only (no TensorFlow): micro-batch sizes and offsets
distributed_dataset  tf.data pipelines yielding this rank's micro-batches
user_input           what fit/evaluate/predict accept, turned into such a pipeline
"""
__all__: list[str] = []
