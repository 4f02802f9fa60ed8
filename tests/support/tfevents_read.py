# An independent reader of TensorBoard event files, for the monitor tests:
#   /usr/bin/python3 tfevents_read.py PROTO_FILE EVENT_FILE
# Compiles PROTO_FILE (src/monitor/proto/tensorboard_event.proto: the messages the library encodes
# by hand, without protobuf, in src/monitor/tensorboard_event.cpp) with `protoc --python_out` into
# a temporary folder, then reads EVENT_FILE record by record: the TFRecord framing with both masked
# CRC-32C checksums checked (a pure-Python CRC, not the library's), each record parsed as
# tensorboard.Event. Prints one line per event:
#   file_version <version>            (the first record)
#   scalar <tag> <step> <value>       (value: Python repr of the float32 simple_value)
# and "records <n>" at the end. Exit status 2 (with a message on stderr) for a bad checksum, a
# truncated record or an unparsable event; 3 when python3-protobuf or protoc is missing.
import importlib
import os
import shutil
import struct
import subprocess
import sys
import tempfile


def crc32c_table():
    table = []
    for i in range(256):
        c = i
        for _ in range(8):
            c = (c >> 1) ^ 0x82F63B78 if c & 1 else c >> 1
        table.append(c)
    return table


TABLE = crc32c_table()


def crc32c(data):
    c = 0xFFFFFFFF
    for b in data:
        c = TABLE[(c ^ b) & 0xFF] ^ (c >> 8)
    return c ^ 0xFFFFFFFF


def masked(data):
    c = crc32c(data)
    return (((c >> 15) | (c << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def fail(message):
    print(message, file=sys.stderr)
    sys.exit(2)


def load_module(proto):
    try:
        import google.protobuf  # noqa: F401
    except ImportError:
        print("python3-protobuf is not installed", file=sys.stderr)
        sys.exit(3)
    if shutil.which("protoc") is None:
        print("protoc (protobuf-compiler) is not installed", file=sys.stderr)
        sys.exit(3)
    out = tempfile.mkdtemp(prefix="tfevents_read_")
    folder, name = os.path.split(os.path.abspath(proto))
    subprocess.run(["protoc", "--python_out=" + out, "-I", folder, name], check=True)
    sys.path.insert(0, out)
    return importlib.import_module(name[:-len(".proto")] + "_pb2")


def main():
    pb = load_module(sys.argv[1])
    with open(sys.argv[2], "rb") as f:
        blob = f.read()
    pos, n = 0, 0
    while pos < len(blob):
        if pos + 12 > len(blob):
            fail("truncated record header at offset %d" % pos)
        header = blob[pos:pos + 8]
        (length,) = struct.unpack("<Q", header)
        (length_crc,) = struct.unpack("<I", blob[pos + 8:pos + 12])
        if masked(header) != length_crc:
            fail("length checksum mismatch at offset %d" % pos)
        end = pos + 12 + length + 4
        if end > len(blob):
            fail("truncated record at offset %d" % pos)
        data = blob[pos + 12:pos + 12 + length]
        (data_crc,) = struct.unpack("<I", blob[end - 4:end])
        if masked(data) != data_crc:
            fail("data checksum mismatch at offset %d" % pos)
        event = pb.Event()
        try:
            event.ParseFromString(data)
        except Exception as e:  # noqa: BLE001
            fail("record at offset %d is not an Event: %s" % (pos, e))
        what = event.WhichOneof("what")
        if what == "file_version":
            print("file_version", event.file_version)
        elif what == "summary":
            for v in event.summary.value:
                print("scalar", v.tag, event.step, repr(v.simple_value))
        else:
            fail("record at offset %d holds %s" % (pos, what))
        pos = end
        n += 1
    print("records", n)


if __name__ == "__main__":
    main()
