"""Start telemetry for a trainer, placed where the trainer says it runs (docs/semantics.md §13)."""

from __future__ import annotations

import os
from collections.abc import Mapping

from async_tee._reporting import logger, warn_once
from async_tee._session import lifecycle
from async_tee.config import ASYNC_TEE_RUN_ID, launcher_ranks, run_id


def placed(
    environ: Mapping[str, str],
    rank: int | None,
    local_rank: int | None,
    world_size: int | None,
    starts_ranks: bool = False,
) -> dict[str, str]:
    """``environ`` with the trainer's rank as the launcher variables, where they lack it.

    A process alone (no world size above 1) keeps its environment: a rank variable would
    make its run id its parent's, shared by every run started from one shell. Where a
    launcher's variables say another rank than the trainer, the trainer's is used (it is
    the process's place in the job it trains) and the difference is said once. A process
    that ``starts_ranks`` (it launched its node's other ranks itself) names the run as its
    children do: by itself, not by its parent (``ASYNC_TEE_RUN_ID``, unless a job id is set).
    """
    out = dict(environ)
    if rank is None or world_size is None or world_size <= 1:
        return out
    if starts_ranks:
        out[ASYNC_TEE_RUN_ID] = run_id(environ, starts_ranks=True)
    said = launcher_ranks(environ)
    if (said.rank, said.world_size) == (rank, world_size):
        return out
    if said.rank is not None:
        warn_once(
            "integrations:rank",
            "async_tee: the launcher (%s) says rank %s of %s, the trainer rank %s of %s; "
            "the trainer's is exported",
            said.launcher,
            said.rank,
            said.world_size,
            rank,
            world_size,
        )
        for name in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "GROUP_RANK", "NODE_RANK"):
            out.pop(name, None)  # one family answers for all four numbers (§10)
    out.update(RANK=str(rank), WORLD_SIZE=str(world_size))
    if local_rank is not None:
        out["LOCAL_RANK"] = str(local_rank)
    return out


def start_for(
    trainer: str,
    rank: int | None = None,
    local_rank: int | None = None,
    world_size: int | None = None,
    starts_ranks: bool = False,
) -> bool:
    """Start telemetry unless it runs, as rank ``rank`` of ``world_size``. Never raises.

    ``starts_ranks``: this process launched its node's other ranks (see :func:`placed`).

    Returns:
        True when this call started it (its integration then flushes at the train's end).
    """
    try:
        running = lifecycle.active()
        if running is not None:
            exported = running.settings.ranks.rank
            distributed = world_size is not None and world_size > 1
            if rank is not None and exported != rank and (distributed or exported is not None):
                warn_once(
                    "integrations:running-rank",
                    "async_tee: telemetry was started as rank %s; %s says rank %s",
                    exported,
                    trainer,
                    rank,
                )
            return False
        session = lifecycle.start_telemetry(
            environ=placed(os.environ, rank, local_rank, world_size, starts_ranks)
        )
        logger.debug("async_tee: started for %s (exporting: %s)", trainer, session.is_exporting)
        return True
    except Exception:  # noqa: BLE001 - never raise into training
        warn_once("integrations:start", "async_tee: starting telemetry for %s failed", trainer)
        return False


def deliver(trainer: str, timeout_s: float) -> bool:
    """At the train's end: record and export what was teed, within ``timeout_s``.

    The last steps leave before the process may be torn down (a Ray actor is killed, not
    exited); a receiver away keeps the rest in the backlog for the session's own shutdown.
    Never raises. Returns whether everything was delivered (True with no session running).
    """
    try:
        session = lifecycle.active()
        return True if session is None else session.flush_and_export(timeout_s)
    except Exception:  # noqa: BLE001 - never raise into training
        warn_once("integrations:deliver", "async_tee: delivering at %s's end failed", trainer)
        return False
