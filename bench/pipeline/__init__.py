"""Pipeline benchmarks: bubble fraction of GPipe and 1F1B against (S-1)/(M+S-1),
memory per stage against the unpartitioned model, and throughput of a 2-stage
pipeline against 2-rank data parallelism. Run `python -m bench.pipeline.sweep`."""
