"""Runs Keras 3 layers forward and backward, for TestKerasLayers.

Reads a JSON request on stdin:

  {"cases": [{"name": ...,
              "class": "Dense",       # a keras.layers class, or one of LOCAL
              "config": {...},        # its constructor's keyword arguments
              "call": "args" or "",   # several inputs as positional arguments
                                      # rather than one list
              "call_kwargs": {...},   # further arguments of the call
              "training": bool,
              "inputs": [{"dtype": "float32" or "int32", "shape": [...],
                          "values": [... row-major ...]}],
              "input_grads": bool,    # differentiate the float inputs too
              "weights": [[...]],     # layer.trainable_weights, then
                                      # layer.non_trainable_weights, each
                                      # row-major
              "cotangent": [...]}]}   # c, of the output's shape

and writes a JSON answer on stdout:

  {name: {"output": [...], "shape": [...],
          "grads": [[...]],    # of sum(output * c): the float inputs (when
                               # input_grads), then each trainable weight
          "weights": [[...]]}} # every weight, in the request's order, after
                               # the call

The layer is built by a call in inference mode, given the weights, then
called once more under a GradientTape (eager, the TensorFlow backend); a
config's "dtype" may name a mixed-precision policy, whose outputs are cast
to float32.
Values are written as the exact float32 numbers.
"""

import json
import os
import sys

os.environ["KERAS_BACKEND"] = "tensorflow"
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402
from keras import ops  # noqa: E402


class PositionEmbedding(keras.layers.Layer):
    """keras_hub.layers.PositionEmbedding, for sequences no longer than
    sequence_length: the first rows of a [sequence_length, width] table,
    broadcast to the input's shape."""

    def __init__(self, sequence_length, **kwargs):
        super().__init__(**kwargs)
        self.sequence_length = sequence_length

    def build(self, input_shape):
        self.position_embeddings = self.add_weight(
            name="embeddings", shape=(self.sequence_length, input_shape[-1]))

    def call(self, inputs):
        shape = ops.shape(inputs)
        rows = ops.slice(self.position_embeddings, (0, 0), (shape[-2], shape[-1]))
        return ops.broadcast_to(rows, shape)


class TokenAndPositionEmbedding(keras.layers.Layer):
    """keras_hub.layers.TokenAndPositionEmbedding: a token Embedding plus
    a PositionEmbedding of the embedded tokens."""

    def __init__(self, vocabulary_size, sequence_length, embedding_dim, **kwargs):
        super().__init__(**kwargs)
        self.embedding_dim = embedding_dim
        self.token_embedding = keras.layers.Embedding(vocabulary_size, embedding_dim)
        self.position_embedding = PositionEmbedding(sequence_length)

    def build(self, input_shape):
        self.token_embedding.build(input_shape)
        self.position_embedding.build(tuple(input_shape) + (self.embedding_dim,))

    def call(self, inputs):
        tokens = self.token_embedding(inputs)
        return tokens + self.position_embedding(tokens)


LOCAL = {c.__name__: c for c in (PositionEmbedding, TokenAndPositionEmbedding)}

# Activations Keras names by an argument rather than a name.
ACTIVATIONS = {
    "gelu_approximate": lambda x: keras.activations.gelu(x, approximate=True),
}


def make_layer(case):
    config = dict(case.get("config") or {})
    if config.get("activation") in ACTIVATIONS:
        config["activation"] = ACTIVATIONS[config["activation"]]
    cls = LOCAL.get(case["class"]) or getattr(keras.layers, case["class"])
    return cls(**config)


def call(layer, case, xs, training):
    kwargs = dict(case.get("call_kwargs") or {})
    if len(xs) == 1:
        return layer(xs[0], training=training, **kwargs)
    if case.get("call") == "args":
        return layer(*xs, training=training, **kwargs)
    return layer(xs, training=training, **kwargs)


def flat(x):
    return np.asarray(tf.convert_to_tensor(x), dtype=np.float64).ravel().tolist()


def run(case):
    xs = [tf.constant(np.asarray(i["values"], dtype=i["dtype"]).reshape(i["shape"]))
          for i in case["inputs"]]
    layer = make_layer(case)
    call(layer, case, xs, False)
    weights = layer.trainable_weights + layer.non_trainable_weights
    given = case["weights"] or []
    if len(weights) != len(given):
        raise ValueError("%s: Keras has weights %s, the request gives %d"
                         % (case["name"], [w.path for w in weights], len(given)))
    for w, v in zip(weights, given):
        w.assign(np.asarray(v, dtype=np.float32).reshape(w.shape))
    wrt = [x for x in xs if x.dtype.is_floating] if case["input_grads"] else []
    with tf.GradientTape() as tape:
        tape.watch(wrt)
        y = tf.cast(call(layer, case, xs, case["training"]), tf.float32)
        c = tf.constant(np.asarray(case["cotangent"], dtype=np.float32).reshape(y.shape))
        loss = tf.reduce_sum(y * c)
    sources = wrt + list(layer.trainable_weights)
    grads = tape.gradient(loss, sources)
    return {
        "output": flat(y),
        "shape": list(y.shape),
        "grads": [flat(g) if g is not None else [0.0] * int(np.prod(s.shape))
                  for g, s in zip(grads, sources)],
        "weights": [flat(w) for w in weights],
    }


def main():
    request = json.load(sys.stdin)
    json.dump({case["name"]: run(case) for case in request["cases"]}, sys.stdout)


if __name__ == "__main__":
    main()
