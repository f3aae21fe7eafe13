"""asap_train: asap-train's sync layer for Python models (see docs/python.md).

Run SPMD under the same Open MPI as the binary::

    mpirun -n 8 python3 script.py

Importing this package initialises MPI once for the process (with the binary's start-up
settings), unless MPI is already initialised, in which case it shares that MPI. Import it
BEFORE ``from mpi4py import MPI``: mpi4py then finds MPI initialised and uses it. (The other
order works only when ``OMPI_MCA_osc=ucx`` is exported, because Debian's default one-sided
component crashes on the mailboxes' atomics; see docs/python.md.)
"""

import atexit as _atexit
import sys as _sys

from . import _native
from ._native import Error, OptionError, Reducer, SyncCountError, Table  # noqa: F401

rank, size, _initialised_here = _native.init()

__all__ = [
    "Error",
    "OptionError",
    "Reducer",
    "SyncCountError",
    "Table",
    "rank",
    "size",
    "barrier",
    "allreduce_sum",
    "broadcast_parameters",
    "DistributedSampler",
    "graph_gap",
    "graph_gap_edges",
    "graph_search",
    "graph_mix",
    "read_model",
    "read_metrics",
    "flatten",
    "unflatten",
    "flatten_module",
    "unflatten_module",
]

barrier = _native.barrier
graph_gap = _native.graph_gap
graph_search = _native.graph_search
graph_mix = _native.graph_mix
read_model = _native.read_model

if not _initialised_here and not _native.osc_ok() and rank == 0:
    # MPI came up before us (mpi4py imported first) with Debian's default one-sided component.
    _sys.stderr.write(
        "asap_train: warning: MPI was initialised before asap_train, without OMPI_MCA_osc=ucx: "
        "sync='asap' then runs on Debian's default one-sided component, which the binary avoids "
        "(it crashes on 64-bit compare-and-swap and on windows at one rank). Import asap_train "
        "before mpi4py, or export OMPI_MCA_osc=ucx.\n"
    )

# Every open Reducer is freed (collectively, in creation order) before MPI_Finalize.
_atexit.register(_native.finalize)

_previous_excepthook = _sys.excepthook


def _abort_on_uncaught(kind, value, tb):
    """An uncaught exception on one rank would leave the others waiting in the next collective
    forever: print it, then abort the whole job (what the binary does on a panic)."""
    _previous_excepthook(kind, value, tb)
    if size > 1 and _native.mpi_active():
        _native.abort("uncaught %s: %s (aborting every rank)" % (kind.__name__, value), 1)


_sys.excepthook = _abort_on_uncaught


def graph_gap_edges(nodes, edges, model_bytes=0, method="auto", epsilon=1e-3, name="edges"):
    """`graph gap`'s report for a graph given by its (source, target) pairs: a list of pairs or
    an (E, 2) integer array over nodes 0..nodes-1 (self-loops and repeats are ignored)."""
    pairs = []
    for i, e in enumerate(edges):
        a, b = (int(v) for v in e)
        if a < 0 or b < 0:
            raise OptionError("edge %d (%d, %d) names a node outside 0..%d" % (i, a, b, nodes))
        pairs.append((a, b))
    return _native.graph_gap_edges(nodes, pairs, model_bytes=model_bytes, method=method, epsilon=epsilon, name=name)


def read_metrics(path):
    """A `--metrics` JSONL file as a list of dicts, one per line (start, eval ... summary lines;
    each has an "event" key). A line that is not JSON raises ValueError naming file and line."""
    import json

    out = []
    with open(path, encoding="utf-8") as f:
        for i, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                out.append(json.loads(line))
            except ValueError as e:
                raise ValueError("%s:%d: not a JSON metrics line (%s)" % (path, i, e)) from None
    return out


def allreduce_sum(x):
    """Sum over ranks (collective; no mpi4py needed): of a float, or element-wise of an array
    (returned as a new float64 array)."""
    import numpy as np

    if isinstance(x, np.ndarray):
        y = np.array(x, dtype=np.float64).ravel()
        _native.allreduce_sum_array(y)
        return y.reshape(np.shape(x))
    return _native.allreduce_sum(float(x))


def flatten(arrays):
    """Concatenate numpy arrays (or anything np.asarray takes, e.g. a PyTorch module's
    ``p.detach().numpy()``) into one contiguous float32 vector for a Reducer. Returns
    ``(flat, shapes)``; ``unflatten(flat, shapes)`` gives the arrays back."""
    import numpy as np

    parts = [np.asarray(a, dtype=np.float32) for a in arrays]
    shapes = [p.shape for p in parts]
    flat = np.concatenate([p.ravel() for p in parts]) if parts else np.zeros(0, np.float32)
    return np.ascontiguousarray(flat, dtype=np.float32), shapes


def unflatten(flat, shapes):
    """Views of ``flat`` with the given shapes (no copy): write into them, or copy them out."""
    out, at = [], 0
    for s in shapes:
        n = 1
        for d in s:
            n *= d
        out.append(flat[at : at + n].reshape(s))
        at += n
    if at != flat.size:
        raise ValueError("flat has %d values, the shapes %d" % (flat.size, at))
    return out


def flatten_module(module):
    """One flat float32 vector holding a PyTorch module's parameters, for a Reducer, with no copy
    from then on: each parameter's data becomes a view of the vector (its values kept), so
    ``reducer.sync(flat)`` changes the module in place and the optimizer steps write into it.
    Call it before building the optimizer. torch is imported here only: the package itself does
    not depend on it (``make torch`` installs it, opt-in)."""
    import torch

    params = list(module.parameters())
    for i, p in enumerate(params):
        if p.dtype != torch.float32 or p.device.type != "cpu":
            raise TypeError(
                "parameter %d of %s is %s on %s: the reducer averages float32 on the CPU "
                "(module.float().cpu() makes it so)" % (i, type(module).__name__, p.dtype, p.device)
            )
    flat, shapes = flatten(p.detach().numpy() for p in params)
    for p, view in zip(params, unflatten(flat, shapes)):
        p.data = torch.from_numpy(view)  # the view shares flat's memory
    return flat


def unflatten_module(flat, module):
    """Copies a flat vector (``flatten_module``'s layout: the parameters in ``module.parameters()``
    order) into a module's parameters, e.g. the average of the replicas into a model to score.
    Works on anything whose parameters give ``p.detach().numpy()`` (writable, sharing memory)."""
    params = list(module.parameters())
    views = unflatten(flat, [tuple(p.shape) for p in params])
    for p, v in zip(params, views):
        p.detach().numpy()[...] = v


def _bytes_of(array, what):
    """A writable C-contiguous numpy array (or a CPU torch tensor) as its uint8 view, shared."""
    import numpy as np

    if hasattr(array, "detach") and hasattr(array, "numpy"):
        if array.device.type != "cpu" or not array.is_contiguous():
            raise TypeError("%s is a torch tensor on %s (contiguous: %s): broadcast_parameters needs contiguous CPU tensors"
                            % (what, array.device, array.is_contiguous()))
        array = array.detach().numpy()
    if not isinstance(array, np.ndarray):
        raise TypeError("%s is %s: broadcast_parameters takes numpy arrays (or CPU torch tensors), "
                        "a list or tuple of them, or a dict of them (a state_dict)" % (what, type(array).__name__))
    if not array.flags.c_contiguous or not array.flags.writeable:
        raise ValueError("%s must be C-contiguous and writable to be overwritten in place "
                         "(np.ascontiguousarray makes a copy that is; broadcast that copy)" % what)
    return array.reshape(-1).view(np.uint8)


def broadcast_parameters(params, root=0):
    """Collective: every rank's ``params`` becomes ``root``'s, bit for bit, in place (Horovod's
    ``broadcast_parameters``). ``params`` is a numpy array, a list or tuple of them, or a dict of
    them (a state_dict; values in the dict's order), of any dtype; CPU torch tensors work too
    (``asap_train.torch.broadcast_parameters`` takes a module). Every rank passes the same
    structure: different sizes or roots raise OptionError on every rank."""
    if isinstance(params, dict):
        items = list(params.items())
    elif isinstance(params, (list, tuple)):
        items = list(enumerate(params))
    else:
        items = [("params", params)]
    for name, array in items:
        _native.broadcast_bytes(_bytes_of(array, "params[%r]" % (name,)), root)


class DistributedSampler:
    """Each rank's share of the indices 0..n-1 for an epoch, as torch's ``DistributedSampler``
    deals them, without torch: shuffle with a generator seeded by ``seed + epoch`` (the same
    permutation on every rank; numpy's, so not torch's order), then rank r takes every
    ``num_replicas``-th index from position r. Every rank gets ``len(sampler)`` indices: with
    ``drop_last=False`` the permutation is padded with its own first indices up to a multiple
    of ``num_replicas`` (torch's rule: some indices appear twice in an epoch), with
    ``drop_last=True`` its tail is dropped (each index at most once). Call ``set_epoch(e)``
    before each epoch for a new order. Equal lengths are what keeps every rank's sync count
    equal (``Reducer.join()`` is the remedy when they cannot be)."""

    def __init__(self, n, num_replicas=None, rank=None, shuffle=True, seed=0, drop_last=False):
        num_replicas = size if num_replicas is None else int(num_replicas)
        rank_ = globals()["rank"] if rank is None else int(rank)
        if n < 0 or num_replicas < 1 or not 0 <= rank_ < num_replicas:
            raise ValueError("DistributedSampler(n=%d, num_replicas=%d, rank=%d): need n >= 0 and 0 <= rank < num_replicas"
                             % (n, num_replicas, rank_))
        if drop_last and n < num_replicas:
            raise ValueError("DistributedSampler: drop_last=True with n=%d indices and %d replicas leaves every rank "
                             "nothing; use drop_last=False (pads) or fewer ranks" % (n, num_replicas))
        self.n, self.num_replicas, self.rank = int(n), num_replicas, rank_
        self.shuffle, self.seed, self.drop_last, self.epoch = shuffle, int(seed), drop_last, 0
        self.num_samples = n // num_replicas if drop_last else -(-n // num_replicas)
        self.total_size = self.num_samples * num_replicas

    def set_epoch(self, epoch):
        """The epoch whose order ``indices()`` and iteration give (seed + epoch seeds it)."""
        self.epoch = int(epoch)

    def indices(self):
        """This rank's indices for the current epoch, as a numpy int64 array."""
        import numpy as np

        if self.shuffle:
            order = np.random.default_rng(self.seed + self.epoch).permutation(self.n)
        else:
            order = np.arange(self.n)
        if self.total_size > self.n:
            reps = -(-(self.total_size - self.n) // max(self.n, 1))
            order = np.concatenate([order] + [order] * reps)
        return order[: self.total_size][self.rank :: self.num_replicas].astype(np.int64)

    def __iter__(self):
        return iter(self.indices().tolist())

    def __len__(self):
        return self.num_samples
