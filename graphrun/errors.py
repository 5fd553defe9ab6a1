"""The one error tree of graphrun.

Every error graphrun raises on purpose is a :class:`GraphrunError`. Third-party
errors (zmq, pymetis, the Kubernetes API, pydantic) are translated into this tree
at the boundary where they occur, with ``raise ... from``.

::

    GraphrunError
    ├── UserError                 bad input from a person: the CLI prints one line, exit 2
    │   ├── DatasetError          a dataset directory or importer input is wrong
    │   ├── PartitionFormatError  a partition directory is missing, corrupt or of another version
    │   ├── SpecError             a job spec, cluster or plan file is invalid
    │   ├── CheckpointError       a checkpoint file is unreadable or malformed
    │   ├── RunFileError          a run directory's file is irregular, outside, too big or malformed
    │   ├── BadRequest            an inference request the protocol or its bounds refuse (HTTP 400)
    │   └── ArgumentError         an argument to an API call is invalid (ids, fanouts, ...)
    ├── RpcError                  anything that went wrong talking to a store server
    │   ├── RpcTimeout            no answer within the deadline
    │   ├── ProtocolError         a frame that is malformed, oversized or of another version
    │   ├── AuthError             the peer is not holding the job's key
    │   └── RemoteError           the server understood the request and refused it
    ├── TableFull                 a rendezvous request beyond the table's limits (answered as such)
    ├── StoreError                the store cannot do what was asked (unknown tensor, ...)
    │   └── StoreUnavailable      the store did not answer an inference micro-batch (HTTP 503)
    ├── ServerBusy                a server's queue of requests is full (HTTP 503)
    ├── StoreFailed               a store server process died or never became ready (local backend)
    ├── PeerLost                  a peer of a collective step died or went silent: exit 3
    ├── ReformFailed              elastic trainers cannot re-form a group with this trainer in it
    │   ├── BelowMinimum          too few machines are left: the job's restart policy decides
    │   ├── LeftOut               this trainer is not among the survivors the group re-formed with
    │   └── CutOff                this trainer reaches too few of the others: it leaves the group
    ├── WorkflowError             an event that is illegal in a job's current phase (a backend bug)
    ├── JobFailed                 a role of a job failed: carries role, host and exit code
    ├── Suspended                 trainers told to stop wrote an exact checkpoint (not a failure)
    ├── KubeError                 a Kubernetes API call failed (status, reason, object named)
    └── HostError                 this host cannot provide what a job asks (network namespaces)
        └── ProbeAuthError        a measuring peer without the probe's key (a ConnectionError too)

Rules: a message names the file, field or argument and says what is wrong, in one
line. Never ``assert`` to validate input. A process that stops on a :class:`UserError`
exits with :data:`USER_ERROR_EXIT` (2); a job never restarts a role that did (its input
is wrong, a retry cannot help). A rank of a collective step that stops because another
rank failed first (:class:`PeerLost`: a partitioner rank, a probe member) exits with
:data:`PEER_LOST_EXIT` (3), so the launcher blames the other.
A trainer that stopped on SIGTERM after its checkpoint exits with :data:`SUSPENDED_EXIT`
(143, as a shell reports a process ended by SIGTERM).
"""

from __future__ import annotations

from typing import Final, Literal, Protocol

USER_ERROR_EXIT = 2
PEER_LOST_EXIT = 3
SUSPENDED_EXIT = 143


class GraphrunError(Exception):
    """Base of every error graphrun raises on purpose."""


class Suspended(GraphrunError):
    """The trainers were told to stop (SIGTERM) and wrote a checkpoint of where they were."""


class UserError(GraphrunError):
    """Bad input from a person. The CLI prints ``graphrun: error: <msg>`` and exits 2."""


class DatasetError(UserError):
    """A dataset directory, importer input or graph array is wrong."""


class PartitionFormatError(UserError):
    """A partition directory is missing, corrupt, or written by another format version."""


class SpecError(UserError):
    """A job spec, cluster description or placement plan is invalid."""


class CheckpointError(UserError):
    """A checkpoint file is unreadable, of another format, or malformed (one field named)."""


class BadRequest(UserError):
    """An inference request the protocol or the endpoint's bounds refuse (HTTP 400)."""


class RunFileError(UserError):
    """A file of a run directory that is not read (not a regular file, outside the run
    directory, over its cap), or not what it should hold (``graphrun report``)."""


class ArgumentError(UserError, ValueError):
    """An argument to a public API call is invalid."""


class RpcError(GraphrunError):
    """A request to a store server failed. ``address`` and ``kind`` say where and what."""

    def __init__(self, message: str, *, address: str = "", kind: str = "") -> None:
        where = " ".join(p for p in (kind and f"{kind}", address and f"to {address}") if p)
        super().__init__(f"{where}: {message}" if where else message)
        self.address = address
        self.kind = kind


class RpcTimeout(RpcError, TimeoutError):
    """No answer arrived within the deadline."""


class ProtocolError(RpcError):
    """A message was malformed, oversized, truncated or of another protocol version."""


class AuthError(RpcError):
    """The peer does not hold the job's key."""


class RemoteError(RpcError):
    """The server understood the request and answered with an error."""


class TableFull(GraphrunError):
    """A rendezvous request would go beyond the table's limits (its message says which);
    the server answers it as an error."""


class StoreError(GraphrunError):
    """The store cannot do what was asked (unknown tensor, bad shape, ...)."""


class StoreFailed(GraphrunError):
    """A store server process died or never became ready."""


class PeerLost(GraphrunError):
    """A peer of a collective step died or did not answer in time: a collective of the
    distributed partitioner failed, or a probe member gave up on another member. The
    process exits :data:`PEER_LOST_EXIT`, so the peer that failed first is blamed."""


class ReformFailed(GraphrunError):
    """Elastic trainers cannot go on in a group with this trainer in it."""


class BelowMinimum(ReformFailed):
    """Too few machines are left to go on: the job falls back to its restart policy."""


class LeftOut(ReformFailed):
    """This trainer was not among the survivors the group re-formed with."""


class CutOff(ReformFailed):
    """This trainer reaches too few of the other machines: it is the one cut off, and
    leaves the re-form to the others (its machine is fenced by the launcher)."""


class WorkflowError(GraphrunError):
    """An event arrived that the job's current phase does not accept (a backend bug)."""


class FailedRole(Protocol):
    """The role a :class:`JobFailed` names: a :class:`graphrun.names.RoleName`, declared
    above this module (it raises these errors), so named here by what it has."""

    @property
    def kind(self) -> str: ...


#: What a :class:`JobFailed` of the job as a whole (cancelled, deadline) names: no role.
JOB: Final = "job"


class JobFailed(GraphrunError):
    """A role of a job failed. Names the role (a ``RoleName``, or :data:`JOB`), the host
    and the exit code."""

    def __init__(
        self, role: FailedRole | Literal["job"], host: str, exit_code: int | None, reason: str = ""
    ) -> None:
        code = "no exit code" if exit_code is None else f"exit code {exit_code}"
        msg = f"{role} on {host} failed ({code})"
        if role == JOB:  # the job as a whole (cancelled, deadline), no role to blame
            msg = "the job ended"
        super().__init__(f"{msg}: {reason}" if reason else msg)
        self.role = role
        self.host = host
        self.exit_code = exit_code
        self.reason = reason


class KubeError(GraphrunError):
    """A Kubernetes API call failed (status, reason and the object are named)."""


class HostError(GraphrunError):
    """This host cannot provide what the job asks (network namespaces, tc, ...)."""


class ProbeAuthError(HostError, ConnectionError):
    """The other side of a measuring connection did not show the probe's key (or never
    came). Also a ``ConnectionError``: the measuring loops treat it as a lost connection."""


class StoreUnavailable(StoreError):
    """The store did not answer an inference micro-batch (HTTP 503; the endpoint joins it
    again)."""


class ServerBusy(GraphrunError):
    """A server's queue of requests is full (HTTP 503)."""
