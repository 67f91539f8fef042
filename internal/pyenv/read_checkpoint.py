"""Reads a checkpoint as a Python user does, for pyenv.ReadCheckpoint.

Reads {"prefix": ...} on stdin; writes {key: {"shape": [...], "values": [...]}}
on stdout: every tensor of the checkpoint, read with
tf.train.load_checkpoint, its values flattened.
"""

import json
import sys

import tensorflow as tf


def main():
    prefix = json.load(sys.stdin)["prefix"]
    reader = tf.train.load_checkpoint(prefix)
    out = {}
    for key, shape in tf.train.list_variables(prefix):
        value = reader.get_tensor(key)
        if isinstance(value, bytes) or getattr(value, "dtype", None) == object:
            continue
        out[key] = {"shape": list(shape), "values": [float(x) for x in value.reshape(-1).tolist()]}
    json.dump(out, sys.stdout)


if __name__ == "__main__":
    main()
