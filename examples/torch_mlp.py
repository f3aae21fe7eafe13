"""A PyTorch MLP on Fashion-MNIST trained with asap-train's reducers next to PyTorch DDP (gloo, CPU),
every way on the same mini-batches, in one MPI job.

    make torch                  # opt-in: torch from PyPI into .venv-torch (large), with asap_train
    mpirun -n 8 .venv-torch/bin/python examples/torch_mlp.py --sync ddp,allreduce,asap

For each --sync in turn, every rank starts from the same initial model (torch's generator, seeded)
and takes the same mini-batches of its shard (its own seeded stream, restarted for each way):
- ddp: torch's DistributedDataParallel, which all-reduces (averages) the gradients in backward();
- allreduce, asap: the module's parameters are views of one flat numpy vector
  (`asap_train.flatten_module`), and `reducer.sync(flat)` averages the models after each step
  (asap: with the in-neighbours NOTIFY-ACK delivered on the graph).
With plain SGD (no momentum) and equal replicas, averaging the models after a step is averaging
the gradients before it: ddp and allreduce are the same algorithm, and differ by float rounding
only. Each epoch, the average of the replicas is scored on the 10,000 test images (outside the
training clock). Rank 0 prints one line per epoch and way, and a summary.
"""

import argparse
import hashlib
import os
import socket
import sys
import time

import numpy as np

import asap_train as at  # first: it initialises MPI with the binary's settings

import torch
import torch.distributed as dist
import torch.nn as nn

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from numpy_logreg import load  # noqa: E402  (the IDX reader of the numpy example)


def standardised_shards(seed):
    """This rank's shard (every size-th example of a seeded permutation) and the test set, both
    standardised with the whole training set's moments (combined over the ranks)."""
    X_all, y_all = load("train")
    perm = np.random.default_rng(seed).permutation(len(y_all))[at.rank :: at.size]
    X, y = X_all[perm].astype(np.float32), y_all[perm]
    del X_all
    d = X.shape[1]
    sums = at.allreduce_sum(np.concatenate([X.sum(0, dtype=np.float64), (X.astype(np.float64) ** 2).sum(0), [len(y)]]))
    mean = sums[:d] / sums[-1]
    std = np.sqrt(np.maximum(sums[d : 2 * d] / sums[-1] - mean**2, 0.0))
    std[std < 1e-8] = 1.0
    Xt, yt = load("t10k")
    lo, hi = len(yt) * at.rank // at.size, len(yt) * (at.rank + 1) // at.size
    Xt = Xt[lo:hi]  # each rank scores its contiguous part of the test set
    norm = lambda a: torch.from_numpy(((a.astype(np.float32) - mean) / std).astype(np.float32))  # noqa: E731
    return norm(X), torch.from_numpy(y), norm(Xt), torch.from_numpy(yt[lo:hi])


def make_net(d, hidden, seed):
    torch.manual_seed(seed)  # the same initial model on every rank, for every way
    return nn.Sequential(nn.Linear(d, hidden), nn.ReLU(), nn.Linear(hidden, 10))


def ddp_group(seed):
    """gloo over loopback TCP; rank 0 picks a free port and tells the others through MPI."""
    port = 0
    if at.rank == 0:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
    port = int(at.allreduce_sum(float(port)))
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    dist.init_process_group("gloo", init_method="tcp://127.0.0.1:%d" % port, rank=at.rank, world_size=at.size)


def evaluate(net, Xt, yt):
    """Test loss and accuracy of `net` (the same model on every rank) over the whole test set."""
    with torch.no_grad():
        z = net(Xt)
        loss = float(nn.functional.cross_entropy(z, yt, reduction="sum"))
        right = float((z.argmax(1) == yt).sum())
    s = at.allreduce_sum(np.array([loss, right, len(yt)]))
    return s[0] / s[2], s[1] / s[2]


def train(way, a, data, out):
    X, y, Xt, yt = data
    net = make_net(X.shape[1], a.hidden, a.seed)
    flat, reducer, model = None, None, net
    if way == "ddp":
        from torch.nn.parallel import DistributedDataParallel

        model = DistributedDataParallel(net)
    else:
        flat = at.flatten_module(net)  # net's parameters are views of flat from here on
        opts = {"graph": a.graph, "notify": a.notify} if way == "asap" else {}
        reducer = at.Reducer(flat, sync=way, seed=a.seed, **opts)
    opt = torch.optim.SGD(net.parameters(), lr=a.lr, weight_decay=a.lam)
    nparams = sum(p.numel() for p in net.parameters())
    rng = np.random.default_rng([a.seed, at.rank])  # the same batches for every way
    steps = (60000 // at.size) // a.batch_size  # the smallest shard decides: equal on all ranks
    batches = hashlib.sha256()
    scored = make_net(X.shape[1], a.hidden, a.seed)  # holds the average of the replicas
    clock = 0.0
    for epoch in range(a.epochs):
        for g in opt.param_groups:
            g["lr"] = a.lr * a.lr_decay**epoch
        order = rng.permutation(len(y))
        batches.update(order[: steps * a.batch_size].tobytes())
        loss_sum = 0.0
        t0 = time.perf_counter()
        for s in range(steps):
            idx = torch.from_numpy(order[s * a.batch_size : (s + 1) * a.batch_size])
            opt.zero_grad(set_to_none=True)
            loss = nn.functional.cross_entropy(model(X[idx]), y[idx])
            loss.backward()  # ddp: the gradients are averaged here
            opt.step()
            if reducer is not None:
                reducer.sync(flat)  # allreduce, asap: the models are averaged here
            loss_sum += loss.item()
        clock += time.perf_counter() - t0
        # The average of the replicas (for ddp and allreduce every replica already is it), and how
        # far the replicas are from it: sqrt(mean_i ||x_i - avg||^2) / ||avg||.
        mine = np.concatenate([p.detach().numpy().ravel() for p in net.parameters()]).astype(np.float64)
        avg = at.allreduce_sum(mine) / at.size
        spread = np.sqrt(at.allreduce_sum(float(((mine - avg) ** 2).sum())) / at.size) / np.linalg.norm(avg)
        at.unflatten_module(avg.astype(np.float32), scored)
        test_loss, acc = evaluate(scored, Xt, yt)
        train_loss = at.allreduce_sum(loss_sum / steps) / at.size
        seconds = at.allreduce_sum(clock) / at.size
        if at.rank == 0:
            print("%-9s epoch %d  train loss %.4f  test loss %.4f  test accuracy %.4f  replica spread %.1e  train seconds %.1f"
                  % (way, epoch + 1, train_loss, test_loss, acc, spread, seconds), flush=True)
    rounds = a.epochs * steps
    if way == "ddp":
        # gloo counts nothing: a ring all-reduce sends 2 (N-1)/N of the gradients per step, which
        # is how asap-train counts its own allreduce.
        sent, extra = 2 * (at.size - 1) / at.size * 4 * nparams * rounds, ""
    else:
        reducer.finish(flat)
        g = reducer.global_stats()
        sent = g["bytes_sent_mean"]
        extra = ", torn %d, consistency histogram %s" % (g["torn"], g["consistency_histogram"]) if way == "asap" else ""
    out[way] = avg
    if at.rank == 0:
        print("%-9s summary: test accuracy %.4f, test loss %.4f, %d rounds, %.1f train seconds, %.0f bytes sent per rank per round%s, batches sha256 %s"
              % (way, acc, test_loss, rounds, seconds, sent / rounds, extra, batches.hexdigest()[:16]), flush=True)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--sync", default="ddp,allreduce,asap", help="ways to train, in order: ddp, allreduce, asap, none")
    p.add_argument("--graph", default="auto", help="asap's --graph")
    p.add_argument("--notify", default="notify-ack", help="asap's --notify")
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--hidden", type=int, default=128)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--lr", type=float, default=0.1)
    p.add_argument("--lr-decay", type=float, default=0.8, help="step size factor per epoch")
    p.add_argument("--lambda", dest="lam", type=float, default=1e-4, help="L2 (SGD weight decay)")
    p.add_argument("--seed", type=int, default=1)
    a = p.parse_args()
    ways = a.sync.split(",")
    bad = [w for w in ways if w not in ("ddp", "allreduce", "asap", "none")]
    if bad:
        p.error("--sync: unknown way(s) %s (ddp, allreduce, asap, none)" % ",".join(bad))
    # One thread per rank: the ranks already share the cores (asap_train set one BLAS thread).
    torch.set_num_threads(1)
    if "ddp" in ways:
        ddp_group(a.seed)
    data = standardised_shards(a.seed)
    if at.rank == 0:
        print("torch %s, %d ranks, MLP 784-%d-10, batch %d, lr %g (x%g per epoch), L2 %g, %d epochs, %d steps per epoch"
              % (torch.__version__, at.size, a.hidden, a.batch_size, a.lr, a.lr_decay, a.lam, a.epochs,
                 (60000 // at.size) // a.batch_size), flush=True)
    out = {}
    for way in ways:
        train(way, a, data, out)
    if "ddp" in out and "allreduce" in out and at.rank == 0:
        d, r = out["ddp"], out["allreduce"]
        print("ddp vs allreduce: final models differ by %.2e (relative, 2-norm), the same algorithm up to float rounding"
              % (np.linalg.norm(d - r) / np.linalg.norm(d)), flush=True)
    if dist.is_initialized():
        dist.destroy_process_group()


if __name__ == "__main__":
    sys.exit(main())
