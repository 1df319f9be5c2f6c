"""Checks an event file from //tests:write_events three ways.

(a) TensorBoard's own loaders: EventFileLoader (with the data_compat
    migration TensorBoard's backend applies: scalars and histograms become
    tensors) and EventAccumulator (legacy histograms with sum and sum_squares,
    and TensorBoard's histogram compression).
(b) A minimal TFRecord reader of our own (pure-Python CRC-32C, no TensorBoard
    code) that checks every length CRC and data CRC.
(c) That reader on copies with one byte flipped: each flip must be detected.

Usage: tensorboard_check.py EVENT_FILE. Exits non-zero naming the first
mismatch.
"""

import math
import os
import shutil
import struct
import sys
import tempfile

import numpy as np

# Same numbers as tests/write_events.cc.
SCALARS = {
    "loss": [(s, np.float32(1.0 / (s + 1))) for s in range(10)],
    "accuracy": [(s, np.float32(0.5 + 0.05 * s)) for s in range(10)],
}
HISTOGRAMS = {
    "dense/kernel": [
        (1, np.array([-1.5, -0.25, 0.0, 0.5, 1.0, 3.0], dtype=np.float32)),
        (2, np.array([np.float32(i - 50) / np.float32(20) for i in range(100)],
                     dtype=np.float32)),
    ],
    "empty": [(3, np.array([], dtype=np.float32))],
}



def _default_limits():
    """TensorFlow's default histogram bucket limits (float32, as TensorBoard
    hands them out): -DBL_MAX, -1e20 .. -1e-12, 0, 1e-12 .. 1e20, DBL_MAX."""
    pos = []
    v = 1e-12
    while v < 1e20:
        pos.append(v)
        v *= 1.1
    pos.append(sys.float_info.max)
    limits = [-x for x in reversed(pos)] + [0.0] + pos
    with np.errstate(over="ignore"):
        return np.array(limits).astype(np.float32)


DEFAULT_LIMITS32 = _default_limits()
checks = []


def check(cond, what):
    if not cond:
        print("FAIL: " + what, file=sys.stderr)
        sys.exit(1)
    checks.append(what)


def stats(values):
    d = [float(v) for v in values]
    return len(d), min(d, default=0.0), max(d, default=0.0), sum(d), sum(x * x for x in d)


# ---------------------------------------------------------------- (a) TensorBoard

def check_event_file_loader(path):
    from tensorboard.backend.event_processing import event_file_loader
    from tensorboard.util import tensor_util

    events = list(event_file_loader.EventFileLoader(path).Load())
    check(len(events) >= 1 and events[0].file_version == "brain.Event:2",
          "EventFileLoader: first event has file_version brain.Event:2")
    scalars, histos = {}, {}
    for e in events[1:]:
        for v in e.summary.value:
            plugin = v.metadata.plugin_data.plugin_name
            arr = tensor_util.make_ndarray(v.tensor)
            if plugin == "scalars":
                scalars.setdefault(v.tag, []).append((e.step, arr))
            elif plugin == "histograms":
                histos.setdefault(v.tag, []).append((e.step, arr))
            else:
                check(False, "EventFileLoader: tag %s has unexpected plugin %r" % (v.tag, plugin))
    check(sorted(scalars) == sorted(SCALARS),
          "EventFileLoader: scalar tags %s" % sorted(SCALARS))
    for tag, want in SCALARS.items():
        got = [(s, np.float32(a.item())) for s, a in scalars[tag]]
        check(got == want, "EventFileLoader: %s, all %d steps and float32 values exact"
              % (tag, len(want)))
    check(sorted(histos) == sorted(HISTOGRAMS),
          "EventFileLoader: histogram tags %s" % sorted(HISTOGRAMS))
    for tag, want in HISTOGRAMS.items():
        check([s for s, _ in histos[tag]] == [s for s, _ in want],
              "EventFileLoader: %s steps %s" % (tag, [s for s, _ in want]))
        for (step, buckets), (_, values) in zip(histos[tag], want):
            name = "EventFileLoader: %s step %d" % (tag, step)
            num, lo, hi, _, _ = stats(values)
            if num == 0:
                check(buckets.size == 0, name + ": no values, no buckets")
                continue
            check(buckets.ndim == 2 and buckets.shape[1] == 3,
                  name + ": tensor of [left, right, count] rows")
            lefts, rights, counts = buckets[:, 0], buckets[:, 1], buckets[:, 2]
            check(counts.sum() == num, name + ": counts add up to num=%d" % num)
            check(lefts[0] == np.float32(lo) and rights[-1] == np.float32(hi),
                  name + ": range [min, max] = [%g, %g]" % (lo, hi))
            check(np.all(lefts <= rights) and np.all(rights[:-1] <= lefts[1:]),
                  name + ": %d buckets, none backwards or overlapping" % len(counts))
            # Each value lies in a bucket that counts it: TensorBoard took the
            # left edges from the limits before each bucket, as intended.
            want_counts = np.zeros(len(counts))
            for v in values:
                i = min(int(np.searchsorted(rights, v, side="right")), len(counts) - 1)
                if not lefts[i] <= v <= rights[i]:
                    check(False, name + ": value %g outside bucket [%g, %g]"
                          % (v, lefts[i], rights[i]))
                want_counts[i] += 1
            check(np.array_equal(want_counts, counts),
                  name + ": each of the %d values in its bucket [left, right), "
                  "every count right" % num)
            # A writer that dropped empty buckets would pass the checks above
            # with buckets widened to the limit before them; TensorFlow's
            # default bucketing keeps each non-empty one inside one default
            # bucket.
            for left, right in zip(lefts[counts > 0], rights[counts > 0]):
                k = int(np.searchsorted(DEFAULT_LIMITS32, left, side="right"))
                if not (k < len(DEFAULT_LIMITS32) and right <= DEFAULT_LIMITS32[k]):
                    check(False, name + ": bucket [%g, %g] spans more than one default "
                          "bucket" % (left, right))
            checks.append(name + ": every non-empty bucket within one default bucket")


def check_event_accumulator(path):
    from tensorboard.backend.event_processing import event_accumulator as ea

    acc = ea.EventAccumulator(path, size_guidance={ea.SCALARS: 0, ea.HISTOGRAMS: 0,
                                                   ea.COMPRESSED_HISTOGRAMS: 0})
    acc.Reload()
    tags = acc.Tags()
    check(sorted(tags[ea.SCALARS]) == sorted(SCALARS),
          "EventAccumulator: scalar tags %s" % sorted(tags[ea.SCALARS]))
    for tag, want in SCALARS.items():
        got = [(e.step, np.float32(e.value)) for e in acc.Scalars(tag)]
        check(got == want, "EventAccumulator: %s steps and values exact" % tag)
    check(sorted(tags[ea.HISTOGRAMS]) == sorted(HISTOGRAMS),
          "EventAccumulator: histogram tags %s" % sorted(tags[ea.HISTOGRAMS]))
    for tag, want in HISTOGRAMS.items():
        got = acc.Histograms(tag)
        check([e.step for e in got] == [s for s, _ in want],
              "EventAccumulator: %s steps" % tag)
        for e, (step, values) in zip(got, want):
            h = e.histogram_value
            num, lo, hi, total, squares = stats(values)
            name = "EventAccumulator: %s step %d" % (tag, step)
            check(h.num == num and h.min == lo and h.max == hi,
                  name + ": num=%d min=%g max=%g" % (num, lo, hi))
            check(math.isclose(h.sum, total, rel_tol=1e-12, abs_tol=1e-12)
                  and math.isclose(h.sum_squares, squares, rel_tol=1e-12),
                  name + ": sum=%g sum_squares=%g" % (total, squares))
            check(sum(h.bucket) == num and len(h.bucket) == len(h.bucket_limit),
                  name + ": %d buckets add up to num" % len(h.bucket))
        for e, (step, values) in zip(acc.CompressedHistograms(tag), want):
            if len(values) == 0:
                continue
            _, lo, hi, _, _ = stats(values)
            vals = [float(c[1]) for c in e.compressed_histogram_values]
            check(math.isclose(vals[0], lo) and math.isclose(vals[-1], hi)
                  and vals == sorted(vals),
                  "EventAccumulator: %s step %d compresses to %d sorted percentiles "
                  "from min to max" % (tag, step, len(vals)))


# ---------------------------------------------------------- (b), (c) own reader

def _crc_table():
    table = []
    for i in range(256):
        c = i
        for _ in range(8):
            c = (c >> 1) ^ 0x82F63B78 if c & 1 else c >> 1
        table.append(c)
    return table


CRC_TABLE = _crc_table()


def crc32c(data):
    c = 0xFFFFFFFF
    for b in data:
        c = CRC_TABLE[(c ^ b) & 0xFF] ^ (c >> 8)
    return c ^ 0xFFFFFFFF


def masked_crc(data):
    c = crc32c(data)
    return (((c >> 15) | (c << 17)) + 0xA282EAD8) & 0xFFFFFFFF


class RecordError(Exception):
    pass


def read_records(blob):
    """Yields (offset, data) per TFRecord; RecordError on any bad field."""
    off = 0
    while off < len(blob):
        if len(blob) - off < 12:
            raise RecordError("byte %d: truncated header" % off)
        header = blob[off:off + 8]
        (length,) = struct.unpack("<Q", header)
        (len_crc,) = struct.unpack("<I", blob[off + 8:off + 12])
        if len_crc != masked_crc(header):
            raise RecordError("byte %d: length CRC mismatch" % off)
        end = off + 12 + length
        if end + 4 > len(blob):
            raise RecordError("byte %d: truncated record of length %d" % (off, length))
        data = blob[off + 12:end]
        (data_crc,) = struct.unpack("<I", blob[end:end + 4])
        if data_crc != masked_crc(data):
            raise RecordError("byte %d: data CRC mismatch" % off)
        yield off, data
        off = end + 4


def proto_fields(data):
    """Top-level (field number, wire type, value) of a protobuf message."""
    def varint(i):
        shift = value = 0
        while True:
            b = data[i]
            value |= (b & 0x7F) << shift
            i += 1
            if not b & 0x80:
                return value, i
            shift += 7
    i, out = 0, []
    while i < len(data):
        key, i = varint(i)
        field, wire = key >> 3, key & 7
        if wire == 0:
            value, i = varint(i)
        elif wire == 1:
            value, i = data[i:i + 8], i + 8
        elif wire == 2:
            n, i = varint(i)
            value, i = data[i:i + n], i + n
        elif wire == 5:
            value, i = data[i:i + 4], i + 4
        else:
            raise RecordError("wire type %d" % wire)
        out.append((field, wire, value))
    return out


def check_raw(path, num_events):
    with open(path, "rb") as f:
        blob = f.read()
    check(crc32c(b"123456789") == 0xE3069283, "own CRC-32C: check value of '123456789'")
    try:
        records = list(read_records(blob))
    except RecordError as e:
        check(False, "own reader: %s" % e)
    check(len(records) == num_events,
          "own reader: %d records, every length and data CRC valid, %d bytes, no tail"
          % (len(records), len(blob)))
    first = dict((f, v) for f, _, v in proto_fields(records[0][1]))
    check(first.get(3) == b"brain.Event:2" and 1 in first,
          "own reader: record 0 is Event{wall_time, file_version=brain.Event:2}")
    steps = [dict((f, v) for f, _, v in proto_fields(d)).get(2, 0) for _, d in records[1:]]
    check(steps == [s for s in range(10) for _ in (0, 1)] + [1, 2, 3],
          "own reader: event steps in write order")

    # (c) One byte flipped in each field of record 1, each in its own copy.
    off1, data1 = records[1]
    tmp = tempfile.mkdtemp(dir=os.environ.get("TEST_TMPDIR"))
    try:
        for where, pos in (("length", off1), ("length CRC", off1 + 9),
                           ("data", off1 + 12 + len(data1) // 2),
                           ("data CRC", off1 + 12 + len(data1) + 3)):
            bad = bytearray(blob)
            bad[pos] ^= 0x01
            copy = os.path.join(tmp, "flipped")
            with open(copy, "wb") as f:
                f.write(bad)
            with open(copy, "rb") as f:
                try:
                    list(read_records(f.read()))
                    detected = None
                except RecordError as e:
                    detected = str(e)
            check(detected is not None and detected.startswith("byte %d:" % off1),
                  "own reader: flipped byte %d (record 1's %s) detected: %s"
                  % (pos, where, detected))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def main():
    if len(sys.argv) != 2:
        sys.exit("usage: tensorboard_check.py EVENT_FILE")
    path = sys.argv[1]
    import tensorboard
    print("tensorboard %s reading %s" % (tensorboard.__version__, path))
    check_event_file_loader(path)
    check_event_accumulator(path)
    num_events = 1 + sum(len(v) for v in SCALARS.values()) + sum(
        len(v) for v in HISTOGRAMS.values())
    check_raw(path, num_events)
    for c in checks:
        print("ok: " + c)
    print("PASS: %d checks" % len(checks))


if __name__ == "__main__":
    main()
