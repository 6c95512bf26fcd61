"""A cluster of hosts made of network namespaces on one machine (netns_cluster.py),
for the multi-host tests and benchmarks; `python -m bench.cluster` drives it from a shell."""
