"""Input-pipeline benchmark: does each rank decode only its own samples, and what does it buy?

    python -m bench.input [--ranks 1 2 4] [--samples 3072] [--epochs 3] [--out results/input]

An input-bound model (a linear classifier on pooled pixels) trained with
tnt.Model on synthetic JPEGs (made with tf.io.encode_jpeg, decoded, randomly
cropped and flipped in a `Dataset.map`: real per-sample work), one global batch
for every rank count (strong scaling of the input). Modes, each at every rank count:
  tnt          the user's pipeline, rewritten by tarantella.data (each rank maps its own samples)
  replicated   the previous behaviour: every rank runs the whole pipeline and slices its part
               (tarantella.data.distributed_dataset.sliced_for_rank), kept as the baseline
  shard        tf.distribute-style: `Dataset.shard(N, rank)` before the map and a per-replica
               batch (what AutoShardPolicy.DATA does; through tnt.distribute_datasets_from_function):
               scales, but its global batches are not serial's
  keras        plain Keras 3 fit, 1 rank only
  py_dataset   the same work in a keras.utils.PyDataset (__getitem__ decodes a global batch, 2 worker
               threads): each rank reads batch kN+r of each group of N, the micro-batches exchanged
               all-to-all (Note [Reading a PyDataset per rank] in tarantella/data/python_input.py)
  py_replicated  that PyDataset read in full on every rank and sliced (the previous behaviour)
Per run and rank: samples decoded per epoch (a counter in the map), the epoch time
(median of the epochs after the first), input throughput per rank (decoded samples/s)
and global training throughput (samples/s). Rows: results/input/runs.csv and runs.json with
machine, versions, commit and load average; results/input/README.md has the table.
"""
