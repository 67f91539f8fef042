"""Parses tf.Examples with tf.io.VarLenFeature, the reference for tfdist's
VarLen features.

Reads JSON from stdin: {"examples": [hex, ...], "features": {name: dtype}}
with dtype "float32", "int64" or "string", and prints, per example, each
feature's values (strings as hex) as tf.io.parse_single_example gives them.
"""

import json
import sys

import tensorflow as tf

DTYPES = {"float32": tf.float32, "int64": tf.int64, "string": tf.string}


def main():
    req = json.load(sys.stdin)
    spec = {name: tf.io.VarLenFeature(DTYPES[d]) for name, d in req["features"].items()}
    out = []
    for ex in req["examples"]:
        parsed = tf.io.parse_single_example(bytes.fromhex(ex), spec)
        row = {}
        for name, d in req["features"].items():
            vals = parsed[name].values.numpy().tolist()
            row[name] = [v.hex() for v in vals] if d == "string" else vals
        out.append(row)
    json.dump({"parsed": out}, sys.stdout)


main()
