"""The ResNet of examples/resnet in Keras 3, trained with model.fit under
tf.distribute.MirroredStrategy, for BenchmarkAgainstKeras.

Reads one JSON line on stdin:

  {"replicas": 2,                 # logical CPUs, one replica each
   "intra_op": 2, "inter_op": 2,  # TensorFlow's thread pools
   "global_batch": 64, "filters": 16, "lr": 0.05, "decay_steps": 1000,
   "seed": 1,
   "x": path, "y": path, "n": examples}  # float32 [n, 64], int32 [n], raw

builds and compiles the model and starts model.fit; after its first step
(the trace) prints {"ready": true, ...}; then, for every further line
{"seconds": s, "warmup": w}, trains on until s seconds have passed after
w more steps and prints {"steps": k, "seconds": t}: the k steps after the
warm-up took t seconds. Training pauses between requests (see Server); it
exits at the end of its input.
"""

import numpy as np

# internal/kerasbench, on PYTHONPATH: it configures TensorFlow first.
from serve import serve, setup

cfg, strategy = setup()

import keras  # noqa: E402
import tensorflow as tf  # noqa: E402


def conv_bn(x, filters, activation):
    """A 3x3 convolution without bias, synchronized BatchNorm, activation:
    examples/resnet's convBN."""
    x = keras.layers.Conv2D(filters, 3, padding="same", use_bias=False)(x)
    x = keras.layers.BatchNormalization(synchronized=True)(x)
    return keras.layers.Activation(activation)(x)


def resnet(filters):
    """examples/resnet's resnet."""
    inputs = keras.Input((64,))
    x = keras.layers.Reshape((8, 8, 1))(inputs)
    x = conv_bn(x, filters, "relu")
    for _ in range(2):
        h = conv_bn(x, filters, "relu")
        h = conv_bn(h, filters, "linear")
        x = keras.layers.Activation("relu")(keras.layers.Add()([x, h]))
    x = keras.layers.GlobalAveragePooling2D()(x)
    return keras.Model(inputs, keras.layers.Dense(10)(x))


with strategy.scope():
    model = resnet(cfg["filters"])
    model.compile(
        optimizer=keras.optimizers.SGD(
            keras.optimizers.schedules.CosineDecay(cfg["lr"], cfg["decay_steps"]),
            momentum=0.9),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        metrics=[keras.metrics.SparseCategoricalAccuracy(name="accuracy")])

n = cfg["n"]
x = np.fromfile(cfg["x"], dtype=np.float32).reshape(n, 64)
y = np.fromfile(cfg["y"], dtype=np.int32).reshape(n)
data = (tf.data.Dataset.from_tensor_slices((x, y))
        .shuffle(n, seed=cfg["seed"]).repeat()
        .batch(cfg["global_batch"], drop_remainder=True)
        .prefetch(tf.data.AUTOTUNE))


serve(model, data, strategy)
