"""The RESP wire, private to :mod:`kelp.store.redis`: commands packed by numpy, replies parsed off sockets."""
