"""The trainer group: ranks launched by ``torchrun`` train one dense model together.

Persia's hybrid. Dense parameters are replicated on every rank and stay
bitwise identical: each *group step* ends in one synchronous all-reduce, and
every rank applies the same optimizer step to the same gradient. Sparse rows
are not replicated: each rank pulls and pushes its own batch's rows through
the store, asynchronously, as a single trainer does.

One group step is one all-reduce (SUM) of one flat tensor::

    [ n_r * grad_r (every dense parameter, flattened) | n_r | stop_r | exhausted_r | checkpoint_r ]

Afterwards every rank holds the same sums, so every rank reaches the same
decisions without a second message:

* the dense gradient is ``sum(n_r * grad_r) / sum(n_r)``: the gradient of the
  mean loss over the group's samples, as one batch of all of them would give
  (ranks with uneven batch sizes are weighted by their samples);
* ``stop``: any rank stopping (a signal, ``max_steps``) stops every rank after
  this step, so they drain together;
* ``exhausted``: every rank's (file) source ran dry;
* ``checkpoint``: any rank's checkpoint clock fired, so all ranks checkpoint
  at the same step.

Uneven inputs. Kafka partitions deliver uneven amounts, so a rank with no
batch ready does not wait for one: it contributes zeros (``n_r = 0``) at once
(``TrainStep.idle``). That is the "agreed step cadence with empty
contributions" design; ``torch.distributed.algorithms.Join`` solves the same
problem for DDP's backward hooks, which Kelp does not use. No rank blocks on
another's data; a rank blocks only in the all-reduce, and only until every
live rank has reached it. When nobody has data the ranks meet every
``trainer.distributed.idle_wait_s`` to agree on stopping. A dead or stuck peer
makes the collective fail after ``trainer.distributed.timeout_s`` (gloo
usually notices a closed socket at once), the rank exits 1 at once, writing
nothing more (:func:`leave_now`), and torchrun's elastic agent restarts the
group.

Only rank 0 (the leader) loads and writes dense checkpoints and publishes
snapshots. At start it broadcasts its dense state, so every rank begins equal
whether or not the others can see the checkpoint directory (one volume per pod).
"""

from __future__ import annotations

import datetime as dt
import logging
import os
import sys
import time
from dataclasses import dataclass
from typing import Any, NoReturn

import torch
import torch.distributed as dist
from torch import nn

from kelp.config import DistributedConfig
from kelp.errors import KelpError
from kelp.trainer.checkpoint import dense_digest
from kelp.trainer.metrics import TrainerMetrics

__all__ = ["GroupError", "Round", "TrainingGroup", "launched_world", "leave_now"]

log = logging.getLogger("kelp.train")

_CONTROL = 4  # n, stop, exhausted, checkpoint


class GroupError(KelpError):
    """A collective failed: a peer died or hung. Exit so torchrun restarts the group."""


@dataclass(frozen=True)
class Round:
    """What the group agreed at the end of one step (identical on every rank)."""

    samples: int
    stop: bool
    exhausted: bool
    checkpoint: bool


@dataclass(frozen=True)
class World:
    """Where this process sits: torchrun's ``RANK``, ``LOCAL_RANK`` and ``WORLD_SIZE``."""

    rank: int = 0
    local_rank: int = 0
    size: int = 1


def launched_world(env: dict[str, str] | None = None) -> World:
    """This process's place from torchrun's environment; a plain process is rank 0 of 1."""
    env = dict(os.environ) if env is None else env
    try:
        size = int(env.get("WORLD_SIZE", "1"))
        rank = int(env.get("RANK", "0"))
        local = int(env.get("LOCAL_RANK", str(rank)))
    except ValueError as exc:
        raise KelpError(f"torchrun environment is malformed ({exc}): RANK, LOCAL_RANK, WORLD_SIZE") from exc
    if size < 1 or not 0 <= rank < size:
        raise KelpError(f"torchrun environment is inconsistent: RANK={rank} WORLD_SIZE={size}")
    return World(rank=rank, local_rank=local, size=size)


def _attempt_store(timeout: dt.timedelta) -> dist.Store | None:
    """torchrun's agent store, under a prefix of its own per restart attempt; None outside torchrun.

    Measured with torch 2.13: after an elastic restart, ranks that join the
    default group through the agent's store read the *previous* attempt's gloo
    addresses and fail with "connectFullMesh ... Connection refused" until a
    later attempt happens to win the race. A per-attempt prefix makes every
    attempt meet only its own members, as long as every agent counts the same
    attempts: true on one machine, not across machines (warned below).
    ``kelp train --nnodes`` has no shared store (``TORCH_DISABLE_SHARE_RDZV_TCP_STORE``):
    each round's rank 0 serves a fresh one, and this returns None.
    """
    if os.environ.get("TORCHELASTIC_USE_AGENT_STORE") != "True":
        return None  # a plain env:// launch: init_process_group builds its store from MASTER_ADDR/PORT
    if int(os.environ.get("GROUP_WORLD_SIZE", "1")) > 1:
        # Across machines the restart counts part: an agent restarts its worker for a failure
        # (counted) or for a machine that joins (not counted), so two machines can name one round
        # differently and never meet (until a later failure happens to align them). And a machine
        # that joins a later round waits for a store address that only the first round published.
        log.warning(
            "the trainer group meets in torchrun's shared store, where machines that restarted for "
            "different reasons miss each other and a machine that comes back cannot join: set "
            "TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1 for every torchrun agent (kelp train --nnodes does)"
        )
    attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
    agent = dist.TCPStore(
        os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), is_master=False, timeout=timeout
    )
    return dist.PrefixStore(f"kelp/attempt_{attempt}", agent)


class TrainingGroup:
    """This rank's membership: the process group, the per-step exchange, start and checkpoint collectives.

    With a world of 1 nothing is initialised and every method is local, so a
    plain ``kelp train`` behaves exactly as before.
    """

    def __init__(self, world: World, settings: DistributedConfig, metrics: TrainerMetrics) -> None:
        self.world = world
        self.settings = settings
        self.metrics = metrics
        self._params: list[nn.Parameter] = []
        self._device = torch.device("cpu")
        self._started = False

    @property
    def rank(self) -> int:
        return self.world.rank

    @property
    def size(self) -> int:
        return self.world.size

    @property
    def is_leader(self) -> bool:
        return self.world.rank == 0

    @property
    def distributed(self) -> bool:
        return self.world.size > 1

    def rank_device(self, device: torch.device) -> torch.device:
        """One GPU per local rank: ``cuda`` becomes ``cuda:<LOCAL_RANK>`` in a group."""
        if device.type == "cuda" and device.index is None and self.distributed:
            return torch.device("cuda", self.world.local_rank % max(1, torch.cuda.device_count()))
        return device

    def start(self, model: nn.Module, device: torch.device) -> None:
        """Join the process group (torchrun's rendezvous env) and remember the dense parameters."""
        self._params = [p for p in model.parameters() if p.requires_grad]
        self._device = device
        self.metrics.world_size.set(self.size)
        if not self.distributed:
            return
        backend = self.settings.backend
        if backend == "auto":
            backend = "nccl" if device.type == "cuda" else "gloo"
        if backend == "nccl":
            torch.cuda.set_device(device)
        started = time.monotonic()
        timeout = dt.timedelta(seconds=self.settings.timeout_s)
        dist.init_process_group(
            backend=backend,
            rank=self.rank,
            world_size=self.size,
            timeout=timeout,
            store=_attempt_store(timeout),
        )
        self._started = True
        log.info(
            "rank %d of %d joined the trainer group (%s, %.1fs)",
            self.rank,
            self.size,
            backend,
            time.monotonic() - started,
        )

    def close(self) -> None:
        if self._started:
            self._started = False
            try:
                dist.destroy_process_group()
            except Exception as exc:  # leaving a broken group must not mask the real error
                log.debug("leaving the process group: %s", exc)

    # ------------------------------------------------------------------ collectives

    def exchange(self, samples: int, *, stop: bool, exhausted: bool, checkpoint: bool) -> Round:
        """One group step: all-reduce the dense gradients (weighted by ``samples``) and the control flags.

        On return every dense parameter's ``.grad`` holds the group's mean
        gradient when ``Round.samples > 0``; otherwise grads are left as they were.
        """
        if not self.distributed:
            return Round(samples=samples, stop=stop, exhausted=exhausted, checkpoint=checkpoint)
        grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in self._params]
        flat = torch.cat([g.reshape(-1) for g in grads] + [torch.zeros(_CONTROL, device=self._device)])
        grad_len = flat.numel() - _CONTROL
        if samples:
            flat[:grad_len].mul_(float(samples))
        flat[grad_len:] = torch.tensor(
            [float(samples), float(stop), float(exhausted), float(checkpoint)], device=self._device
        )
        started = time.perf_counter()
        self._collective("all-reduce", lambda: dist.all_reduce(flat, op=dist.ReduceOp.SUM))
        self.metrics.allreduce_seconds.observe(time.perf_counter() - started)
        control = flat[grad_len:].tolist()
        total = round(control[0])
        if total:
            flat[:grad_len].div_(float(total))
            offset = 0
            for p in self._params:
                p.grad = flat[offset : offset + p.numel()].view_as(p)
                offset += p.numel()
        if not samples:
            self.metrics.idle_steps.inc()
        return Round(
            samples=total,
            stop=control[1] > 0,
            exhausted=control[2] >= self.size,
            checkpoint=control[3] > 0,
        )

    def all_to_all(self, send: torch.Tensor, splits: list[int], recv_splits: list[int]) -> torch.Tensor:
        """Send ``send`` split along dim 0 by ``splits`` (one length per rank, in rank order);
        returns what every rank sent this one, concatenated in rank order (``recv_splits``: each
        rank's length, which the caller knows from an earlier exchange).

        Every rank calls it at the same point of the same group step (the row owners' exchange).
        Alone it returns ``send`` as it is.
        """
        if not self.distributed:
            return send
        device = self._device
        data = send.to(device)
        out = torch.empty((sum(recv_splits), *send.shape[1:]), dtype=send.dtype, device=device)
        self._collective(
            "all-to-all",
            lambda: dist.all_to_all_single(
                out, data, output_split_sizes=recv_splits, input_split_sizes=list(splits)
            ),
        )
        return out.cpu()

    def agree_min(self, value: int) -> int:
        """The lowest ``value`` over the group (one all-reduce); alone, ``value``."""
        if not self.distributed:
            return value
        box = torch.tensor([value], dtype=torch.int64, device=self._device)
        self._collective("all-reduce", lambda: dist.all_reduce(box, op=dist.ReduceOp.MIN))
        return int(box.item())

    def share_start(self, state: dict[str, Any] | None) -> dict[str, Any] | None:
        """The leader's start state (model, optimizer, step, offsets) on every rank; None without a group."""
        if not self.distributed:
            return state
        box = [state if self.is_leader else None]
        self._collective("broadcast", lambda: dist.broadcast_object_list(box, src=0))
        return box[0]

    def gather(self, entry: dict[str, Any]) -> list[dict[str, Any]]:
        """Every rank's ``entry``, in rank order, on every rank."""
        if not self.distributed:
            return [entry]
        out: list[Any] = [None] * self.size
        self._collective("all-gather", lambda: dist.all_gather_object(out, entry))
        return out

    def agree_on_checkpoint(
        self, offsets: dict[tuple[str, int], int], model: nn.Module, step: int
    ) -> tuple[dict[tuple[str, int], int], list[dict[str, Any]] | None]:
        """The group's trained-through offsets and every rank's entry for a checkpoint at ``step``.

        Every rank calls it at the same step. It gathers each rank's offsets
        and dense digest, and raises if two replicas differ (that would be a
        bug: every rank applied the same update). Alone: ``(offsets, None)``.
        """
        if not self.distributed:
            return offsets, None
        mine = [{"topic": t, "partition": p, "offset": o} for (t, p), o in sorted(offsets.items())]
        ranks = self.gather({"rank": self.rank, "offsets": mine, "dense_sha256": dense_digest(model)})
        if len({entry["dense_sha256"] for entry in ranks}) > 1:
            raise KelpError(
                f"dense replicas diverged at step {step}: "
                + ", ".join(f"rank {e['rank']} {e['dense_sha256'][:12]}" for e in ranks)
            )
        return _union_offsets(ranks), ranks

    def _collective(self, what: str, call: Any) -> None:
        try:
            call()
        except (RuntimeError, dist.DistBackendError) as exc:
            leave_now(
                GroupError(
                    f"rank {self.rank}: the trainer group's {what} failed ({str(exc).splitlines()[0]}); "
                    "a peer died or hung, exiting so torchrun restarts the group"
                )
            )


def leave_now(error: GroupError) -> NoReturn:
    """Exit this rank at once with status 1, running no cleanup: a rank whose group broke writes
    nothing more.

    The others may already go on without it (an elastic group restarts without a machine it cannot
    reach), owning its rows. A late write of this rank (the hot tier's final write-back, a push
    retried until the store answers again, e.g. once a partition heals) would put its older rows
    over theirs. Nothing it leaves unwritten is needed: its offsets past the last durable step were
    never committed, so those records are trained again.
    """
    log.error("%s", error)
    for handler in logging.getLogger().handlers:
        handler.flush()
    sys.stderr.write(f"kelp: error: {error}\n")
    sys.stderr.flush()
    os._exit(1)


def _union_offsets(ranks: list[dict[str, Any]]) -> dict[tuple[str, int], int]:
    """The group's trained-through offsets: per partition the furthest any rank trained.

    A partition that moved between ranks in a rebalance appears under both; the
    newer owner's offset is the larger one.
    """
    union: dict[tuple[str, int], int] = {}
    for entry in ranks:
        for o in entry["offsets"]:
            key = (o["topic"], int(o["partition"]))
            union[key] = max(union.get(key, 0), int(o["offset"]))
    return union
