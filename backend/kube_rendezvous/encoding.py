"""Encode the rendezvous state bytes for ``Rendezvous.status.state`` and back (pure, no I/O).

The text is a marker naming the encoding, then base64 of the zlib-compressed bytes:
``z1:<base64>``. tensorplay's pickled state compresses about tenfold, which keeps a
1024-node state near 15 KiB, far below etcd's ~1.5 MiB request limit.
"""

from __future__ import annotations

import base64
import binascii
import zlib

STATE_ENCODING_MARKER = "z1:"
#: Largest encoded state written (bytes). etcd refuses requests over ~1.5 MiB; the rest of
#: the object (summary, conditions, managed fields) must fit in what this leaves.
MAX_ENCODED_STATE_BYTES = 1024 * 1024


class StateEncodingError(ValueError):
    """The stored text is not a state this library wrote (bad marker, base64 or zlib data)."""


class StateTooLargeError(ValueError):
    """The encoded state would not fit in one Kubernetes object."""


def encode_state(state: bytes, limit: int = MAX_ENCODED_STATE_BYTES) -> str:
    """Return ``state`` as ``z1:`` + base64(zlib(state)).

    Raises:
        StateTooLargeError: the encoded text is longer than ``limit`` bytes.
    """
    text = STATE_ENCODING_MARKER + base64.b64encode(zlib.compress(state, 6)).decode("ascii")
    if len(text) > limit:
        raise StateTooLargeError(
            f"the encoded rendezvous state is {len(text)} bytes ({len(state)} before compression), "
            f"over the {limit}-byte limit for one Kubernetes object; lower maxNodes or use "
            "shorter node names (--local-addr)"
        )
    return text


def decode_state(text: object) -> bytes:
    """Return the state bytes stored in ``text``.

    Raises:
        StateEncodingError: ``text`` is not a string, names an unknown encoding, or holds
            invalid base64 or truncated/corrupt zlib data. The message quotes the problem.
    """
    if not isinstance(text, str):
        raise StateEncodingError(f"status.state must be a string, got {type(text).__name__}: {text!r:.60}")
    marker, separator, payload = text.partition(":")
    if not separator or marker + ":" != STATE_ENCODING_MARKER:
        raise StateEncodingError(
            f"status.state starts with {text[:12]!r}, not the encoding marker {STATE_ENCODING_MARKER!r}; "
            "it was not written by kube-rendezvous (clear .status.state to start over)"
        )
    try:
        compressed = base64.b64decode(payload, validate=True)
    except (binascii.Error, ValueError) as exc:
        raise StateEncodingError(f"status.state holds invalid base64 ({exc}): {payload[:40]!r}") from exc
    try:
        decompressor = zlib.decompressobj()
        state = decompressor.decompress(compressed)
    except zlib.error as exc:
        raise StateEncodingError(f"status.state holds corrupt zlib data ({exc})") from exc
    if not decompressor.eof:
        raise StateEncodingError(f"status.state is truncated: the zlib stream of {len(compressed)} bytes does not end")
    if decompressor.unused_data:
        raise StateEncodingError(
            f"status.state has {len(decompressor.unused_data)} bytes after the end of its zlib stream; it is corrupt"
        )
    return state
