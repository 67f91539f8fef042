"""Runs keras.layers.MultiHeadAttention, for TestMultiHeadAttentionMatchesKeras.

Reads a JSON request on stdin:

  {"cases": [{"name": ...,
              "config": {...},   # MultiHeadAttention's arguments; null: default
              "causal": bool,    # use_causal_mask
              "tensors": {name: {"shape": [...], "values": [...]}},
              "query": name, "value": name, "key": name or absent,
              "mask": {"shape": [...], "values": [...], "dtype": "bool" or absent (float32)} or absent,
              "weights": {"query/kernel": {"shape": ..., "values": ...}, ...},
              "loss_weights": {"shape": [...], "values": [...]}}],
   "init": [{"name": ..., "config": {...}, "query": [shape], "value": [shape]}]}

and writes a JSON answer on stdout:

  {"cases": {name: {"output": [...],                   # flat
                    "grads": {tensor or weight name: [...]}}},
   "init": {name: {weight name: {"std": x, "max_abs": x}}}}

A case builds the layer for its tensors' shapes, sets its weights, and
returns its output (inference) and the gradients of sum(output *
loss_weights) with respect to every tensor and weight. An init entry
builds the layer with its default initializers and describes each weight.
"""

import json
import os
import sys

os.environ["KERAS_BACKEND"] = "tensorflow"
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402


def array(t, dtype="float32"):
    return np.asarray(t["values"], dtype=dtype).reshape(t["shape"])


def layer(config):
    return keras.layers.MultiHeadAttention(
        **{k: v for k, v in config.items() if v is not None}
    )


def weights(mha):
    """Returns the layer's weights by the names tfdist gives them."""
    out = {}
    for name, dense in [
        ("query", mha.query_dense),
        ("key", mha.key_dense),
        ("value", mha.value_dense),
        ("attention_output", mha.output_dense),
    ]:
        out[name + "/kernel"] = dense.kernel
        if dense.bias is not None:
            out[name + "/bias"] = dense.bias
    return out


def flat(x):
    return np.asarray(tf.cast(x, tf.float64)).ravel().tolist()


def run_case(c):
    mha = layer(c["config"])
    xs = {n: tf.Variable(array(t)) for n, t in c["tensors"].items()}
    query, value = xs[c["query"]], xs[c["value"]]
    key = xs[c["key"]] if c.get("key") else None
    mha.build(query.shape, value.shape, None if key is None else key.shape)
    ws = weights(mha)
    if set(ws) != set(c["weights"]):
        raise ValueError(f"{c['name']}: Keras has weights {sorted(ws)}, given {sorted(c['weights'])}")
    for n, w in ws.items():
        w.assign(array(c["weights"][n]))
    mask = None
    if c.get("mask"):
        mask = tf.constant(array(c["mask"], c["mask"].get("dtype", "float32")))
    lw = tf.constant(array(c["loss_weights"]))
    with tf.GradientTape() as tape:
        y = mha(query, value, key=key, attention_mask=mask, use_causal_mask=c["causal"], training=False)
        loss = tf.reduce_sum(tf.cast(y, tf.float32) * lw)
    names = list(xs) + list(ws)
    grads = tape.gradient(loss, list(xs.values()) + list(ws.values()))
    return {"output": flat(y), "grads": {n: flat(g) for n, g in zip(names, grads)}}


def describe_init(c):
    mha = layer(c["config"])
    mha.build(tuple(c["query"]), tuple(c["value"]))
    out = {}
    for n, w in weights(mha).items():
        v = np.asarray(w, dtype=np.float64)
        out[n] = {"std": float(v.std()), "max_abs": float(np.abs(v).max())}
    return out


def main():
    req = json.load(sys.stdin)
    answer = {
        "cases": {c["name"]: run_case(c) for c in req.get("cases", [])},
        "init": {c["name"]: describe_init(c) for c in req.get("init", [])},
    }
    json.dump(answer, sys.stdout)


if __name__ == "__main__":
    main()
