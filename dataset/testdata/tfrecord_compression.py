"""Writes and reads compressed TFRecord files with TensorFlow's own code.

Reads JSON from stdin: {"write": [{"path", "compression", "records"}],
"read": [{"path", "compression"}]}, records as hex strings, compression
"GZIP" or "ZLIB"; writes each file with tf.io.TFRecordWriter, then reads
each file with tf.data.TFRecordDataset and prints {"read": [[hex, ...], ...]}.
"""

import json
import sys

import tensorflow as tf


def main():
    req = json.load(sys.stdin)
    for w in req["write"]:
        options = tf.io.TFRecordOptions(compression_type=w["compression"])
        with tf.io.TFRecordWriter(w["path"], options=options) as writer:
            for rec in w["records"]:
                writer.write(bytes.fromhex(rec))
    read = []
    for r in req["read"]:
        ds = tf.data.TFRecordDataset(r["path"], compression_type=r["compression"])
        read.append([rec.numpy().hex() for rec in ds])
    json.dump({"read": read}, sys.stdout)


main()
