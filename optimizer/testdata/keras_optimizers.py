"""Applies Keras 3 optimizers and schedules, for TestKerasOptimizers.

Reads a JSON request on stdin:

  {"variables": [{"name": "kernel", "value": [...]}, ...],
   "grads": [[[...gradient of each variable...]] for each step],
   "cases": [{"name": ..., "optimizer": "Adam",       # a keras.optimizers class
              "args": {...},                          # its keyword arguments
              "schedule": {"class": "CosineDecay", "args": {...}} or absent,
              "exclude_from_weight_decay": [...] or absent}],
   "schedules": [{"class": ..., "args": {...}}],
   "schedule_steps": n}

and writes a JSON answer on stdout:

  {"cases": {name: [[values of each variable] after each step]},
   "schedules": [[rate at step 0..n-1] for each schedule]}

Variables are float32 keras.Variables, gradients float32 tensors applied with
optimizer.apply (eager, the TensorFlow backend); values are written as the
exact float32 numbers.
"""

import json
import os
import sys

os.environ["KERAS_BACKEND"] = "tensorflow"
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras  # noqa: E402
import numpy as np  # noqa: E402


def floats(args):
    """Returns args with its integers but step counts as floats: JSON writes
    0.0 as 0, which Keras would take for an integer rate."""
    return {
        k: float(v) if type(v) is int and not k.endswith("_steps") else v
        for k, v in args.items()
    }


def schedule(spec):
    return getattr(keras.optimizers.schedules, spec["class"])(**floats(spec["args"]))


def run(case, variables, grads):
    kwargs = floats(case.get("args", {}))
    if "schedule" in case:
        kwargs["learning_rate"] = schedule(case["schedule"])
    opt = getattr(keras.optimizers, case["optimizer"])(**kwargs)
    vs = [keras.Variable(np.array(v["value"], dtype=np.float32), name=v["name"]) for v in variables]
    if case.get("exclude_from_weight_decay"):
        opt.exclude_from_weight_decay(var_names=case["exclude_from_weight_decay"])
    out = []
    for step in grads:
        opt.apply([keras.ops.convert_to_tensor(np.array(g, dtype=np.float32)) for g in step], vs)
        out.append([np.asarray(v.numpy(), dtype=np.float32).tolist() for v in vs])
    return out


def main():
    req = json.load(sys.stdin)
    answer = {
        "cases": {c["name"]: run(c, req["variables"], req["grads"]) for c in req["cases"]},
        "schedules": [
            [float(np.float32(schedule(s)(step))) for step in range(req["schedule_steps"])]
            for s in req["schedules"]
        ],
    }
    json.dump(answer, sys.stdout)


if __name__ == "__main__":
    main()
