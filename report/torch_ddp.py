"""PyTorch DistributedDataParallel peer for the report (`make report PEERS=torch`, section `torch`).

8 CPU processes (mp.spawn), gloo backend, one thread each, training the model asap-train trains in
the same section, set up as asap-train sets it up (src/train/setup.rs, src/train/mod.rs):
- data: Fashion-MNIST from Debian's dataset-fashion-mnist; rank r reads the rows
  [n r / N, n (r + 1) / N) of the training file (asap-train's contiguous IID shard, `shard_rows`);
  features standardised per pixel with the mean and population variance of the whole training set
  (sums of every rank's shard, all-reduced in float64; a constant pixel keeps scale 1), applied to
  the held-out set too (`--scale auto` for dense data);
- model: `mlr` is softmax regression, weights and biases starting at zero; `mlp` is one hidden ReLU
  layer (asap-train's default width 128) with asap-train's initialisation, He normal weights
  N(0, 2 / fan_in) and zero biases, drawn from torch's generator (so the values differ);
- loss: mean cross-entropy over the mini-batch, L2 lambda/2 ||W||^2 on the weights only (SGD
  weight_decay on the weight tensors, 0 on the biases), plain SGD without momentum;
- schedule: eta = lr * decay^epoch (`--lr-schedule decay`, asap-train's default 0.3 and 0.8);
- batches: every rank does the same number of mini-batches per epoch, the smallest over ranks of
  ceil(shard / batch); each epoch a rank shuffles its shard (own seeded stream) and batch s takes
  perm[s b .. min((s + 1) b, shard)], the last one the examples left, as asap-train does (its
  random stream differs, so the batches do);
- DDP averages the gradients in every step: with equal replicas this is the model averaging of
  `--sync allreduce --sync-every 1` (w (1 - eta lambda) - eta mean_i g_i either way);
- evaluation: every EVAL_EVERY steps (a round) and at the end, the model (equal on every rank) on
  the 10,000 held-out images, each rank scoring its contiguous part and the counts all-reduced.
  Evaluation and the collectives that time it are outside the training clock, as in asap-train;
  an eval's train_seconds is the slowest rank's training clock at that round.

Writes an asap-train-shaped metrics file (start, eval and summary lines; `asap-train plot` reads
it). bytes_sent is the ring all-reduce volume 2 (N-1)/N * model bytes per step, counted as
asap-train counts its own allreduce (gloo does not report what it sent).
"""
import argparse
import json
import os
import sys
import time

# The IDX reader the scikit-learn peers use (report/ is this script's directory, so it is on
# sys.path here and in the spawned workers, which inherit it).
from peers import FASHION, idx


def shard(n, rank, nranks):
    return n * rank // nranks, n * (rank + 1) // nranks


def worker(rank, a, init_file):
    # One thread per process, set before torch does any work.
    os.environ["OMP_NUM_THREADS"] = "1"
    import numpy as np
    import torch
    import torch.distributed as dist
    import torch.nn as nn
    from torch.nn.parallel import DistributedDataParallel as DDP

    torch.set_num_threads(1)
    torch.set_num_interop_threads(1)
    N = a.ranks
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=N)
    t_load = time.perf_counter()
    X = idx(f"{FASHION}/train-images-idx3-ubyte.gz")
    y = idx(f"{FASHION}/train-labels-idx1-ubyte.gz")
    lo, hi = shard(len(X), rank, N)
    x = X[lo:hi].reshape(hi - lo, -1).astype(np.float64)
    y = torch.from_numpy(y[lo:hi].astype(np.int64))
    Xt = idx(f"{FASHION}/t10k-images-idx3-ubyte.gz")
    yt = idx(f"{FASHION}/t10k-labels-idx1-ubyte.gz")
    tlo, thi = shard(len(Xt), rank, N)
    xt = Xt[tlo:thi].reshape(thi - tlo, -1).astype(np.float64)
    yt = torch.from_numpy(yt[tlo:thi].astype(np.int64))
    del X, Xt
    d = x.shape[1]
    # Standardisation with the whole training set's moments (float64 sums over the ranks).
    mom = torch.from_numpy(np.concatenate([x.sum(0), (x * x).sum(0), [len(x)]]))
    dist.all_reduce(mom)
    mom = mom.numpy()
    cnt = max(mom[2 * d], 1.0)
    mean = mom[:d] / cnt
    var = np.maximum(mom[d:2 * d] / cnt - mean * mean, 0.0)
    scale = np.where(var > 1e-12, 1.0 / np.sqrt(np.where(var > 1e-12, var, 1.0)), 1.0).astype(np.float32)
    shift = mean.astype(np.float32)
    x = torch.from_numpy((x.astype(np.float32) - shift) * scale)
    xt = torch.from_numpy((xt.astype(np.float32) - shift) * scale)
    classes = 10
    load_seconds = time.perf_counter() - t_load

    torch.manual_seed(a.seed)
    if a.model == "mlr":
        net = nn.Linear(d, classes)
        nn.init.zeros_(net.weight)
        nn.init.zeros_(net.bias)
    else:
        net = nn.Sequential(nn.Linear(d, a.hidden), nn.ReLU(), nn.Linear(a.hidden, classes))
        for layer in (net[0], net[2]):
            nn.init.normal_(layer.weight, 0.0, (2.0 / layer.in_features) ** 0.5)
            nn.init.zeros_(layer.bias)
    params = sum(p.numel() for p in net.parameters())
    model = DDP(net)  # broadcasts rank 0's parameters: every replica starts equal
    weights = [p for n, p in net.named_parameters() if n.endswith("weight")]
    biases = [p for n, p in net.named_parameters() if n.endswith("bias")]
    opt = torch.optim.SGD([{"params": weights, "weight_decay": a.lam}, {"params": biases, "weight_decay": 0.0}], lr=a.lr)
    loss_fn = nn.CrossEntropyLoss()
    n_local = len(x)
    steps = torch.tensor([-(-n_local // a.batch_size)])
    dist.all_reduce(steps, op=dist.ReduceOp.MIN)
    steps = int(steps)
    rng = np.random.default_rng([a.seed, rank])
    ring = 2 * (N - 1) / N * params * 4  # bytes per step, as asap-train counts its allreduce

    def evaluate():
        with torch.no_grad():
            z = net(xt)
            s = torch.tensor([float(loss_fn(z, yt)) * len(yt), float((z.argmax(1) == yt).sum()), float(len(yt))], dtype=torch.float64)
        dist.all_reduce(s)
        return s[0].item() / s[2].item(), s[1].item() / s[2].item()

    def slowest(t):
        v = torch.tensor([t], dtype=torch.float64)
        dist.all_reduce(v, op=dist.ReduceOp.MAX)
        return v.item()

    lines = []
    cfg = {"model": a.model, "sync": "ddp-gloo", "batch_size": a.batch_size, "lr": a.lr, "lr_decay": a.decay,
           "lr_schedule": "decay", "lambda": a.lam, "epochs": a.epochs, "eval_every": a.eval_every, "seed": a.seed,
           "partition": "iid", "hidden": [a.hidden] if a.model == "mlp" else None, "torch": torch.__version__,
           "threads_per_rank": torch.get_num_threads(), "backend": dist.get_backend()}
    if rank == 0:
        lines.append({"event": "start", "ranks": N, "config": cfg, "params": params, "load_seconds": load_seconds,
                      "train_examples": 60000, "test_examples": 10000, "steps_per_epoch": steps})

    def point(step, epoch_frac, train_s):
        obj, acc = evaluate()
        if rank == 0:
            b = ring * step
            lines.append({"event": "eval", "round": step, "step": step, "epoch": epoch_frac, "train_seconds": train_s,
                          "metric": "accuracy", "test_metric": acc, "objective": obj,
                          "counters": {"bytes_sent": {"mean": b, "max": b}}})
        return acc

    dist.barrier()
    clock = 0.0
    step = 0
    examples = 0
    acc = None
    for epoch in range(a.epochs):
        for g in opt.param_groups:
            g["lr"] = a.lr * a.decay ** epoch
        perm = torch.from_numpy(rng.permutation(n_local))
        for s in range(steps):
            t0 = time.perf_counter()
            ids = perm[s * a.batch_size:min((s + 1) * a.batch_size, n_local)]
            opt.zero_grad(set_to_none=True)
            loss = loss_fn(model(x[ids]), y[ids])
            loss.backward()  # DDP all-reduces (averages) the gradients here
            opt.step()
            clock += time.perf_counter() - t0
            step += 1
            examples += len(ids)
            if a.eval_every and step % a.eval_every == 0:
                point(step, epoch + (s + 1) / steps, slowest(clock))
        if not a.eval_every:
            point(step, epoch + 1.0, slowest(clock))
    train_s = slowest(clock)
    obj, acc = evaluate()
    if rank == 0:
        b = ring * step
        lines.append({"event": "summary", "ranks": N, "sync": "ddp-gloo", "epochs": float(a.epochs), "rounds": step,
                      "train_seconds": train_s, "examples_per_second_per_rank": examples / train_s,
                      "final_metric": acc, "objective": obj, "metric": "accuracy", "held_out": True, "load_seconds": load_seconds,
                      "counters": {"bytes_sent": {"mean": b, "max": b}}, "torch": torch.__version__})
        with open(a.metrics, "w") as f:
            f.write("".join(json.dumps(l) + "\n" for l in lines))
        print(f"torch DDP {a.model}, {N} ranks: {100 * acc:.2f} % after {step} steps, {train_s:.2f} s training, "
              f"{step * a.batch_size / train_s:,.0f} examples/s per rank", file=sys.stderr)
    dist.barrier()
    dist.destroy_process_group()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--ranks", type=int, default=8)
    ap.add_argument("--model", choices=["mlr", "mlp"], default="mlr")
    ap.add_argument("--hidden", type=int, default=128)
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument("--lr", type=float, default=0.3)
    ap.add_argument("--decay", type=float, default=0.8)
    ap.add_argument("--lambda", dest="lam", type=float, default=1e-5)
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--eval-every", type=int, default=10)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--metrics", required=True)
    a = ap.parse_args()
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    import tempfile

    import torch.multiprocessing as mp

    with tempfile.TemporaryDirectory() as d:
        mp.spawn(worker, args=(a, os.path.join(d, "init")), nprocs=a.ranks, join=True)


if __name__ == "__main__":
    main()
