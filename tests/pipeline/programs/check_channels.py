"""Peer channels on any even number of ranks: pairs (0,1), (2,3), ... exchange
out of order, many in flight, sizes 0..4 MiB; then a receive nobody sends ends
in a TimeoutError naming the peer. Each check prints "OK <name>"."""
import numpy as np

import tarantella as tnt
from tarantella import channels as peer

rank, size = tnt.get_rank(), tnt.get_size()
assert size % 2 == 0, "run on an even number of ranks"
partner = rank ^ 1
channels = peer.open_channels()
sizes = [0, 1, 7, 1000, 65536, 1 << 20, 4 << 20]


def payload(sender: int, tag: int, count: int) -> np.ndarray:
    return (np.arange(count, dtype=np.float32) + 1000.0 * sender + tag) % 65521


# Out of order: the sender posts tags ascending, the receiver descending, all in flight at once.
tags = list(range(len(sizes)))
outs = {tag: np.full(sizes[tag], -1.0, np.float32) for tag in tags}
receives = [channels.receive(partner, tag, outs[tag]) for tag in reversed(tags)]
sends = [channels.send(partner, tag, payload(rank, tag, sizes[tag])) for tag in tags]
for handle in receives + sends:
    handle.wait()
for tag in tags:
    assert np.array_equal(outs[tag], payload(partner, tag, sizes[tag])), f"tag {tag} corrupted"
print("OK out of order sizes 0..4MiB", flush=True)

# Many in flight, with one tag reused: same-tag messages arrive in posting order.
count = 200
outs = [np.zeros(64, np.float64) for _ in range(count)]
receives = [channels.receive(partner, 5 if i % 2 else 1000 + i, outs[i]) for i in range(count)]
sends = [channels.send(partner, 5 if i % 2 else 1000 + i, np.full(64, rank * 10000.0 + i)) for i in range(count)]
for handle in sends + receives:
    handle.wait()
assert all(np.all(outs[i] == partner * 10000.0 + i) for i in range(count))
print("OK many in flight", flush=True)

# Size mismatch is a MismatchError on the receiver, not a silent truncation.
if rank % 2 == 0:
    channels.send(partner, 77, np.zeros(10, np.float32)).wait()
else:
    try:
        channels.receive(partner, 77, np.zeros(4, np.float32)).wait()
        raise AssertionError("no error for a too-small receive")
    except tnt.MismatchError as error:
        assert "tag 77" in str(error), error
print("OK size mismatch", flush=True)
tnt.barrier()

# A cancelled receive that no send matches is withdrawn at once (Note [Cancelled transfers are withdrawn]),
# and the channels go on working.
if rank % 2 == 0:
    import time
    began = time.monotonic()
    pending = channels.receive(partner, 98, np.zeros(5, np.float32))
    pending.cancel()
    try:
        pending.wait()
        raise AssertionError("a cancelled receive completed")
    except tnt.EngineError as error:  # withdrawn, not expired: the channels' timeout is not what ended it
        assert "cancelled" in str(error) and "tag 98" in str(error) and "timed out" not in str(error), error
    while channels.in_flight and time.monotonic() - began < 1.0:  # the count follows the progress thread
        time.sleep(0.01)
    assert channels.in_flight == 0, channels.in_flight
tnt.barrier()
got = channels.receive(partner, 97, np.zeros(3, np.float32)) if rank % 2 == 0 else None
if rank % 2 == 1:
    channels.send(partner, 97, payload(rank, 97, 3)).wait()
else:
    got.wait()
    np.testing.assert_array_equal(got.buffer, payload(partner, 97, 3))
print("OK cancelled receive", flush=True)
tnt.barrier()

# A receive from a rank that never sends: TimeoutError naming it, within the configured timeout.
if rank % 2 == 0:
    try:
        channels.receive(partner, 99, np.zeros(3, np.float32)).wait()
        raise AssertionError("no timeout")
    except TimeoutError as error:
        assert f"from rank {partner} with tag 99" in str(error) and "timed out" in str(error), error
        print(f"TIMEOUT {error}", flush=True)
else:
    import time
    time.sleep(2.5)  # so that this rank's barrier does not time out while its partner waits
tnt.barrier()
channels.close()
print("OK done", flush=True)
