"""The Transformer of examples/transformer in Keras 3, trained with
model.fit under tf.distribute.MirroredStrategy, for BenchmarkAgainstKeras.

Reads one JSON line on stdin:

  {"replicas": 2,                 # logical CPUs, one replica each
   "intra_op": 2, "inter_op": 2,  # TensorFlow's thread pools
   "global_batch": 32, "seq_len": 64, "width": 64, "heads": 4,
   "layers": 2, "vocab": 98, "lr": 3e-3, "warmup_steps": 50,
   "decay_steps": 1450, "seed": 1,
   "x": path, "y": path, "n": windows}  # int32 [n, seq_len] each, raw

builds and compiles the model and starts model.fit; after its first step
(the trace) prints {"ready": true, ...}; then, for every further line
{"seconds": s, "warmup": w}, trains on until s seconds have passed after
w more steps and prints {"steps": k, "seconds": t}: the k steps after the
warm-up took t seconds. Training pauses between requests (see Server); it
exits at the end of its input.

keras_hub, whose TokenAndPositionEmbedding the example's README names, is
not installed: the layer is written here as keras_hub defines it, a token
Embedding plus a learned [seq_len, width] position table.
"""

import numpy as np

# internal/kerasbench, on PYTHONPATH: it configures TensorFlow first.
from serve import serve, setup

cfg, strategy = setup()

import keras  # noqa: E402
import tensorflow as tf  # noqa: E402
from keras import ops  # noqa: E402


class TokenAndPositionEmbedding(keras.layers.Layer):
    """keras_hub.layers.TokenAndPositionEmbedding: a token Embedding plus
    the first rows of a learned [sequence_length, width] table."""

    def __init__(self, vocabulary_size, sequence_length, embedding_dim, **kwargs):
        super().__init__(**kwargs)
        self.sequence_length, self.embedding_dim = sequence_length, embedding_dim
        self.token_embedding = keras.layers.Embedding(vocabulary_size, embedding_dim)

    def build(self, input_shape):
        self.token_embedding.build(input_shape)
        self.position_embeddings = self.add_weight(
            name="embeddings", shape=(self.sequence_length, self.embedding_dim))

    def call(self, inputs):
        tokens = self.token_embedding(inputs)
        shape = ops.shape(tokens)
        rows = ops.slice(self.position_embeddings, (0, 0), (shape[-2], shape[-1]))
        return tokens + ops.broadcast_to(rows, shape)


def transformer(vocab, seq_len, width, heads, layers):
    """examples/transformer's newModel, as its README writes it in Keras."""
    ids = keras.Input((seq_len,), dtype="int32")
    x = TokenAndPositionEmbedding(vocab, seq_len, width)(ids)
    for _ in range(layers):
        h = keras.layers.LayerNormalization()(x)
        h = keras.layers.MultiHeadAttention(heads, width // heads)(h, h, use_causal_mask=True)
        x = keras.layers.Add()([x, h])
        h = keras.layers.LayerNormalization()(x)
        h = keras.layers.Dense(4 * width, activation="gelu")(h)
        h = keras.layers.Dense(width)(h)
        x = keras.layers.Add()([x, h])
    logits = keras.layers.Dense(vocab)(keras.layers.LayerNormalization()(x))
    return keras.Model(ids, logits)


with strategy.scope():
    model = transformer(cfg["vocab"], cfg["seq_len"], cfg["width"], cfg["heads"], cfg["layers"])
    # The example's schedule: a linear warmup from 0 to lr, then a cosine
    # decay to a tenth of lr.
    lr = keras.optimizers.schedules.CosineDecay(
        0.0, cfg["decay_steps"], alpha=0.1,
        warmup_target=cfg["lr"], warmup_steps=cfg["warmup_steps"])
    model.compile(
        optimizer=keras.optimizers.Adam(lr),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))

n, seq_len = cfg["n"], cfg["seq_len"]
x = np.fromfile(cfg["x"], dtype=np.int32).reshape(n, seq_len)
y = np.fromfile(cfg["y"], dtype=np.int32).reshape(n, seq_len)
data = (tf.data.Dataset.from_tensor_slices((x, y))
        .shuffle(n, seed=cfg["seed"]).repeat()
        .batch(cfg["global_batch"], drop_remainder=True)
        .prefetch(tf.data.AUTOTUNE))


serve(model, data, strategy)
