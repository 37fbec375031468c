"""encode_state/decode_state: the z1: text round-trips state bytes and rejects text it did not write (pure)."""

from __future__ import annotations

import base64
import pickle
import random
import zlib
from datetime import datetime, timezone

import pytest
from kube_rendezvous.encoding import (
    MAX_ENCODED_STATE_BYTES,
    STATE_ENCODING_MARKER,
    StateEncodingError,
    StateTooLargeError,
    decode_state,
    encode_state,
)
from tensorplay.distributed.elastic.rendezvous.dynamic_rendezvous import _NodeDesc, _RendezvousState


def make_state(node_count: int) -> _RendezvousState:
    """A completed round with ``node_count`` participants on the same host, all heartbeating."""
    state = _RendezvousState()
    state.round = 3
    state.complete = True
    beat = datetime(2024, 5, 1, 12, 0, 0, tzinfo=timezone.utc)
    for local_id in range(node_count):
        node = _NodeDesc("trainer-0.trainer.team-a.svc.cluster.local", 4242, local_id)
        state.participants[node] = local_id
        state.last_heartbeats[node] = beat
    state.wait_list.add(_NodeDesc("trainer-9.trainer.team-a.svc.cluster.local", 7, 0))
    return state


def encoded_payload(payload: bytes) -> str:
    """The marker followed by base64 of ``payload`` (which need not be zlib data)."""
    text: str = STATE_ENCODING_MARKER + base64.b64encode(payload).decode("ascii")
    return text


class TestRoundTrip:
    def test_empty_bytes_round_trip(self) -> None:
        assert decode_state(encode_state(b"")) == b""

    def test_random_bytes_round_trip(self) -> None:
        data = random.Random(1).randbytes(4096)
        assert decode_state(encode_state(data)) == data

    def test_fifty_random_byte_strings_of_varied_length_round_trip(self) -> None:
        rng = random.Random(0)
        for _ in range(50):
            data = rng.randbytes(rng.randrange(0, 2048))
            assert decode_state(encode_state(data)) == data, f"{len(data)}-byte string did not round-trip"

    def test_pickled_rendezvous_state_round_trips_with_every_field(self) -> None:
        state = make_state(4)
        state.deadline = datetime(2024, 5, 1, 12, 0, 30, tzinfo=timezone.utc)

        restored = pickle.loads(decode_state(encode_state(pickle.dumps(state))))

        assert isinstance(restored, _RendezvousState)
        assert restored.round == 3
        assert restored.complete is True
        assert restored.closed is False
        assert restored.deadline == state.deadline
        assert restored.participants == state.participants
        assert restored.wait_list == state.wait_list
        assert restored.last_heartbeats == state.last_heartbeats


class TestEncodeState:
    def test_text_starts_with_the_encoding_marker(self) -> None:
        assert encode_state(b"state").startswith(STATE_ENCODING_MARKER)

    def test_text_after_the_marker_is_base64_of_zlib_data(self) -> None:
        text = encode_state(b"state bytes")
        payload = text[len(STATE_ENCODING_MARKER) :]
        assert zlib.decompress(base64.b64decode(payload, validate=True)) == b"state bytes"

    def test_text_is_ascii(self) -> None:
        assert encode_state(random.Random(2).randbytes(512)).isascii()

    def test_repetitive_state_is_compressed_well_below_its_pickled_size(self) -> None:
        pickled = pickle.dumps(make_state(256))
        text = encode_state(pickled)
        assert len(text) < len(pickled) / 3, f"{len(pickled)} pickled bytes encoded to {len(text)}"

    def test_text_exactly_at_the_limit_is_accepted(self) -> None:
        size = len(encode_state(b"abc"))
        assert encode_state(b"abc", limit=size) == encode_state(b"abc")

    def test_text_over_the_limit_raises_state_too_large_quoting_sizes_and_a_fix(self) -> None:
        data = random.Random(3).randbytes(1000)
        size = len(encode_state(data))
        with pytest.raises(StateTooLargeError, match=rf"is {size} bytes \(1000 before compression\)") as caught:
            encode_state(data, limit=size - 1)
        message = str(caught.value)
        assert f"over the {size - 1}-byte limit" in message
        assert "lower maxNodes" in message
        assert "--local-addr" in message

    def test_state_too_large_is_a_value_error(self) -> None:
        with pytest.raises(ValueError, match=r"limit"):
            encode_state(b"x", limit=1)

    def test_default_limit_accepts_a_thousand_node_state(self) -> None:
        assert len(encode_state(pickle.dumps(make_state(1024)))) <= MAX_ENCODED_STATE_BYTES


class TestDecodeState:
    @pytest.mark.parametrize(
        ("value", "type_name"),
        [(None, "NoneType"), (b"z1:eJwDAAAAAAE=", "bytes"), (42, "int")],
    )
    def test_non_string_input_is_rejected_naming_its_type(self, value: object, type_name: str) -> None:
        with pytest.raises(StateEncodingError, match=rf"status\.state must be a string, got {type_name}"):
            decode_state(value)

    def test_non_string_input_message_quotes_the_value(self) -> None:
        with pytest.raises(StateEncodingError, match=r"got int: 42$"):
            decode_state(42)

    def test_unknown_marker_is_rejected_quoting_the_start_and_the_fix(self) -> None:
        with pytest.raises(StateEncodingError, match=r"starts with 'z2:eJwDAAAAA',") as caught:
            decode_state("z2:eJwDAAAAAAE=")
        message = str(caught.value)
        assert f"not the encoding marker {STATE_ENCODING_MARKER!r}" in message
        assert "clear .status.state to start over" in message

    def test_missing_marker_is_rejected_quoting_the_start(self) -> None:
        raw = base64.b64encode(zlib.compress(b"state")).decode("ascii")
        with pytest.raises(StateEncodingError, match=r"clear \.status\.state to start over") as caught:
            decode_state(raw)
        assert repr(raw[:12]) in str(caught.value)

    def test_empty_string_is_rejected_as_missing_the_marker(self) -> None:
        with pytest.raises(StateEncodingError, match=r"starts with '', not the encoding marker 'z1:'"):
            decode_state("")

    def test_marker_without_its_colon_is_rejected(self) -> None:
        with pytest.raises(StateEncodingError, match=r"starts with 'z1eJwDAAAAAA'"):
            decode_state("z1eJwDAAAAAAE=")

    def test_invalid_base64_is_rejected_quoting_the_payload(self) -> None:
        with pytest.raises(StateEncodingError, match=r"invalid base64 .*'not base64!'"):
            decode_state(STATE_ENCODING_MARKER + "not base64!")

    def test_base64_with_bad_padding_is_rejected(self) -> None:
        with pytest.raises(StateEncodingError, match=r"invalid base64"):
            decode_state(STATE_ENCODING_MARKER + "abc")

    def test_data_that_is_not_zlib_is_rejected_as_corrupt(self) -> None:
        with pytest.raises(StateEncodingError, match=r"corrupt zlib data"):
            decode_state(encoded_payload(b"plain pickle bytes, never compressed"))

    def test_truncated_zlib_stream_is_reported_as_truncated(self) -> None:
        compressed = zlib.compress(random.Random(4).randbytes(256))
        cut = compressed[: len(compressed) // 2]
        with pytest.raises(StateEncodingError, match=rf"truncated: the zlib stream of {len(cut)} bytes does not end"):
            decode_state(encoded_payload(cut))

    def test_zlib_stream_missing_only_its_checksum_is_reported_as_truncated(self) -> None:
        with pytest.raises(StateEncodingError, match=r"truncated"):
            decode_state(encoded_payload(zlib.compress(b"state")[:-4]))

    def test_marker_with_empty_payload_is_reported_as_truncated(self) -> None:
        with pytest.raises(StateEncodingError, match=r"truncated: the zlib stream of 0 bytes"):
            decode_state(STATE_ENCODING_MARKER)

    def test_state_encoding_error_is_a_value_error(self) -> None:
        with pytest.raises(ValueError, match=r"status\.state"):
            decode_state(None)


class TestTrailingData:
    def test_bytes_after_the_end_of_the_zlib_stream_are_reported_as_corrupt(self) -> None:
        text = "z1:" + base64.b64encode(zlib.compress(b"state") + b"junk").decode()
        with pytest.raises(StateEncodingError, match=r"4 bytes after the end of its zlib stream"):
            decode_state(text)
