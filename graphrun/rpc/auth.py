"""The job's CURVE key pair: generation, the key file, and socket set-up.

Every job has one key pair, made by the launcher side with :func:`generate_keys`
(never hard-coded). Servers use it as their CURVE server key; clients use the
same pair as their client key, and each server's ZAP handler admits only a client
whose public key is the job's public key. CURVE proves possession of the secret
key during the handshake, so a peer that knows only the public key is refused, and
all traffic is encrypted. A refused client cannot disturb anyone else.

Key file (JSON, mode 0600, written atomically; refused when open to group or others)::

    {"format": "graphrun-key", "version": 1,
     "public": "<40-char Z85 public key>", "secret": "<40-char Z85 secret key>"
     [, "server": "<the store's public key, for a job key of a shared store>"]}

A public key file (a shared store's ``--clients`` entry) has no ``secret``.
"""

from __future__ import annotations

import json
import logging
import os
import stat
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgspec
import zmq
import zmq.auth
from zmq.auth.thread import ThreadAuthenticator

from graphrun import wire
from graphrun.errors import ArgumentError
from graphrun.files import write_atomic

log = logging.getLogger("graphrun.rpc")

KEY_FORMAT = wire.KEY_FORMAT
KEY_VERSION = wire.KEY_VERSION
ZAP_DOMAIN = "graphrun"


Z85 = frozenset(
    "0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ.-:+=^!/*?&<>()[]{}@%$#"
)


@dataclass(frozen=True, repr=False)
class KeyPair:
    """A CURVE key pair, Z85-encoded (40 ASCII characters each). ``server`` is the public
    key of the store it opens when that is not this pair's own (a job key of a shared
    store, :mod:`graphrun.rpc.access`)."""

    public: str
    secret: str
    server: str | None = None

    def __post_init__(self) -> None:
        for name in ("public", "secret", "server"):
            val = getattr(self, name)
            if name == "server" and val is None:
                continue
            if not isinstance(val, str) or len(val) != 40 or not set(val) <= Z85:
                raise ArgumentError(f"KeyPair.{name}: expected a 40-character Z85 string")
        if zmq.curve_public(self.secret.encode("ascii")).decode("ascii") != self.public:
            raise ArgumentError("KeyPair: the public key is not the secret key's")

    def __repr__(self) -> str:  # never print the secret
        return f"KeyPair(public={self.public!r}, secret=<hidden>)"


def new_keypair() -> KeyPair:
    public, secret = zmq.curve_keypair()
    return KeyPair(public.decode("ascii"), secret.decode("ascii"))


def key_file_text(keys: KeyPair) -> str:
    """The key file's content (:class:`graphrun.wire.KeyFile`: format, version, public,
    secret[, server])."""
    return wire.key_file_text(keys.public, keys.secret, keys.server)


def public_key_file_text(public: str, grants: Sequence[str] = ()) -> str:
    """A public key file (a store's ``--clients`` entry): the key file without its secret,
    with the key's grants beyond a job key's (:data:`graphrun.rpc.access.GRANTS`)."""
    return wire.key_file_text(public, grants=grants)


def generate_keys(path: str | Path) -> KeyPair:
    """Make a new job key pair and write it to ``path`` (mode 0600, atomic)."""
    keys = new_keypair()
    write_atomic(path, key_file_text(keys), mode=0o600)
    return keys


def ensure_keys(path: str | Path) -> tuple[KeyPair, bool]:
    """The key pair in ``path``, made there first if the file does not exist; and whether
    it was made. Two processes racing to make it end up with the same key (the file is
    linked into place only if absent)."""
    p = Path(path)
    if not p.exists():
        keys = new_keypair()
        try:
            write_atomic(p, key_file_text(keys), mode=0o600, replace=False)
            return keys, True
        except FileExistsError:
            pass
        except OSError as exc:
            raise ArgumentError(f"{p}: cannot write key file ({exc.strerror or exc})") from None
    return load_keys(p), False


def _check_private(path: Path) -> None:
    """Refuse a secret key file that our own user left readable or writable by group or
    others (as ssh does for its private keys: a file owned by someone else, such as a
    Kubernetes Secret mounted root-owned for an ``fsGroup``, is that owner's business)."""
    try:
        st = path.stat()
    except OSError:
        return
    if st.st_uid == os.getuid() and st.st_mode & 0o077:
        raise ArgumentError(
            f"{path}: a secret key file open to group or others "
            f"(mode {stat.S_IMODE(st.st_mode):04o}); run: chmod 600 {path}"
        )


def load_keys(path: str | Path) -> KeyPair:
    """Read a key file written by :func:`generate_keys`; refused when it is open to group
    or others (mode 0600 or 0400 expected)."""
    p = Path(path)
    try:
        data: Any = json.loads(p.read_text())
    except (OSError, ValueError) as exc:
        raise ArgumentError(f"{p}: cannot read key file ({exc})") from None
    wire.check_header(data, str(p), KEY_FORMAT, KEY_VERSION, ArgumentError)
    f = wire.convert(wire.KeyFile, data, str(p), ArgumentError)
    if f.secret is msgspec.UNSET and len(f.public) == 40:
        raise ArgumentError(
            f"{p}: holds a public key only (a store's --clients entry), not a key pair"
        )
    secret = "" if f.secret is msgspec.UNSET else f.secret
    try:
        keys = KeyPair(f.public, secret, None if f.server is msgspec.UNSET else f.server)
    except ArgumentError as exc:
        raise ArgumentError(f"{p}: {exc}") from None
    _check_private(p)
    return keys


class RateLimitedLog:
    """At most ``burst`` lines per ``window_s`` seconds; then one line saying how many were
    dropped (a fuzzer or a port scan must not flood the log: 6,248 lines in one fuzz run)."""

    def __init__(self, logger: logging.Logger, burst: int = 10, window_s: float = 60.0):
        self.logger, self.burst, self.window_s = logger, burst, window_s
        self._start, self._count, self._dropped = 0.0, 0, 0
        self._lock = threading.Lock()

    def warning(self, msg: str, *args: object) -> None:
        now = time.monotonic()
        with self._lock:
            if now - self._start > self.window_s:
                if self._dropped:
                    self.logger.warning("... %d more like it in the last %.0f s", self._dropped,
                                        self.window_s)  # fmt: skip
                self._start, self._count, self._dropped = now, 0, 0
            self._count += 1
            if self._count > self.burst:
                self._dropped += 1
                return
        self.logger.warning(msg, *args)


REFUSED = RateLimitedLog(log)


class _JobKeyOnly:
    """ZAP credentials provider: admit the server's public key (and the keys ``admit``
    accepts), and say who was refused."""

    def __init__(
        self, public: str, name: str, auth: _AddressAuthenticator,
        admit: Callable[[str], bool] | None = None,
    ) -> None:  # fmt: skip
        self._public = public.encode("ascii")
        self._name, self._auth, self._admit = name, auth, admit

    def callback(self, domain: str, key: bytes) -> bool:
        if key == self._public:
            return True
        if self._admit is not None and self._admit(key.decode("ascii", "replace")):
            return True
        REFUSED.warning(
            "%s: refused a connection from %s: wrong or missing job key",
            self._name, self._auth.peer,
        )  # fmt: skip
        return False


class _AddressAuthenticator(ThreadAuthenticator):
    """The ZAP thread, remembering the address of the request it is answering (ZAP
    requests are answered one at a time), so a refusal can name the peer."""

    peer = "?"

    async def handle_zap_message(self, msg: list[bytes]) -> None:
        if len(msg) >= 4:
            self.peer = msg[3].decode("utf-8", "replace") or "?"
        await super().handle_zap_message(msg)


def secure_server(
    ctx: zmq.Context,
    sock: zmq.Socket,
    keys: KeyPair,
    name: str = "server",
    admit: Callable[[str], bool] | None = None,
) -> ThreadAuthenticator:
    """Make ``sock`` a CURVE server admitting only holders of ``keys`` (and clients whose
    Z85 public key ``admit`` accepts); returns the ZAP thread. Every message then carries
    its sender's public key as its ``User-Id``.

    The authenticator is bound to ``ctx``: use one context per server. Stop it on close.
    A refused key is logged (rate-limited) with the peer's address.
    """
    auth = _AddressAuthenticator(ctx)
    auth.start()
    provider = _JobKeyOnly(keys.public, name, auth, admit)
    auth.configure_curve_callback(ZAP_DOMAIN, credentials_provider=provider)
    sock.zap_domain = ZAP_DOMAIN.encode()
    sock.curve_secretkey = keys.secret.encode("ascii")
    sock.curve_publickey = keys.public.encode("ascii")
    sock.curve_server = True
    return auth


def secure_client(sock: zmq.Socket, keys: KeyPair) -> None:
    """Make ``sock`` a CURVE client presenting the job key pair to the server whose public
    key is ``keys.server`` (default: the pair's own, the job's own store)."""
    sock.curve_serverkey = (keys.server or keys.public).encode("ascii")
    sock.curve_publickey = keys.public.encode("ascii")
    sock.curve_secretkey = keys.secret.encode("ascii")
