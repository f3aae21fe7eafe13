"""asap_train.torch: Horovod's and Bluefog's habits for a PyTorch model on an asap_train Reducer
(see docs/python.md). Importing it imports torch (``make torch`` installs it, opt-in); the
package itself does not depend on torch.

    import asap_train as at, asap_train.torch as att
    att.broadcast_parameters(model, root=0)                  # every rank starts from rank 0's model
    opt = att.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9),
                                   model, sync="allreduce")  # or "asap", graph=..., sync_every=H
    sampler = at.DistributedSampler(len(data), seed=1)
    for epoch in range(epochs):
        sampler.set_epoch(epoch)
        for batch in batches(sampler):
            opt.zero_grad(); loss(batch).backward(); opt.step()   # the step, then the sync
    opt.finish()                                             # every rank: the average model

The optimizer's state (momentum buffers, Adam's moments) stays each rank's own at a sync: only
the parameters are exchanged. Why: with plain or momentum SGD and a sync after every step the
average of the ranks' momentum buffers evolves exactly as DDP's buffer of averaged gradients
(both are linear in the gradients), so averaging them would change nothing but the bytes (twice
the model's); with local steps between syncs (local SGD, DiLoCo, whose inner AdamW keeps its
state per worker) the state describes the rank's own gradients, which is what the next local
steps follow. Adam's second moment is not linear in the gradients, so no choice makes it DDP's.
"""

import torch

import asap_train as _at

__all__ = ["broadcast_parameters", "DistributedOptimizer"]


def broadcast_parameters(module_or_state, root=0):
    """Collective: every rank's parameters and buffers become ``root``'s, bit for bit, in place.
    Takes a module (its ``state_dict()``: parameters and buffers, sharing their memory) or a
    state_dict / dict of CPU tensors or numpy arrays (Horovod's ``broadcast_parameters``)."""
    if isinstance(module_or_state, torch.nn.Module):
        module_or_state = module_or_state.state_dict(keep_vars=False)
    _at.broadcast_parameters(module_or_state, root)


class DistributedOptimizer:
    """Wraps a torch optimizer: ``step()`` runs its step, then every ``sync_every`` steps syncs the
    module's parameters through a Reducer (model averaging after the step: with plain SGD from
    equal replicas and ``sync="allreduce"``, the same model as DDP's averaged gradients).

    ``sync`` is a mode name (``"allreduce"``, ``"asap"``, ``"none"``; ``reducer_options`` are the
    Reducer's: ``graph=``, ``notify=``, ``outer=`` ...) or a Reducer already made over a vector of
    the module's size. The module's parameters become views of one flat float32 vector
    (``asap_train.flatten_module``; values kept, the optimizer keeps working on them), so the
    Reducer changes the module in place. The optimizer's state stays local (module doc).

    ``join()`` when this rank runs out of data (Reducer.join: the others' syncs go on without
    it); ``finish()`` at the end (collective: every rank's module becomes the mode's final
    model). Other attributes (``zero_grad``, ``param_groups``, ``state_dict`` ...) are the
    wrapped optimizer's."""

    def __init__(self, optimizer, module, sync="allreduce", sync_every=1, **reducer_options):
        if int(sync_every) < 1:
            raise ValueError("sync_every=%r: sync after every H >= 1 steps" % (sync_every,))
        self.optimizer, self.module, self.sync_every = optimizer, module, int(sync_every)
        self.flat = _at.flatten_module(module)
        if isinstance(sync, str):
            self.reducer = _at.Reducer(self.flat, sync=sync, **reducer_options)
        elif reducer_options:
            raise TypeError("reducer options %s go with sync=<mode name>, not with a Reducer" % sorted(reducer_options))
        else:
            if sync.size != self.flat.size:
                raise ValueError("the Reducer takes %d values, but the module has %d parameters" % (sync.size, self.flat.size))
            self.reducer = sync
        self.steps = 0

    def step(self, closure=None):
        """The wrapped optimizer's step, then a sync of the parameters every ``sync_every`` steps."""
        loss = self.optimizer.step(closure) if closure is not None else self.optimizer.step()
        self.steps += 1
        if self.steps % self.sync_every == 0:
            self.synchronize()
        return loss

    def synchronize(self):
        """One sync of the parameters now (collective in the mode's sense)."""
        with torch.no_grad():
            self.reducer.sync(self.flat)

    def join(self):
        """This rank has no more batches: answer the others' syncs until every rank has joined."""
        with torch.no_grad():
            self.reducer.join(self.flat)

    def finish(self):
        """Collective end: every rank's module holds the mode's final model (the average)."""
        with torch.no_grad():
            self.reducer.finish(self.flat)

    def __getattr__(self, name):
        return getattr(self.optimizer, name)
