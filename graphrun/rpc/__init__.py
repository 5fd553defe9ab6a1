"""graphrun.rpc: ZeroMQ transport, the wire codec, CURVE keys.

* :mod:`graphrun.rpc.codec`: pure ``encode``/``decode`` of :class:`Message` (frame layout
  in its docstring), :class:`Limits`.
* :mod:`graphrun.rpc.transport`: :class:`RpcServer` (ROUTER loop), :class:`RpcClient`
  (DEALER, request ids, deadlines, typed errors).
* :mod:`graphrun.rpc.auth`: the job key pair (:func:`generate_keys`, :func:`load_keys`).
* :mod:`graphrun.rpc.access`: the admin key and the job keys of a shared store.
* :mod:`graphrun.rpc.guard`: what one connection may make a server buffer.
* :mod:`graphrun.rpc.events`: the socket monitor's events a client and a server watch.
"""

from graphrun.rpc.auth import KeyPair, generate_keys, load_keys, new_keypair
from graphrun.rpc.codec import PROTOCOL_VERSION, Limits, Message, MsgKind, decode, encode
from graphrun.rpc.transport import RpcClient, RpcServer

__all__ = [
    "PROTOCOL_VERSION",
    "KeyPair",
    "Limits",
    "Message",
    "MsgKind",
    "RpcClient",
    "RpcServer",
    "decode",
    "encode",
    "generate_keys",
    "load_keys",
    "new_keypair",
]
