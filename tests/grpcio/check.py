"""Calls a gpud device plugin the way a Python client does by default.

grpcio with default channel options sends the socket path, percent-encoded, as the HTTP/2
`:authority` (e.g. `tmp%2Fx%2Fnvidia-gpu.sock`), which h2 alone would refuse. The script uses
no generated stubs: requests are protobuf bytes built by hand and responses are parsed by hand.

Usage: check.py SOCKET DEVICE_ID...
Prints one JSON object: the plugin options, the first ListAndWatch device list, and the
environment of two Allocate calls (the second refers to header-table entries the first made).
Exits non-zero if any call fails.
"""

import json
import sys

import grpc

SERVICE = "/v1beta1.DevicePlugin/"
TIMEOUT_S = 10


def varint(value):
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        if value:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def field(number, payload):
    """A length-delimited protobuf field."""
    return varint(number << 3 | 2) + varint(len(payload)) + payload


def fields(message):
    """A protobuf message as {field number: [values]} (varints as int, the rest as bytes)."""
    out = {}
    i = 0
    while i < len(message):
        key, i = read_varint(message, i)
        number, wire = key >> 3, key & 7
        if wire == 0:
            value, i = read_varint(message, i)
        elif wire == 2:
            length, i = read_varint(message, i)
            value, i = message[i : i + length], i + length
        else:
            raise ValueError(f"unexpected wire type {wire} for field {number}")
        out.setdefault(number, []).append(value)
    return out


def read_varint(data, i):
    value = shift = 0
    while True:
        byte = data[i]
        i += 1
        value |= (byte & 0x7F) << shift
        shift += 7
        if not byte & 0x80:
            return value, i


def string_map(entries):
    """A protobuf map<string, string> (entries with key 1, value 2) as a dict."""
    out = {}
    for entry in map(fields, entries):
        out[entry.get(1, [b""])[0].decode()] = entry.get(2, [b""])[0].decode()
    return out


def text(values):
    return [v.decode() for v in values]


def main():
    socket_path, device_ids = sys.argv[1], sys.argv[2:]
    with grpc.insecure_channel("unix://" + socket_path) as channel:
        options = fields(
            channel.unary_unary(SERVICE + "GetDevicePluginOptions")(b"", timeout=TIMEOUT_S)
        )
        stream = channel.unary_stream(SERVICE + "ListAndWatch")(b"", timeout=TIMEOUT_S)
        first_list = fields(next(stream))
        stream.cancel()
        request = field(1, b"".join(field(1, d.encode()) for d in device_ids))
        allocations = []
        for _ in range(2):
            allocate = channel.unary_unary(SERVICE + "Allocate")
            response = fields(allocate(request, timeout=TIMEOUT_S))
            # Per container, its envs (field 1, a map).
            allocations.append([string_map(fields(c).get(1, [])) for c in response.get(1, [])])
    devices = [fields(d) for d in first_list.get(1, [])]
    print(
        json.dumps(
            {
                "options": {
                    "pre_start_required": bool(options.get(1, [0])[0]),
                    "get_preferred_allocation_available": bool(options.get(2, [0])[0]),
                },
                "devices": [text(d[1])[0] for d in devices],
                "health": [text(d[2])[0] for d in devices],
                "allocations": allocations,
            },
            sort_keys=True,
        )
    )


if __name__ == "__main__":
    main()
