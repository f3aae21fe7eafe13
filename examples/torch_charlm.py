"""A character-level transformer language model trained with PyTorch DDP, tuned local SGD, DiLoCo
and NoLoCo in one MPI job, from the same initial model and on the same mini-batches (issue 40,
item 3: the language model, where DiLoCo makes its claims).

    make torch                  # opt-in: torch from PyPI into .venv-torch (large), with asap_train
    mpirun -n 8 .venv-torch/bin/python examples/torch_charlm.py
    mpirun -n 8 .venv-torch/bin/python examples/torch_charlm.py --ways ddp,local:32,diloco:32:0.7

The text is the licences Debian's base-files ships in /usr/share/common-licenses (an Essential
package: present on every Debian system), the regular files in name order, concatenated (237 KB
of English prose, 86 distinct characters). Split by position: the first 90 % trains, the last
10 % (the last 7 KB of MPL-1.1 and all of MPL-2.0) is held out. A licence text, so that the run needs nothing
the project does not already install; a larger corpus would favour the longer intervals more.

The ways (each a comma-separated item of --ways; H is the interval in inner steps, LR the outer
step size):
- ddp: torch's DistributedDataParallel over gloo; the gradients are averaged in every backward();
- local:H: tuned local SGD, an asap_train allreduce Reducer called every H steps (plain
  averaging, no outer optimizer);
- diloco:H:LR: DiLoCo (arXiv 2311.08105), the allreduce Reducer with outer="nesterov" (momentum
  0.9) called every H steps;
- noloco:H:LR: NoLoCo (arXiv 2506.10911), the asap Reducer on graph="one-peer-exponential" (one
  peer a round, as NoLoCo) with outer="nesterov", every H steps.
Every way's inner optimizer is torch's AdamW (DiLoCo's inner optimizer), with the same step-size
schedule (linear warm-up, then cosine to a tenth). AdamW's state (its moments and step count)
stays per rank at a sync: a Reducer averages (and steps) the parameters only, as DiLoCo does.
Under ddp the ranks' AdamW states are equal, since they see the same averaged gradients.

Every rank takes its mini-batches (windows of the training text at offsets from its own seeded
stream, restarted for each way) and every way starts from the same seeded model. At the end the
average of the replicas (for ddp, local and diloco already every replica) is scored on the whole
held-out text (cross-entropy in nats per character, every position of non-overlapping windows).

Bytes: a Reducer counts its own (`global_stats()["bytes_sent_mean"]`: a ring allreduce's 2 (N-1)/N
of the model per sync, the asap messages as sent). gloo counts nothing, so ddp's are computed the
same way: 2 (N-1)/N x 4 bytes x the gradient's length, per step. The final average of the
replicas (one allreduce, `final_bytes`, for scoring) is printed apart: it is not a training sync.
Rank 0 prints a table: way, held-out loss, its difference from ddp's, bytes per rank, ddp's bytes
over the way's.

Measured reasons for the choices (8 ranks on this 2-core machine, docs/low-communication.md):
- 2 layers, width 64, 4 heads, context 64, batch 16 per rank (115,286 parameters), one torch
  thread a rank: 8 ranks share 2 cores; 1,024 steps of a way took 3-8 min here at load 10-40
  (0.13 s a step at load 5), so the grid was one seed;
- the intervals are powers of two, the project's grid, and the same for local SGD and DiLoCo;
  the default --ways are the picks of docs/low-communication.md: the best of each way at 50x or
  more fewer bytes than ddp (local and diloco: H = 64; noloco, one model a sync against the
  ring's 1.75: H = 32).
"""

import argparse
import hashlib
import math
import os
import socket
import sys
import time

import numpy as np

import asap_train as at  # first: it initialises MPI with the binary's settings

import torch
import torch.distributed as dist
import torch.nn as nn

LICENCES = "/usr/share/common-licenses"


def licence_text():
    """The regular files of LICENCES in name order (symlinks such as GPL -> GPL-3 left out), as
    one byte string."""
    names = sorted(n for n in os.listdir(LICENCES) if not os.path.islink(os.path.join(LICENCES, n)))
    if not names:
        raise SystemExit("%s is empty: it comes with Debian's base-files package (apt-get install base-files)" % LICENCES)
    parts = []
    for n in names:
        with open(os.path.join(LICENCES, n), "rb") as f:
            parts.append(f.read())
    return b"".join(parts), names


def split_text(held_out):
    """(train ids, held-out ids, vocabulary size): characters as indices into the sorted set of
    bytes the text uses, split by position."""
    text, _ = licence_text()
    vocab = np.unique(np.frombuffer(text, dtype=np.uint8))
    ids = np.searchsorted(vocab, np.frombuffer(text, dtype=np.uint8)).astype(np.int64)
    cut = int(len(ids) * (1 - held_out))
    return torch.from_numpy(ids[:cut]), torch.from_numpy(ids[cut:]), len(vocab)


class CharTransformer(nn.Module):
    """Token and position embeddings, pre-norm causal transformer layers, a final norm and a linear
    read-out to the next character's logits."""

    def __init__(self, vocab, width, layers, heads, context):
        super().__init__()
        self.embed = nn.Embedding(vocab, width)
        self.position = nn.Parameter(torch.zeros(context, width))
        nn.init.normal_(self.position, std=0.02)
        layer = nn.TransformerEncoderLayer(width, heads, 4 * width, dropout=0.0, activation="gelu", batch_first=True, norm_first=True)
        self.blocks = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.norm = nn.LayerNorm(width)
        self.readout = nn.Linear(width, vocab)
        self.register_buffer("causal", nn.Transformer.generate_square_subsequent_mask(context), persistent=False)

    def forward(self, x):
        t = x.shape[1]
        h = self.embed(x) + self.position[:t]
        h = self.blocks(h, mask=self.causal[:t, :t], is_causal=True)
        return self.readout(self.norm(h))


def make_net(vocab, a):
    torch.manual_seed(a.seed)  # the same initial model on every rank, for every way
    return CharTransformer(vocab, a.width, a.layers, a.heads, a.context)


def ddp_group():
    """gloo over loopback TCP; rank 0 picks a free port and tells the others through MPI."""
    port = 0
    if at.rank == 0:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
    port = int(at.allreduce_sum(float(port)))
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    dist.init_process_group("gloo", init_method="tcp://127.0.0.1:%d" % port, rank=at.rank, world_size=at.size)


def held_out_loss(net, val, context):
    """Mean cross-entropy (nats per character) of `net` over every position of the held-out text's
    non-overlapping windows of `context + 1` characters, the windows split over the ranks."""
    windows = (len(val) - 1) // context
    mine = range(windows * at.rank // at.size, windows * (at.rank + 1) // at.size)
    total, count = 0.0, 0
    with torch.no_grad():
        for lo in range(mine.start, mine.stop, 64):
            starts = torch.arange(lo, min(lo + 64, mine.stop)) * context
            x = torch.stack([val[s : s + context] for s in starts.tolist()])
            y = torch.stack([val[s + 1 : s + 1 + context] for s in starts.tolist()])
            z = net(x)
            total += float(nn.functional.cross_entropy(z.reshape(-1, z.shape[-1]), y.reshape(-1), reduction="sum"))
            count += y.numel()
    s = at.allreduce_sum(np.array([total, count]))
    return s[0] / s[1]


def step_size(a, step):
    """Linear warm-up over a.warmup steps, then cosine from a.lr to a.lr / 10 at the last step."""
    if step < a.warmup:
        return a.lr * (step + 1) / a.warmup
    progress = (step - a.warmup) / max(1, a.steps - a.warmup)
    return a.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress)))


def parse_way(item):
    """'ddp', 'local:H', 'diloco:H:LR', 'noloco:H:LR' -> (kind, H, outer lr)."""
    parts = item.split(":")
    kind = parts[0]
    arity = {"ddp": 1, "local": 2, "diloco": 3, "noloco": 3}
    if kind not in arity or len(parts) != arity[kind]:
        raise ValueError("--ways: %r is not one of ddp, local:H, diloco:H:LR, noloco:H:LR" % item)
    every = int(parts[1]) if len(parts) > 1 else 1
    outer_lr = float(parts[2]) if len(parts) > 2 else None
    if every < 1:
        raise ValueError("--ways: %r: H must be at least 1" % item)
    return kind, every, outer_lr


def make_reducer(kind, flat, every, outer_lr, a):
    """The asap_train Reducer of a way (None for ddp)."""
    if kind == "local":
        return at.Reducer(flat, sync="allreduce", seed=a.seed)
    nesterov = {"outer": "nesterov", "outer_lr": outer_lr, "outer_momentum": a.outer_momentum}
    if kind == "diloco":
        return at.Reducer(flat, sync="allreduce", seed=a.seed, **nesterov)
    return at.Reducer(flat, sync="asap", graph="one-peer-exponential", seed=a.seed, **nesterov)


def train(item, a, data):
    """Trains one way from the seeded model; returns (held-out loss, bytes per rank, final-average
    bytes, seconds)."""
    kind, every, outer_lr = parse_way(item)
    train_ids, val, vocab = data
    net = make_net(vocab, a)
    model, flat, reducer = net, None, None
    if kind == "ddp":
        from torch.nn.parallel import DistributedDataParallel

        model = DistributedDataParallel(net)
    else:
        flat = at.flatten_module(net)  # net's parameters are views of flat from here on
        reducer = make_reducer(kind, flat, every, outer_lr, a)
    opt = torch.optim.AdamW(net.parameters(), lr=a.lr, weight_decay=a.weight_decay)
    rng = np.random.default_rng([a.seed, at.rank])  # the same batches for every way
    offsets = torch.arange(a.context + 1)
    batches = hashlib.sha256()
    clock, loss_sum = 0.0, 0.0
    t0 = time.perf_counter()
    for step in range(a.steps):
        for g in opt.param_groups:
            g["lr"] = step_size(a, step)
        starts = torch.from_numpy(rng.integers(0, len(train_ids) - a.context - 1, a.batch_size))
        batches.update(starts.numpy().tobytes())
        window = train_ids[starts[:, None] + offsets]
        opt.zero_grad(set_to_none=True)
        z = model(window[:, :-1])
        loss = nn.functional.cross_entropy(z.reshape(-1, vocab), window[:, 1:].reshape(-1))
        loss.backward()  # ddp: the gradients are averaged here
        opt.step()
        if reducer is not None and (step + 1) % every == 0:
            reducer.sync(flat)  # local, diloco, noloco: the sync (and the outer step) is here
        loss_sum += loss.item()
        if (step + 1) % a.print_every == 0:
            mean = at.allreduce_sum(loss_sum / a.print_every) / at.size
            if at.rank == 0:
                print("%-16s step %5d  train loss %.4f  %.0f s" % (item, step + 1, mean, time.perf_counter() - t0), flush=True)
            loss_sum = 0.0
    clock = at.allreduce_sum(time.perf_counter() - t0) / at.size
    nparams = sum(p.numel() for p in net.parameters())
    if a.check is not None and kind in ("ddp", "local", "diloco") and a.steps % every == 0:
        check_replicas_equal(item, net)
    if kind == "ddp":
        # gloo counts nothing: a ring all-reduce sends 2 (N-1)/N of the gradient per step, which
        # is how asap-train counts its own allreduce.
        sent, final = 2 * (at.size - 1) / at.size * 4 * nparams * a.steps, 0.0
    else:
        reducer.finish(flat)  # the average of the replicas, on every rank
        g = reducer.global_stats()
        sent, final = g["bytes_sent_mean"], g["final_bytes_mean"]
        if a.check is not None and kind != "noloco":
            check_bytes(item, g, a.steps // every, nparams)
    if a.check is not None:
        check_same_batches(item, batches.digest(), a.check)
    return held_out_loss(net, val, a.context), sent, final, clock, nparams


def fail(item, what):
    """A failed --check: the message on the failing rank, and the job ends (asap_train's
    excepthook prints it and aborts every rank, also when only this rank failed)."""
    raise AssertionError("--check failed for %s on rank %d: %s" % (item, at.rank, what))


def check_replicas_equal(item, net):
    """ddp after any step, local and diloco right after a sync: every rank holds rank 0's model,
    bit for bit (rank 0's float32 values travel exactly in the float64 sum)."""
    mine = np.concatenate([p.detach().numpy().ravel() for p in net.parameters()]).astype(np.float64)
    first = at.allreduce_sum(mine if at.rank == 0 else np.zeros_like(mine))
    differ = int(at.allreduce_sum(float(np.count_nonzero(mine != first))))
    if differ:
        fail(item, "%d parameter values differ from rank 0's after the last sync, summed over ranks" % differ)


def check_bytes(item, g, syncs, nparams):
    """An allreduce Reducer's counter against the ring volume computed here: syncs x
    floor(2 (N-1)/N x 4 x parameters), on every rank (the mean and the maximum)."""
    want = syncs * int(2.0 * (at.size - 1) / at.size * 4 * nparams) if at.size > 1 else 0
    if g["bytes_sent_mean"] != want or g["bytes_sent_max"] != want:
        fail(item, "bytes sent: mean %s, max %s, computed %d (%d syncs)" % (g["bytes_sent_mean"], g["bytes_sent_max"], want, syncs))


def check_same_batches(item, digest, seen):
    """Every way took the same mini-batches on this rank: the hash of its window offsets equals
    the first way's."""
    first = seen.setdefault("batches", digest)
    if digest != first:
        fail(item, "its mini-batches differ from the first way's (hash %s, first %s)" % (digest.hex()[:16], first.hex()[:16]))


def report(rows, nparams, a):
    """Rank 0's table: way, held-out loss, against ddp, bytes per rank, ddp's bytes over the way's."""
    base = rows.get("ddp")
    print("\n%d ranks, %d parameters, %d steps of batch %d x context %d per rank, AdamW lr %g, seed %d"
          % (at.size, nparams, a.steps, a.batch_size, a.context, a.lr, a.seed))
    print("| way | held-out loss (nats/char) | vs ddp | bytes sent per rank | ddp's bytes / way's | train seconds |")
    print("| --- | --- | --- | --- | --- | --- |")
    for item, (loss, sent, final, clock, _) in rows.items():
        vs = "%+.2f %%" % (100 * (loss / base[0] - 1)) if base else "-"
        ratio = "%.1fx" % (base[1] / sent) if base and sent > 0 else "-"
        extra = " (+%.0f final average)" % final if final else ""
        print("| %s | %.4f | %s | %.0f%s | %s | %.0f |" % (item, loss, vs, sent, extra, ratio, clock))
    sys.stdout.flush()


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--ways", default="ddp,local:64,diloco:64:1.0,noloco:32:0.7",
                   help="comma-separated: ddp, local:H, diloco:H:OUTER_LR, noloco:H:OUTER_LR")
    p.add_argument("--steps", type=int, default=1024)
    p.add_argument("--batch-size", type=int, default=16, help="windows per rank per step")
    p.add_argument("--context", type=int, default=64)
    p.add_argument("--width", type=int, default=64)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--lr", type=float, default=3e-3, help="AdamW's peak step size")
    p.add_argument("--warmup", type=int, default=32)
    p.add_argument("--weight-decay", type=float, default=0.01)
    p.add_argument("--outer-momentum", type=float, default=0.9)
    p.add_argument("--held-out", type=float, default=0.1, help="the last fraction of the text")
    p.add_argument("--print-every", type=int, default=256)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--check", action="store_const", const={}, default=None,
                   help="assert (make test-charlm): the same batches for every way, ddp's and, after a sync, local's and "
                        "diloco's replicas equal bit for bit, the allreduce Reducer's bytes equal the ring volume")
    a = p.parse_args()
    items = a.ways.split(",")
    try:
        [parse_way(w) for w in items]
    except ValueError as e:
        p.error(str(e))
    # One thread per rank: the ranks already share the cores (asap_train set one BLAS thread).
    torch.set_num_threads(1)
    if "ddp" in items:
        ddp_group()
    data = split_text(a.held_out)
    if at.rank == 0:
        print("torch %s, %d ranks, text %s/* (%d train, %d held-out characters, %d distinct)"
              % (torch.__version__, at.size, LICENCES, len(data[0]), len(data[1]), data[2]), flush=True)
    rows = {}
    for item in items:
        rows[item] = train(item, a, data)
        if at.rank == 0:
            loss, sent, final, clock, _ = rows[item]
            print("%-16s held-out loss %.4f, %.0f bytes sent per rank, %.0f s" % (item, loss, sent, clock), flush=True)
    if at.rank == 0:
        report(rows, next(iter(rows.values()))[4], a)
    if a.check is not None and at.rank == 0:
        print("--check: the same batches for every way, replicas equal after the last sync, bytes as computed: passed")
    if dist.is_initialized():
        dist.destroy_process_group()


if __name__ == "__main__":
    sys.exit(main())
