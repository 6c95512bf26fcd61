"""The pipelining strategy (its public face is tarantella.pipeline): a functional Keras model cut into stages on
different ranks, with the same update as the unpartitioned model, optionally with data-parallel replicas of
every stage.

Files: split_layer.py (the cut point), partition.py (stages, crossing tensors), cut.py and balance.py (where to
cut), topology.py (rank -> replica, stage), schedules.py (GPipe, 1F1B), compiled_step.py (one step on one rank,
traced, with in-graph transfers), step_collectives.py (the sums over a stage's replicas and across the stages),
weight_gradients.py (deferred weight passes), whole_model.py (one model across the stages), data.py (each
replica's input), pipelined_model.py (the keras.Model). Beneath, shared with sharding: tarantella/stage_state.py
(each rank keeps only its stage; gather on save) and tarantella/channels.py (the engine's point-to-point
channels). Nothing here imports sharding: a face hands a pipelined model sharding's update (shard_optimizer).
"""
