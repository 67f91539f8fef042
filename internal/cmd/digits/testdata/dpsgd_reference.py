"""DP-SGD in Python TensorFlow, the reference tfdist's is compared with.

The digits MLP (64-hidden-10, ReLU, Glorot-uniform kernels, zero biases),
trained by DP-SGD with Poisson sampling: each step takes every training
example with probability rate, computes each example's gradient with
tf.vectorized_map, clips it to clip (global norm), sums, adds
N(0, (noise*clip)^2) and divides by the expected batch, then takes an SGD
step of lr. Reads JSON settings and data from stdin, prints
{"accuracy": [...]} with one held-out accuracy per seed.
"""

import json
import sys

import numpy as np
import tensorflow as tf


def train(req, split, seed):
    xtr = np.asarray(split["x_train"], np.float32)
    ytr = np.asarray(split["y_train"], np.int32)
    xte = np.asarray(split["x_test"], np.float32)
    yte = np.asarray(split["y_test"], np.int32)
    h, clip, noise, lr = req["hidden"], req["clip"], req["noise"], req["lr"]
    expected = req["global_batch"]
    rate = expected / len(xtr)
    tf.random.set_seed(seed)
    rng = np.random.default_rng(seed)
    init = tf.keras.initializers.GlorotUniform(seed=seed)
    params = [tf.Variable(init([xtr.shape[1], h])), tf.Variable(tf.zeros([h])),
              tf.Variable(init([h, 10])), tf.Variable(tf.zeros([10]))]

    def logits(x):
        return tf.nn.relu(x @ params[0] + params[1]) @ params[2] + params[3]

    def clipped(args):
        x, y = args
        with tf.GradientTape() as tape:
            loss = tf.nn.sparse_softmax_cross_entropy_with_logits(labels=y[None], logits=logits(x[None]))
        grads = tape.gradient(loss, params)
        factor = tf.minimum(1.0, clip / tf.linalg.global_norm(grads))
        return [g * factor for g in grads]

    @tf.function(input_signature=[tf.TensorSpec([None, xtr.shape[1]], tf.float32), tf.TensorSpec([None], tf.int32)])
    def step(x, y):
        if tf.shape(x)[0] > 0:
            sums = [tf.reduce_sum(g, 0) for g in tf.vectorized_map(clipped, (x, y))]
        else:
            sums = [tf.zeros_like(p) for p in params]
        for p, s in zip(params, sums):
            p.assign_sub(lr * (s + tf.random.normal(tf.shape(s), stddev=noise * clip)) / expected)

    for _ in range(req["steps"]):
        idx = np.nonzero(rng.random(len(xtr)) < rate)[0]
        step(xtr[idx], ytr[idx])
    pred = tf.argmax(logits(xte), axis=1, output_type=tf.int32).numpy()
    return float(np.mean(pred == yte))


def main():
    req = json.load(sys.stdin)
    json.dump({"accuracy": [train(req, split, seed) for seed, split in zip(req["seeds"], req["splits"])]}, sys.stdout)


main()
