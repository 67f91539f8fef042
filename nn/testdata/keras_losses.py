"""Reduces Keras 3 losses under tf.distribute, for TestLossReductionsMatchTensorFlow.

Reads a JSON request on stdin:

  {"cases": [{"name": ...,
              "logits": [{"shape": [...], "values": [...]}, ...],  # per replica
              "labels": [{"shape": [...], "values": [...]}, ...],  # int
              "weights": [{"shape": [...], "values": [...]}, ...] or absent,
              "global_batch_size": n,
              "keras": true or false}]}

and, under a MirroredStrategy on two logical CPUs, each replica given its own
values, writes a JSON answer on stdout:

  {name: {"per_example": [[...] per replica],   # flat, the unweighted losses
          "compute_average_loss": x,             # summed over the replicas
          "compute_average_loss_global": x,      # with global_batch_size
          "sum_over_batch_size": x, "sum": x,    # Keras reductions, summed
          "none": [[...] per replica]}}          # flat

The per-example losses are keras.losses.SparseCategoricalCrossentropy
(from_logits=True, reduction=None) of the logits; the Keras reductions are the
same loss object with each reduction and the sample weights, as model.fit
calls it in replica context. Without "keras", only tf.nn.compute_average_loss
is computed.
"""

import json
import os
import sys

os.environ["KERAS_BACKEND"] = "tensorflow"
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import tensorflow as tf  # noqa: E402

cpu = tf.config.list_physical_devices("CPU")[0]
tf.config.set_logical_device_configuration(
    cpu, [tf.config.LogicalDeviceConfiguration(), tf.config.LogicalDeviceConfiguration()]
)

import keras  # noqa: E402
import numpy as np  # noqa: E402

strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
assert strategy.num_replicas_in_sync == 2


def distribute(per_replica, dtype):
    def value(ctx):
        t = per_replica[ctx.replica_id_in_sync_group]
        return tf.constant(np.array(t["values"], dtype=dtype).reshape(t["shape"]))

    return strategy.experimental_distribute_values_from_function(value)


def flat(per_replica):
    return [np.asarray(t).reshape(-1).astype(np.float64).tolist() for t in strategy.experimental_local_results(per_replica)]


def total(per_replica):
    return float(strategy.reduce(tf.distribute.ReduceOp.SUM, per_replica, axis=None).numpy())


def run(case):
    logits = distribute(case["logits"], np.float32)
    labels = distribute(case["labels"], np.int32)
    weights = distribute(case["weights"], np.float32) if case.get("weights") else None
    n = case["global_batch_size"]

    def step(logits, labels, weights):
        out = {}
        per_example = keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction=None)(labels, logits)
        out["per_example"] = per_example
        out["compute_average_loss"] = tf.nn.compute_average_loss(per_example, sample_weight=weights)
        out["compute_average_loss_global"] = tf.nn.compute_average_loss(
            per_example, sample_weight=weights, global_batch_size=n
        )
        if case["keras"]:
            for name, red in (("sum_over_batch_size", "sum_over_batch_size"), ("sum", "sum"), ("none", None)):
                loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction=red)
                out[name] = loss(labels, logits, sample_weight=weights)
        return out

    out = strategy.run(step, args=(logits, labels, weights))
    answer = {"per_example": flat(out["per_example"]), "none": flat(out["none"]) if "none" in out else []}
    for name in ("compute_average_loss", "compute_average_loss_global", "sum_over_batch_size", "sum"):
        if name in out:
            answer[name] = total(out[name])
    return answer


def main():
    request = json.load(sys.stdin)
    json.dump({case["name"]: run(case) for case in request["cases"]}, sys.stdout)


if __name__ == "__main__":
    main()
