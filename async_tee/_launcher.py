"""Which rank this process is: the variables each launcher family sets, read in one order.

A launcher starts every rank with its position in the job: torchrun (and the launchers
that copy it: DeepSpeed, accelerate, Lightning) sets ``RANK``/``LOCAL_RANK``/
``WORLD_SIZE``/``GROUP_RANK``; ``srun`` sets ``SLURM_PROCID``/``SLURM_LOCALID``/
``SLURM_NTASKS``/``SLURM_NODEID``; Open MPI's ``mpirun`` the ``OMPI_COMM_WORLD_*`` set;
MPICH and Intel MPI (Hydra) ``PMI_RANK``/``PMI_SIZE`` and ``MPI_LOCALRANKID``.

One family answers for all four numbers: the first, in the order above, that sets any
of its variables to a whole number. Families are never mixed, because they nest:
torchrun started by ``srun`` sees both, and its ``RANK`` is the rank of the training
process while ``SLURM_PROCID`` is the rank of the torchrun agent. So an explicit
``RANK`` always wins. Standard library only.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping


@dataclasses.dataclass(frozen=True)
class LauncherRanks:
    """This process's place in its job, as its launcher said, or all None.

    Attributes:
        launcher: The family that said it (``torchrun``, ``slurm``, ``openmpi``,
            ``mpich``), or ``""`` when no launcher variable is set.
        rank: The global rank.
        local_rank: The rank among the processes of this node.
        world_size: How many ranks the job has.
        node_rank: Which node this is.
    """

    launcher: str = ""
    rank: int | None = None
    local_rank: int | None = None
    world_size: int | None = None
    node_rank: int | None = None


# (family, rank, local rank, world size, node rank variables in order of preference)
FAMILIES: tuple[tuple[str, str, str, str, tuple[str, ...]], ...] = (
    ("torchrun", "RANK", "LOCAL_RANK", "WORLD_SIZE", ("GROUP_RANK", "NODE_RANK")),
    ("slurm", "SLURM_PROCID", "SLURM_LOCALID", "SLURM_NTASKS", ("SLURM_NODEID",)),
    (
        "openmpi",
        "OMPI_COMM_WORLD_RANK",
        "OMPI_COMM_WORLD_LOCAL_RANK",
        "OMPI_COMM_WORLD_SIZE",
        ("OMPI_COMM_WORLD_NODE_RANK",),
    ),
    ("mpich", "PMI_RANK", "MPI_LOCALRANKID", "PMI_SIZE", ()),
)
"""Each launcher family's variables, in the order the families are asked."""


def _whole(environ: Mapping[str, str], name: str) -> int | None:
    value = environ.get(name, "").strip()
    return int(value) if value.isdigit() else None


def launcher_ranks(environ: Mapping[str, str]) -> LauncherRanks:
    """The ranks the first family with a whole-number variable sets. Never raises."""
    for family, rank, local_rank, world_size, node_ranks in FAMILIES:
        node = next(
            (n for n in (_whole(environ, name) for name in node_ranks) if n is not None), None
        )
        found = LauncherRanks(
            family,
            _whole(environ, rank),
            _whole(environ, local_rank),
            _whole(environ, world_size),
            node,
        )
        if dataclasses.astuple(found)[1:] != (None, None, None, None):
            return found
    return LauncherRanks()
