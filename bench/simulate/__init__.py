"""Predicting a sweep on a cluster larger than the machine at hand.

From a measured 1-device profile of the model (gradient sizes in backprop order and
when backprop produces them) and a cluster profile (devices per node, device speed,
link latency and bandwidth), the step time on N devices follows from the engine's
allreduce cost models, its bucket fusion and the overlap of buckets with backprop.
"""
