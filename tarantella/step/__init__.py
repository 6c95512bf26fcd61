"""The shared floor: the pieces of a training step that data parallelism (keras/model.py), pipelining and
sharding all use. The step's collectives inside the graph (graph_allreduce, in_graph_sum), the reduction of
gradients (gradient_reduction, sparse_gradients) and of metric state (metric_reduction), serial random draws
(serial_random) and batch positions (batch_position), global BatchNormalization statistics
(global_batch_norm), empty micro-batches (empty_micro_batch), Adam's update in one pass, Keras's own
train/test/predict steps as tnt.Model runs them (tf_steps) with their reducers (step_reductions), every
rank's start from the master's weights (initial_weights), which callbacks run on which rank (rank_callbacks)
and what a strategy asks of an optimizer (optimizers). Nothing here imports a strategy or a face."""
