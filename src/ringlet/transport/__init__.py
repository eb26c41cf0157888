"""Transports move bytes between the ranks of a communicator.

The interface the executor uses is small: ``isend(peer, parts)`` and
``irecv(peer, parts, reducer)`` queue a message (FIFO per ordered pair of
ranks), ``progress()`` moves what it can, ``wait(requests, what)`` progresses
until the requests are done within the deadline, and ``check()`` raises if a
peer died or aborted.  A communicator also publishes a small descriptor per
collective (``publish``/``peer_desc``) so that ranks can agree before any
data moves.  :mod:`ringlet.transport.shm` is the one-host default.
"""
