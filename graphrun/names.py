"""The identities every layer names things by, each formatted and parsed here only.

* **Roles** — the processes of a job: ``store:P`` (``store:P:B`` for backup B,
  ``store:P:r`` for the replica of partition P on another machine, ``store:P:rK`` for
  replica K > 1), ``trainer:R``, ``sampler:R:W`` and ``ps:J`` (a parameter server,
  ``training.sync: ps``); and the processes that run them: ``worker:<machine>`` (one
  machine's ``graphrun worker``; ``<machine>`` is the machine's name, never its index,
  on both backends: the operator's worker pod ``i`` is ``worker:<machine_names[i]>``,
  so ``worker:0`` is a machine named ``0``), ``partitioner`` (``partitioner:I``, rank
  ``I`` of several, each on machine ``I``), ``generator``, ``launcher`` and
  ``rendezvous`` (the operator's rendezvous pod). A
  :class:`RoleName` is the value dicts are keyed by; ``str()`` formats it and
  :meth:`RoleName.parse` reads it back, at the file and wire boundaries only (the hosts
  file, a plan's assignments, the launch file, logs): fields hold a ``RoleName``, not
  its text (:mod:`graphrun.wire` reads and writes it).
  :data:`MAIN_TRAINER` is the trainer whose machine hosts the rendezvous.
* **Endpoints** — an :class:`Endpoint` is where a server listens, ``host:port``;
  :func:`store_address` reads a store server's ``tcp://host:port``.
* **Edge types** — a :data:`CanonicalEtype` ``(src_type, relation, dst_type)``, written
  ``"src:rel:dst"`` by :func:`etype_key` and read by :func:`parse_etype_key`;
  :func:`resolve_etype` is the one resolver of an edge type given by a person (a
  triple, ``"src:rel:dst"`` or a relation no other edge type has).
* **Tensor keys and policies** — a graph feature's tensor in the store is named by a
  :class:`TensorKey` (``node/<ntype>/<name>``, ``edge/<src:rel:dst>/<name>``); its rows
  are split over the partitions by the id space its :class:`PolicyName` names
  (``node:<ntype>``, ``edge:<src:rel:dst>``).
* **Partitions** — :func:`home_partition`, the partition a trainer trains on (for the
  runtime and the placement model alike), and :func:`owners`, the owner of each id of a
  space split into contiguous blocks.

This module imports only numpy and :mod:`graphrun.errors`: every layer can use it.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np

from graphrun.errors import ArgumentError, DatasetError

# --- roles ------------------------------------------------------------------------------

Kind = Literal[
    "store",
    "trainer",
    "sampler",
    "ps",
    "worker",
    "partitioner",
    "generator",
    "launcher",
    "rendezvous",
]
KINDS: tuple[Kind, ...] = (
    "store", "trainer", "sampler", "ps", "worker", "partitioner", "generator", "launcher",
    "rendezvous",
)  # fmt: skip

#: The roles a placement places (a plan's assignments, the hosts file's endpoints).
PLACED: tuple[Kind, ...] = ("store", "trainer", "sampler", "ps")
#: The grammar of placed roles, and of every role, as error messages spell them.
ROLE_GRAMMAR = "store:P[:B], store:P:r[K], trainer:R, sampler:R:W, ps:J"
ANY_ROLE_GRAMMAR = (
    f"{ROLE_GRAMMAR}, worker:<machine>, partitioner[:I], generator, launcher, rendezvous"
)

_N = r"(0|[1-9][0-9]*)"  # a number as str() writes it: no sign, no leading zero
_POS = r"[1-9][0-9]*"
_MACHINE = r"[A-Za-z0-9]([A-Za-z0-9._-]{0,251}[A-Za-z0-9])?"  # a machine: a DNS-like name
_ROLE = re.compile(  # replica 1 is "store:P:r", replica K > 1 "store:P:rK"
    rf"(?P<kind>store):(?P<index>{_N})(?::(?P<sub>{_POS})|:r(?P<replica>[2-9]|[1-9][0-9]+)?(?P<r>))?"
    rf"|(?P<kind2>trainer|ps):(?P<index2>{_N})"
    rf"|(?P<kind3>sampler):(?P<index3>{_N}):(?P<sub3>{_N})"
    rf"|(?P<kind4>worker):(?P<machine>{_MACHINE})"
    rf"|(?P<kind5>partitioner)(?::(?P<index5>{_N}))?"
    rf"|(?P<kind6>generator|launcher|rendezvous)",
    re.ASCII,
)


class RoleName:
    """One process of a job; immutable, hashable and ordered (kind, then numbers), a dict
    key. Not a dataclass, so that a msgspec field typed ``RoleName`` is its text on the
    wire (:mod:`graphrun.wire` converts it), not an object."""

    __slots__ = ("index", "kind", "machine", "replica", "sub")
    kind: Kind
    index: int  # the partition of a store, the rank of a trainer or sampler, a ps number
    sub: int  # the backup of a store (0: the main server), the worker of a sampler
    replica: int  # a store's replica (0: the partition's primary), see store/replicas.py
    machine: str  # the machine of a worker

    def __init__(
        self, kind: Kind, index: int, sub: int = 0, replica: int = 0, machine: str = ""
    ) -> None:
        put = object.__setattr__
        put(self, "kind", kind)
        put(self, "index", index)
        put(self, "sub", sub)
        put(self, "replica", replica)
        put(self, "machine", machine)

    def __setattr__(self, name: str, value: object) -> None:
        raise AttributeError(f"RoleName is immutable: cannot set {name}")

    def _key(self) -> tuple[str, int, int, int, str]:
        return (self.kind, self.index, self.sub, self.replica, self.machine)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, RoleName) and self._key() == other._key()

    def __hash__(self) -> int:
        return hash(self._key())

    def __lt__(self, other: RoleName) -> bool:
        return self._key() < other._key()

    def __le__(self, other: RoleName) -> bool:
        return self._key() <= other._key()

    def __gt__(self, other: RoleName) -> bool:
        return self._key() > other._key()

    def __ge__(self, other: RoleName) -> bool:
        return self._key() >= other._key()

    def __repr__(self) -> str:
        return f"RoleName({str(self)!r})"

    def __reduce__(self) -> tuple[type, tuple[str, int, int, int, str]]:
        return (RoleName, self._key())

    @classmethod
    def store(cls, part: int, backup: int = 0, replica: int = 0) -> RoleName:
        return cls("store", part, backup, replica)

    @classmethod
    def trainer(cls, rank: int) -> RoleName:
        return cls("trainer", rank)

    @classmethod
    def sampler(cls, rank: int, worker: int) -> RoleName:
        return cls("sampler", rank, worker)

    @classmethod
    def ps(cls, index: int) -> RoleName:
        return cls("ps", index)

    @classmethod
    def worker(cls, machine: str) -> RoleName:
        """Machine ``machine``'s ``graphrun worker``, which runs its roles."""
        return cls("worker", 0, machine=machine)

    @classmethod
    def partitioner(cls, index: int | None = None) -> RoleName:
        """The partitioner (``index``: one of several, each on its machine)."""
        return cls("partitioner", -1 if index is None else index)

    @classmethod
    def parse(cls, text: str) -> RoleName:
        """The role named ``text``, which must be written as ``str()`` writes it (so a
        parsed name formats back to the same text); an ArgumentError (a ValueError)
        naming ``text`` and the grammar otherwise."""
        m = _ROLE.fullmatch(text) if isinstance(text, str) else None
        if m is None:
            raise ArgumentError(f"{text!r} is not a role name ({ANY_ROLE_GRAMMAR})")
        g = m.groupdict()
        if g["kind"]:
            replica = int(g["replica"] or 1) if g["r"] is not None else 0
            return cls("store", int(g["index"]), int(g["sub"] or 0), replica)
        if g["kind2"]:
            return (cls.trainer if g["kind2"] == "trainer" else cls.ps)(int(g["index2"]))
        if g["kind3"]:
            return cls("sampler", int(g["index3"]), int(g["sub3"]))
        if g["kind4"]:
            return cls.worker(g["machine"])
        if g["kind5"]:
            return cls.partitioner(None if g["index5"] is None else int(g["index5"]))
        single = {"generator": cls.generator, "launcher": cls.launcher}
        return single.get(g["kind6"], cls.rendezvous)()

    @classmethod
    def is_valid(cls, text: str) -> bool:
        return isinstance(text, str) and _ROLE.fullmatch(text) is not None

    @classmethod
    def is_placed(cls, text: str) -> bool:
        """Whether ``text`` names a role a placement places (:data:`PLACED`)."""
        return cls.is_valid(text) and cls.parse(text).kind in PLACED

    @classmethod
    def generator(cls) -> RoleName:
        """The step that generates a job's dataset (``graph.generator``)."""
        return cls("generator", 0)

    @classmethod
    def launcher(cls) -> RoleName:
        """``graphrun run`` itself, or the operator's launcher pod."""
        return cls("launcher", 0)

    @classmethod
    def rendezvous(cls) -> RoleName:
        """The operator's rendezvous pod, when a job's rendezvous is served apart (a
        local run's is on trainer 0's machine, :data:`MAIN_TRAINER`)."""
        return cls("rendezvous", 0)

    @property
    def is_primary_store(self) -> bool:
        """The main server of a partition (no backup, no replica)."""
        return self.kind == "store" and not self.sub and not self.replica

    def __str__(self) -> str:
        if self.kind == "worker":
            return f"worker:{self.machine}"
        if self.kind in ("generator", "launcher", "rendezvous") or (
            self.kind == "partitioner" and self.index < 0
        ):
            return self.kind
        if self.kind == "store" and self.replica:
            return f"store:{self.index}:r" + (str(self.replica) if self.replica > 1 else "")
        if self.kind == "sampler" or (self.kind == "store" and self.sub):
            return f"{self.kind}:{self.index}:{self.sub}"
        return f"{self.kind}:{self.index}"


#: Trainer 0: its machine hosts the rendezvous; its output is the job's console.
MAIN_TRAINER = RoleName.trainer(0)
#: The most trainers a job may have (machines x trainersPerMachine): the spec's bound, and
#: that of every record, request and checkpoint that has a trainer's rank or one entry each.
MAX_TRAINERS = 4096


class Endpoint:
    """Where a server listens: ``host:port`` (``str()`` writes it, :meth:`parse` reads
    it, at the file boundary: the hosts file, a launch plan). Immutable and hashable;
    not a dataclass, so that a msgspec field typed ``Endpoint`` is its text on the
    wire, as a :class:`RoleName` is."""

    __slots__ = ("host", "port")
    host: str
    port: int

    def __init__(self, host: str, port: int) -> None:
        if not isinstance(host, str) or not host or isinstance(port, bool):
            raise ArgumentError(f"endpoint: host {host!r} must be a non-empty name")
        if not isinstance(port, int) or not 0 < port < 65536:
            raise ArgumentError(f"endpoint {host}: port {port!r} is not in 1..65535")
        object.__setattr__(self, "host", host)
        object.__setattr__(self, "port", port)

    @classmethod
    def parse(cls, text: str) -> Endpoint:
        """The endpoint ``text`` names; an ArgumentError (a ValueError) naming it
        otherwise."""
        host, sep, port = text.rpartition(":") if isinstance(text, str) else ("", "", "")
        if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise ArgumentError(f"{text!r} is not host:port")
        return cls(host, int(port))

    def __setattr__(self, name: str, value: object) -> None:
        raise AttributeError(f"Endpoint is immutable: cannot set {name}")

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Endpoint) and (self.host, self.port) == (other.host, other.port)

    def __hash__(self) -> int:
        return hash((self.host, self.port))

    def __lt__(self, other: Endpoint) -> bool:
        return (self.host, self.port) < (other.host, other.port)

    def __repr__(self) -> str:
        return f"Endpoint({str(self)!r})"

    def __reduce__(self) -> tuple[type, tuple[str, int]]:
        return (Endpoint, (self.host, self.port))

    def __str__(self) -> str:
        return f"{self.host}:{self.port}"


#: A store server's address as a job spec holds it (its JSON schema's pattern): a host
#: name, an IPv4 address or a bracketed IPv6 one, and a port; :func:`store_address` also
#: checks the port's range.
_HOST = r"([A-Za-z0-9.\-]+|\[[0-9a-fA-F:]+\])"
STORE_ADDRESS_PATTERN = rf"^tcp://{_HOST}:([0-9]{{1,5}})$"
_STORE_ADDRESS = re.compile(rf"^(tcp://)?{_HOST}:([0-9]{{1,5}})$", re.ASCII)


def store_address(text: str) -> str:
    """A store server's address, ``host:port`` or ``tcp://host:port``, as
    ``tcp://host:port`` (port in 1..65535): the one rule of ``--store`` flags and of a
    job's ``graph.store.addresses``; an ArgumentError (a ValueError) naming it otherwise."""
    m = _STORE_ADDRESS.match(text) if isinstance(text, str) else None
    if m is None or not 0 < int(m.group(3)) < 65536:
        raise ArgumentError(f"{text!r} is not host:port or tcp://host:port (port 1..65535)")
    return text if m.group(1) else f"tcp://{text}"


def home_partition(rank: int, world_size: int, num_parts: int) -> int:
    """Trainer ``rank``'s home partition of ``num_parts``: ``rank * num_parts //
    world_size`` (consecutive ranks share a partition when there are more trainers than
    partitions, as consecutive ranks share a machine). The runtime splits the training
    ids by it (:func:`graphrun.distributed.split.node_split`) and the placement model
    charges a trainer's "own" bytes to that partition's store."""
    return rank * num_parts // world_size


# --- edge types -------------------------------------------------------------------------

CanonicalEtype = tuple[str, str, str]


def etype_key(etype: Sequence[str]) -> str:
    """The string key of a canonical edge type: ``"src:rel:dst"``."""
    return ":".join(etype)


def parse_etype_key(key: str) -> CanonicalEtype:
    """The edge type of an ``"src:rel:dst"`` key; a DatasetError naming it otherwise."""
    parts = key.split(":")
    if len(parts) != 3 or not all(parts):
        raise DatasetError(f"edge type {key!r}: expected 'src_type:relation:dst_type'")
    return (parts[0], parts[1], parts[2])


def resolve_etype(
    etype: Any,
    edge_types: Sequence[Sequence[str]],
    arg: str = "etype",
    error: type[Exception] = ArgumentError,
) -> int:
    """The position in ``edge_types`` of an edge type given as a triple, ``"src:rel:dst"``
    or a relation name that exactly one edge type has. ``error`` (an ArgumentError by
    default) names ``arg`` when it is unknown, or a relation several edge types share."""
    if isinstance(etype, str) and ":" not in etype:
        hits = [i for i, et in enumerate(edge_types) if et[1] == etype]
        if len(hits) == 1:
            return hits[0]
        if len(hits) > 1:
            shared = [etype_key(edge_types[i]) for i in hits]
            raise error(f"{arg}: relation {etype!r} is ambiguous ({shared}); use 'src:rel:dst'")
    else:
        key = tuple(etype.split(":")) if isinstance(etype, str) else _triple(etype)
        for i, et in enumerate(edge_types):
            if tuple(et) == key:
                return i
    known = [etype_key(e) for e in edge_types]
    raise error(f"{arg}: unknown edge type {etype!r}; known: {known}")


def _triple(etype: Any) -> tuple[Any, ...] | None:
    return tuple(etype) if isinstance(etype, tuple | list) else None


# --- tensor keys and partition policies -------------------------------------------------


@dataclass(frozen=True)
class PolicyName:
    """The id space a tensor's rows belong to: ``node:<ntype>`` or ``edge:<src:rel:dst>``.
    ``str()`` formats it (the store's wire and the user's ``init_tensor`` spell it so),
    :meth:`parse` reads it."""

    kind: Literal["node", "edge"]
    type: str  # a node type, or an edge type's "src:rel:dst" key

    @classmethod
    def node(cls, ntype: str) -> PolicyName:
        return cls("node", ntype)

    @classmethod
    def edge(cls, etype: str | Sequence[str]) -> PolicyName:
        return cls("edge", etype if isinstance(etype, str) else etype_key(etype))

    @classmethod
    def parse(cls, text: str) -> PolicyName:
        """The policy named ``text``; an ArgumentError naming it otherwise."""
        kind, sep, type_ = text.partition(":") if isinstance(text, str) else ("", "", "")
        if not sep or kind not in ("node", "edge") or not type_:
            raise ArgumentError(
                f"policy: {text!r} is not a policy name ('node:<ntype>' or 'edge:<src:rel:dst>')"
            )
        return cls("node" if kind == "node" else "edge", type_)

    def __str__(self) -> str:
        return f"{self.kind}:{self.type}"


@dataclass(frozen=True)
class TensorKey:
    """The store name of one graph feature: ``node/<ntype>/<name>`` or
    ``edge/<src:rel:dst>/<name>`` (str() formats it, :meth:`parse` reads it)."""

    kind: Literal["node", "edge"]
    type: str  # a node type, or an edge type's "src:rel:dst" key
    name: str

    @classmethod
    def node(cls, ntype: str, name: str) -> TensorKey:
        return cls("node", ntype, name)

    @classmethod
    def edge(cls, etype: str | Sequence[str], name: str) -> TensorKey:
        return cls("edge", etype if isinstance(etype, str) else etype_key(etype), name)

    @classmethod
    def parse(cls, text: str) -> TensorKey | None:
        """The key of a graph feature's tensor name; None for any other tensor."""
        kind, _, rest = text.partition("/")
        type_, _, name = rest.rpartition("/")
        if kind not in ("node", "edge") or not type_ or not name:
            return None
        return cls("node" if kind == "node" else "edge", type_, name)

    @property
    def policy(self) -> PolicyName:
        return PolicyName(self.kind, self.type)

    def __str__(self) -> str:
        return f"{self.kind}/{self.type}/{self.name}"


# --- owners -----------------------------------------------------------------------------


def owners(bounds: np.ndarray, ids: np.ndarray) -> np.ndarray:
    """The block of each id, int64: ``p`` with ``bounds[p] <= id < bounds[p+1]`` for
    non-decreasing ``bounds`` (a partition's ids, a type's ids). ``side="right"`` skips
    empty blocks (equal bounds) to the non-empty one. Ids are not checked: one below
    ``bounds[0]`` gives -1, one at or past ``bounds[-1]`` gives ``len(bounds) - 1``."""
    return np.searchsorted(bounds, ids, side="right").astype(np.int64) - 1
