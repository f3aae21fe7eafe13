"""A PyTorch MLP on Fashion-MNIST with Horovod's and DDP's habits on asap_train (issue 43 item 5):
broadcast_parameters, DistributedSampler, DistributedOptimizer and join().

    make torch                  # opt-in: torch from PyPI into .venv-torch (large), with asap_train
    mpirun -n 4 .venv-torch/bin/python examples/torch_distributed.py --sync allreduce
    mpirun -n 4 .venv-torch/bin/python examples/torch_distributed.py --sync asap --uneven 0.5

Every rank builds the model from its own seed; `broadcast_parameters` makes them all rank 0's
(checked bit for bit). `DistributedSampler` deals each rank an equal shard of a new permutation
every epoch; `DistributedOptimizer` wraps torch's SGD with momentum (or Adam) and syncs the
parameters through a Reducer after every step (its state stays local: see docs/python.md).
With `--uneven F`, rank 0 trains on only a fraction F of its shard each epoch, then calls
`join()`, and the others' syncs go on without it (allreduce: the mean of the active ranks'
models) until they run out too. `finish()` leaves the average model on every rank; rank 0 scores
it on the 10,000 test images.
"""

import argparse
import hashlib
import os
import sys
import time

import numpy as np

import asap_train as at  # first: it initialises MPI with the binary's settings

import torch
import torch.nn as nn

import asap_train.torch as att

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from numpy_logreg import load  # noqa: E402  (the IDX reader of the numpy example)


def standardised():
    """The training and test sets, standardised with the training set's moments."""
    X, y = load("train")
    Xt, yt = load("t10k")
    X = X.astype(np.float32)
    mean, std = X.mean(0), X.std(0)
    std[std < 1e-8] = 1.0
    norm = lambda a: torch.from_numpy(((a.astype(np.float32) - mean) / std).astype(np.float32))  # noqa: E731
    return norm(X), torch.from_numpy(y.astype(np.int64)), norm(Xt), torch.from_numpy(yt.astype(np.int64))


def same_on_every_rank(net):
    """Whether every rank's parameters are rank 0's, bit for bit (a hash compared over ranks)."""
    h = hashlib.sha256(b"".join(p.detach().numpy().tobytes() for p in net.parameters())).digest()
    mine = np.frombuffer(h, np.uint8).copy()
    root = mine.copy()
    at.broadcast_parameters(root, root=0)
    return at.allreduce_sum(float(not np.array_equal(mine, root))) == 0


def average_state(optimizer):
    """The alternative DistributedOptimizer does not take, for measuring it: every floating-point
    state tensor (momentum buffer, Adam's moments) replaced by its mean over the ranks."""
    for state in optimizer.state.values():
        for v in state.values():
            if torch.is_tensor(v) and v.is_floating_point() and v.dim() > 0:
                v.copy_(torch.from_numpy(at.allreduce_sum(v.numpy()) / at.size))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sync", default="allreduce", help="allreduce, asap or none")
    ap.add_argument("--optimizer", default="sgd", choices=["sgd", "adam"], help="sgd: momentum 0.9; adam: torch's Adam")
    ap.add_argument("--epochs", type=int, default=1)
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--lr", type=float, default=None, help="default 0.02 (sgd), 1e-3 (adam)")
    ap.add_argument("--hidden", type=int, default=128)
    ap.add_argument("--uneven", type=float, default=1.0, help="rank 0 trains on this fraction of its shard, then joins")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--average-state", action="store_true",
                    help="measurement only (docs/python.md): also average the optimizer's state over the ranks after each step")
    args = ap.parse_args()
    if args.average_state and args.uneven != 1.0:
        ap.error("--average-state averages over every rank at every step: it needs --uneven 1")
    torch.set_num_threads(1)
    X, y, Xt, yt = standardised()
    torch.manual_seed(args.seed + 1000 * at.rank)  # a different model on every rank ...
    net = nn.Sequential(nn.Linear(X.shape[1], args.hidden), nn.ReLU(), nn.Linear(args.hidden, 10))
    att.broadcast_parameters(net, root=0)  # ... until rank 0's is everyone's
    assert same_on_every_rank(net), "broadcast_parameters left the replicas different"
    lr = args.lr or (0.02 if args.optimizer == "sgd" else 1e-3)
    inner = torch.optim.SGD(net.parameters(), lr=lr, momentum=0.9) if args.optimizer == "sgd" else torch.optim.Adam(net.parameters(), lr=lr)
    opt = att.DistributedOptimizer(inner, net, sync=args.sync)
    sampler = at.DistributedSampler(len(y), shuffle=True, seed=args.seed)
    start, steps = time.perf_counter(), 0
    for epoch in range(args.epochs):
        sampler.set_epoch(epoch)
        idx = torch.from_numpy(sampler.indices())
        batches = len(idx) // args.batch_size
        if at.rank == 0:
            batches = int(batches * args.uneven)
        loss_sum = 0.0
        for b in range(batches):
            take = idx[b * args.batch_size : (b + 1) * args.batch_size]
            opt.zero_grad()
            loss = nn.functional.cross_entropy(net(X[take]), y[take])
            loss.backward()
            opt.step()
            if args.average_state:
                average_state(inner)
            loss_sum += float(loss.detach())
        steps += batches
        opt.join()  # a rank out of batches answers the others' syncs until all are out
        total = at.allreduce_sum(np.array([loss_sum, batches]))
        if at.rank == 0:
            print("epoch %d: train loss %.4f over %d steps (rank 0: %d), syncs %d" % (epoch + 1, total[0] / total[1], total[1], batches, opt.reducer.rounds), flush=True)
    seconds = time.perf_counter() - start
    stats = opt.reducer.stats()
    opt.finish()
    assert same_on_every_rank(net), "finish() left the replicas different"
    if at.rank == 0:
        with torch.no_grad():
            acc = float((net(Xt).argmax(1) == yt).float().mean())
        print(
            "summary: sync %s, %s, state %s, test accuracy %.4f, train seconds %.1f, bytes sent by rank 0 %d"
            % (args.sync, args.optimizer, "averaged" if args.average_state else "local", acc, seconds, stats["bytes_sent"]),
            flush=True,
        )


if __name__ == "__main__":
    main()
