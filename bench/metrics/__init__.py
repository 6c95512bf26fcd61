"""Quality metrics of the benchmarks that Keras does not provide."""
