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
from ._native import Error, OptionError, Reducer, Table  # noqa: F401

rank, size, _initialised_here = _native.init()

__all__ = [
    "Error",
    "OptionError",
    "Reducer",
    "Table",
    "rank",
    "size",
    "barrier",
    "allreduce_sum",
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
