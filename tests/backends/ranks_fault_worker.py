"""Run by tests/backends/test_local_ranks_faults.py as ``rlkit run ranks_fault_worker.py MODE`` on 2
ranks: joins the process group (``distributed.init``, backend.rank_timeout_s from ``$RANK_TIMEOUT_S``),
then rank 1 fails as MODE says (``raise``: a ValueError; ``hang``: sleeps past the timeout) while
rank 0 waits for it in a barrier; ``sleep``: both ranks sleep (a run its launcher is killed in)."""

import os
import sys
import time

import torch.distributed as dist

from rlkit.backends.local import distributed

mode = sys.argv[1]
rank, _ = distributed.init(timeout_s=float(os.environ.get("RANK_TIMEOUT_S", "120")))
if rank == 1 and mode == "raise":
    raise ValueError("bad row 7")
if rank == 1 and mode == "hang":
    time.sleep(600)
if mode == "sleep":
    print(f"rank {rank} up", flush=True)
    time.sleep(600)
dist.barrier()
