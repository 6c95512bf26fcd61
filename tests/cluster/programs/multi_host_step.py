"""Run on a namespace cluster: where each rank is, what the engine sees of the nodes,
one allreduce and (unless given `layout-only`) a few training steps of tnt.Model; one
`RESULT <json>` line per rank.

tests/cluster/test_multi_host.py checks the values against the cluster's shape,
test_slurm.py and test_slurm_hosts.py against the Slurm allocation.
"""
import hashlib
import json
import os
import socket
import sys

import numpy as np

import tarantella as tnt


def ancestors(limit: int = 8) -> list[str]:
    """The names of the processes above this one (who started the rank)."""
    names, pid = [], os.getppid()
    while pid > 1 and len(names) < limit:
        try:
            with open(f"/proc/{pid}/stat") as handle:
                text = handle.read()
        except OSError:
            break
        names.append(text[text.index("(") + 1:text.rindex(")")])
        pid = int(text.rsplit(")", 1)[1].split()[1])
    return names


world = tnt.runtime.world_group()
rank, size = world.rank, world.size
found = {"rank": rank, "size": size, "host": socket.gethostname(),
         "on_one_node": world.on_one_node,
         "mpi_local_rank": int(os.environ.get("OMPI_COMM_WORLD_LOCAL_RANK", "-1")),
         "mpi_local_size": int(os.environ.get("OMPI_COMM_WORLD_LOCAL_SIZE", "-1")),
         "omp_threads": os.environ.get("OMP_NUM_THREADS"),
         "timeout_seconds": tnt.runtime.settings().timeout_seconds, "ancestors": ancestors()}
for name in ("node_count", "local_rank", "local_size"):  # the engine's node layout
    found[name] = getattr(world, name)

# Every rank contributes rank+1 in every element: the sum is known from the size alone.
summed = tnt.allreduce(np.full(1000, rank + 1, dtype=np.float32))
found["allreduce_ok"] = bool(np.all(summed == size * (size + 1) / 2))
if sys.argv[1:] == ["layout-only"]:
    print("RESULT " + json.dumps(found), flush=True)
    sys.exit(0)

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
import keras  # noqa: E402

keras.utils.set_random_seed(7)
model = keras.Sequential([keras.Input((6,)), keras.layers.Dense(8, activation="relu"),
                          keras.layers.Dense(2)])
x = np.random.default_rng(0).normal(size=(8 * size, 6)).astype(np.float32)
y = np.random.default_rng(1).normal(size=(8 * size, 2)).astype(np.float32)
distributed = tnt.Model(model)
distributed.compile(optimizer=keras.optimizers.SGD(0.1), loss="mse")
initial = [w.copy() for w in distributed.get_weights()]
history = distributed.fit(x, y, batch_size=4 * size, epochs=1, shuffle=False, verbose=0)
weights = distributed.get_weights()
found["weights_sha256"] = hashlib.sha256(b"".join(w.tobytes() for w in weights)).hexdigest()
found["weights_changed"] = any(not np.array_equal(a, b) for a, b in zip(initial, weights))
found["loss"] = float(history.history["loss"][-1])

# The same steps in plain serial Keras on the global batch: data parallelism changes
# nothing but the summation order.
keras.utils.set_random_seed(7)
serial = keras.Sequential([keras.Input((6,)), keras.layers.Dense(8, activation="relu"),
                           keras.layers.Dense(2)])
serial.compile(optimizer=keras.optimizers.SGD(0.1), loss="mse")
serial.fit(x, y, batch_size=4 * size, epochs=1, shuffle=False, verbose=0)
found["serial_difference"] = max(float(np.max(np.abs(a - b))) for a, b in
                                 zip(serial.get_weights(), weights))
print("RESULT " + json.dumps(found), flush=True)
