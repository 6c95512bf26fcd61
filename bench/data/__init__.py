"""Input data for the benchmarks: synthetic (runs anywhere), TFDS data sets on disk, sklearn digits."""
