"""Point-to-point channels between world ranks (the engine's PeerChannels).

    channels = open_channels()
    handle = channels.send(peer, tag, array)          # returns at once
    handle = channels.receive(peer, tag, out_array)   # fills out_array later
    handle.wait()   # GIL released; TimeoutError naming the peer after TNT_TIMEOUT_SECONDS

A transfer is posted by the calling thread and completed on the engine's
progress thread (Note [Channels post on the caller's thread] in
csrc/engine/peer_channels.hpp); buffers must not be touched until their
transfer is done. Channels are closed at exit, before the engine
stops MPI.
"""
from __future__ import annotations

import atexit
import weakref

from tarantella import runtime

__all__ = ["open_channels", "close_all", "max_tag"]

_open: "weakref.WeakSet" = weakref.WeakSet()
_registered = False


def open_channels():
    """New channels on a duplicate of the world communicator (not a collective)."""
    global _registered
    runtime.init()
    from tarantella import _engine
    channels = _engine.PeerChannels()
    _open.add(channels)
    if not _registered:
        # Registered after runtime.init's shutdown hook, so it runs before it (atexit is LIFO).
        atexit.register(close_all)
        _registered = True
    return channels


def close_all() -> None:
    for channels in list(_open):
        channels.close()


def max_tag() -> int:
    from tarantella import _engine
    runtime.init()
    return _engine.PeerChannels.max_tag()
