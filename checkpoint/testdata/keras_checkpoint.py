"""Trains a small Keras model and writes its weights as TensorFlow
checkpoints, for tfdist's warm start to read.

Reads JSON from stdin: {"dir", "train_x", "train_y", "x"}. Trains a
64-32-10 MLP (ReLU) for two epochs of SGD, writes
tf.train.Checkpoint(model=model) (object-based keys) and a TensorFlow 1
name-based checkpoint of the same weights (keys w1, b1, w2, b2), and prints
their prefixes, the object-based key of each trainable variable (by its
Keras path), the variables' paths in order and the model's logits on x.
"""

import json
import sys

import keras
import numpy as np
import tensorflow as tf


def main():
    req = json.load(sys.stdin)
    keras.utils.set_random_seed(1)
    model = keras.Sequential([keras.Input((64,)), keras.layers.Dense(32, activation="relu"), keras.layers.Dense(10)])
    model.compile(optimizer=keras.optimizers.SGD(0.1),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    model.fit(np.asarray(req["train_x"], np.float32), np.asarray(req["train_y"], np.int32),
              epochs=2, batch_size=32, verbose=0)

    obj = tf.train.Checkpoint(model=model).write(req["dir"] + "/object/ckpt")
    reader = tf.train.load_checkpoint(obj)
    keys = {}
    for key, _ in tf.train.list_variables(obj):
        if key == "_CHECKPOINTABLE_OBJECT_GRAPH":
            continue
        value = reader.get_tensor(key)
        for v in model.trainable_variables:
            if tuple(v.shape) == value.shape and np.array_equal(v.numpy(), value):
                keys[v.path] = key

    values = [v.numpy() for v in model.trainable_variables]
    graph = tf.Graph()
    with graph.as_default():
        variables = [tf.compat.v1.get_variable(name, initializer=value)
                     for name, value in zip(["w1", "b1", "w2", "b2"], values)]
        saver = tf.compat.v1.train.Saver(variables)
        with tf.compat.v1.Session() as sess:
            sess.run(tf.compat.v1.global_variables_initializer())
            names = saver.save(sess, req["dir"] + "/names/ckpt", write_meta_graph=False)

    json.dump({"object_prefix": obj, "object_keys": keys, "paths": [v.path for v in model.trainable_variables],
               "name_prefix": names,
               "logits": model(np.asarray(req["x"], np.float32)).numpy().tolist()}, sys.stdout)


main()
