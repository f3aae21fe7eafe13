"""MPI shared between asap_train and mpi4py, imported in the order argv[1] names:

    mpirun -n N python tests/python/mpi4py_order.py asap_train-first|mpi4py-first

MPI must be initialised once (by whichever comes first), both must see the same world, and a
reducer's result must agree with mpi4py's allreduce on the same data.
"""

import sys

order = sys.argv[1]
if order == "asap_train-first":
    import asap_train as at
    from mpi4py import MPI
elif order == "mpi4py-first":
    from mpi4py import MPI
    import asap_train as at
else:
    raise SystemExit("usage: mpi4py_order.py asap_train-first|mpi4py-first")

import numpy as np

comm = MPI.COMM_WORLD
assert MPI.Is_initialized() and not MPI.Is_finalized()
assert (comm.Get_rank(), comm.Get_size()) == (at.rank, at.size)
# Initialised once, by the first import: asap_train says whether it was the one.
assert at._initialised_here == (order == "asap_train-first"), at._initialised_here

x = np.arange(1000, dtype=np.float32) * np.float32(at.rank + 1)
want = np.empty_like(x)
comm.Allreduce(x, want, op=MPI.SUM)
want *= np.float32(1.0 / at.size)
r = at.Reducer(x, sync="allreduce")
r.sync(x)
assert np.array_equal(x, want), np.abs(x - want).max()
r.close()

# asap's one-sided mailboxes, with mpi4py collectives between rounds.
y = np.full(500, float(at.rank), dtype=np.float32)
a = at.Reducer(y, sync="asap", graph="ring", notify="notify-ack")
for _ in range(10):
    a.sync(y)
    comm.Barrier()
a.finish(y)
assert np.allclose(y, (at.size - 1) / 2.0, atol=1e-4), y[:4]
assert a.stats()["torn"] == 0
# Left open on purpose: at exit they are closed (collectively, in creation order) before
# MPI_Finalize, whichever module finalises; the job must still end cleanly.
left = at.Reducer(y, sync="asap", graph="ring")
left.sync(y)
table = at.Table(8, 2, staleness=1)
table.inc([at.rank % 8], np.ones((1, 2), np.float32))
table.clock()
print("%s ok rank %d" % (order, at.rank), flush=True)
