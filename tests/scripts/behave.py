"""A rank that fails, finishes, hangs or notices a failure, as the test asks.

``--fail R`` makes rank R exit with ``--code`` (or, with ``--kill-self``,
SIGKILL itself) after ``--after`` seconds; the other ranks then follow
``--others``: ``finish`` (exit 0 at once), ``hang`` (sleep for a minute),
``notice`` (exit 3 after ``--after`` + 0.5 s, as if they had detected the
dead peer), ``stubborn`` (ignore SIGTERM and hang), ``finish-or-hang`` (even
ranks finish, odd ranks hang).  ``--shm`` makes the
failing rank leave a file named like a transport segment of the job.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import time

p = argparse.ArgumentParser()
p.add_argument("--fail", type=int, default=-1)
p.add_argument("--code", type=int, default=1)
p.add_argument("--kill-self", action="store_true")
p.add_argument("--after", type=float, default=0.0)
p.add_argument("--others", default="finish",
               choices=("finish", "hang", "notice", "stubborn", "finish-or-hang"))
p.add_argument("--shm", action="store_true")
a = p.parse_args()
rank = int(os.environ["RANK"])
print(f"rank {rank} started", flush=True)
if rank == a.fail:
    if a.shm:
        path = f"/dev/shm/ringlet-{os.environ['RINGLET_JOB_ID']}-w-test-{rank}"
        with open(path, "w") as f:
            f.write("left behind")
        print(path, flush=True)
    time.sleep(a.after)
    print(f"rank {rank} fails", file=sys.stderr, flush=True)
    if a.kill_self:
        os.kill(os.getpid(), signal.SIGKILL)
    sys.exit(a.code)
if a.others == "finish" or (a.others == "finish-or-hang" and rank % 2 == 0):
    sys.exit(0)
if a.others == "notice":
    time.sleep(a.after + 0.5)
    print(f"rank {rank}: peer {a.fail} died", file=sys.stderr, flush=True)
    sys.exit(3)
if a.others == "stubborn":
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
time.sleep(60)
