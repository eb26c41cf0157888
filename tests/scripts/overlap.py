"""A traced job whose operations overlap on every rank (``ringlet run --trace``), and whose
two communicators of the same ranks have different stragglers.

    ringlet run --trace DIR -n 3 overlap.py

receives posted from every rank before the sends, then waited for in turn; async
all_reduces queued behind one another; a split of every rank (color 0) running
all_reduces on a thread of its own beside the world's; then three all_reduces on
each communicator, rank 2 late to the world's, rank 1 to the split's.
"""

import threading
import time

import numpy as np

import ringlet

comm = ringlet.init()
n, r = comm.size, comm.rank
works = [comm.irecv(np.empty(1024), q, tag=1) for q in range(n) if q != r]
time.sleep(0.01 * r)
works += [comm.isend(np.full(1024, float(r)), q, tag=1) for q in range(n) if q != r]
for w in works:
    w.wait()
pending = [comm.all_reduce(np.ones(4096), async_op=True) for _ in range(8)]
for w in pending:
    w.wait()
sub = comm.split(0)
assert sub is not None


def beside() -> None:
    for _ in range(4):
        sub.all_reduce(np.ones(1 << 16))


t = threading.Thread(target=beside)
t.start()
for _ in range(4):
    comm.all_reduce(np.ones(1 << 16))
t.join()
for late, c in ((2, comm), (1, sub)):
    for _ in range(3):
        if r == late:
            time.sleep(0.1)
        c.all_reduce(np.ones(4))
sub.close()
comm.close()
