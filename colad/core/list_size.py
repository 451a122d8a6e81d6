"""The bytes of a ListAndWatchResponse: protobuf's framing of its devices, and the most one device takes.

device_list.py encodes the list with this framing, byte for byte; config.py refuses a `replicas`
value for which even one device could not fit the kubelet's receive limit. Pure, no protobuf
import: every role loads a config.
"""

from __future__ import annotations

from colad.core import constants

# `repeated Device devices = 1` of ListAndWatchResponse: field 1, wire type 2 (length-delimited). Every
# field of v1beta1's Device, TopologyInfo and NUMANode has a number below 16: a one-byte tag.
DEVICES_TAG = b"\x0a"


def varint(value: int) -> bytes:
    """`value` (>= 0) as a protobuf varint: 7 bits a byte, low first, the high bit set on all but the last."""
    out = bytearray()
    while value > 0x7F:
        out.append(value & 0x7F | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def _field_bytes(body: int) -> int:
    """A length-delimited protobuf field: one tag byte, the length, the body."""
    return len(DEVICES_TAG) + len(varint(body)) + body


def device_entry_max_bytes(replicas: int, numa_nodes: int = constants.MAX_DEVICE_LIST_ENTRIES) -> int:
    """The most bytes one advertised device can take in a ListAndWatchResponse (v1beta1 api.proto).

    Its ID is the longest file name (MAX_DEVICE_ID_LENGTH) plus "::<replicas - 1>", its health
    "Unhealthy", its topology `numa_nodes` NUMA IDs of two varint bytes each (up to MAX_NUMA_NODE).
    """
    suffix = 0
    if replicas > 1:  # the default (1) needs no device model: every role loads a config
        from colad.core.devices import replica_suffix_length

        suffix = replica_suffix_length(replicas)
    id_bytes = constants.MAX_DEVICE_ID_LENGTH + suffix
    node = _field_bytes(1 + len(varint(constants.MAX_NUMA_NODE)))  # NUMANode{ID} in TopologyInfo.nodes
    topology = _field_bytes(numa_nodes * node) if numa_nodes else 0
    return _field_bytes(_field_bytes(id_bytes) + _field_bytes(len(constants.UNHEALTHY)) + topology)


def max_devices_in_list(replicas: int, numa_nodes: int = constants.MAX_DEVICE_LIST_ENTRIES) -> int:
    """How many device files one resource can have so that its ListAndWatch answer always fits the
    kubelet's receive limit, whatever the names, health and topology (each file is `replicas` entries).
    """
    per_file = replicas * device_entry_max_bytes(replicas, numa_nodes)
    return constants.KUBELET_MAX_RECV_MESSAGE_BYTES // per_file
