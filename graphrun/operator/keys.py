"""The job's RPC key pair: Curve25519 keys, Z85-encoded as ZeroMQ CURVE expects.

``zmq.curve_keypair()`` returns two 40-character Z85 strings (ZeroMQ RFC 32) of the raw
32-byte Curve25519 public and secret keys. The operator must not import zmq, so it makes
the same pair with ``cryptography``'s X25519 and encodes it here.
"""

from __future__ import annotations

from dataclasses import dataclass

from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey

from graphrun.errors import ArgumentError

Z85_ALPHABET = (
    "0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ.-:+=^!/*?&<>()[]{}@%$#"
)
_DECODE = {c: i for i, c in enumerate(Z85_ALPHABET)}


def z85_encode(data: bytes) -> str:
    """Z85 (ZeroMQ RFC 32): 4 bytes big-endian -> 5 characters. Length must divide by 4."""
    if len(data) % 4:
        raise ArgumentError(f"z85_encode: length {len(data)} is not a multiple of 4")
    out: list[str] = []
    for i in range(0, len(data), 4):
        value = int.from_bytes(data[i : i + 4], "big")
        chunk = []
        for _ in range(5):
            value, digit = divmod(value, 85)
            chunk.append(Z85_ALPHABET[digit])
        out.extend(reversed(chunk))
    return "".join(out)


def z85_decode(text: str) -> bytes:
    if len(text) % 5:
        raise ArgumentError(f"z85_decode: length {len(text)} is not a multiple of 5")
    out = bytearray()
    for i in range(0, len(text), 5):
        value = 0
        for c in text[i : i + 5]:
            if c not in _DECODE:
                raise ArgumentError(f"z85_decode: {c!r} is not a Z85 character")
            value = value * 85 + _DECODE[c]
        if value >= 1 << 32:
            raise ArgumentError(f"z85_decode: block {text[i : i + 5]!r} is out of range")
        out += value.to_bytes(4, "big")
    return bytes(out)


@dataclass(frozen=True)
class CurveKeyPair:
    """Z85 text of the public and secret key (40 characters each)."""

    public: str
    secret: str


def curve_keypair() -> CurveKeyPair:
    """A fresh key pair, interchangeable with ``zmq.curve_keypair()``."""
    secret = X25519PrivateKey.generate()
    return CurveKeyPair(
        public=z85_encode(secret.public_key().public_bytes_raw()),
        secret=z85_encode(secret.private_bytes_raw()),
    )


def curve_public(secret_z85: str) -> str:
    """The public key of a Z85 secret key (like ``zmq.curve_public``)."""
    key = X25519PrivateKey.from_private_bytes(z85_decode(secret_z85))
    return z85_encode(key.public_key().public_bytes_raw())
