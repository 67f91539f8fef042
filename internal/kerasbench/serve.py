"""The Python side of internal/kerasbench. A benchmark's script calls
setup(), which reads the setup line and configures TensorFlow as the Go
side runs (thread pools, logical CPUs, seeds), builds its model and data
in the strategy it returns, and calls serve(model, data, strategy), which
runs model.fit and answers the harness's requests on stdin from inside
it, between steps. The harness puts this directory on PYTHONPATH."""

import json
import os
import sys
import time

os.environ["KERAS_BACKEND"] = "tensorflow"
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import tensorflow as tf  # noqa: E402
import keras  # noqa: E402


def setup():
    """Reads the setup line (a JSON object with at least replicas,
    intra_op, inter_op and seed), configures TensorFlow's thread pools, one
    logical CPU per replica and the seeds, and returns the setup and a
    MirroredStrategy over those CPUs."""
    cfg = json.loads(sys.stdin.readline())
    tf.config.threading.set_intra_op_parallelism_threads(cfg["intra_op"])
    tf.config.threading.set_inter_op_parallelism_threads(cfg["inter_op"])
    cpu = tf.config.list_physical_devices("CPU")[0]
    tf.config.set_logical_device_configuration(
        cpu, [tf.config.LogicalDeviceConfiguration()] * cfg["replicas"])
    keras.utils.set_random_seed(cfg["seed"])
    return cfg, tf.distribute.MirroredStrategy(
        [f"/cpu:{i}" for i in range(cfg["replicas"])])


def onednn():
    """Whether TensorFlow's kernels use oneDNN (TF_ENABLE_ONEDNN_OPTS and
    the CPU decide)."""
    try:
        from tensorflow.python.util import _pywrap_util_port
        return bool(_pywrap_util_port.IsMklEnabled())
    except (ImportError, AttributeError):
        return None


def reply(obj):
    print(json.dumps(obj), flush=True)


class Server(keras.callbacks.Callback):
    """Answers the requests on stdin from inside one model.fit, between
    steps: after the first step (which traces the training function) it
    prints the ready line; then, for each request, it lets warmup steps
    pass untimed, times the steps until seconds have passed, prints them
    and blocks, training paused, until the next request. At the end of the
    input it stops training. One fit, one iterator over the data: with a
    fit per request, TensorFlow builds a multi-device iterator for each,
    and on this machine the 16th fit of a process spent 38 to 260 s
    building it."""

    def __init__(self, replicas):
        super().__init__()
        self.replicas = replicas
        self.req, self.start, self.steps = None, None, 0

    def next_request(self):
        line = sys.stdin.readline()
        if not line:
            self.model.stop_training = True
            return
        self.req, self.start, self.steps = json.loads(line), None, 0
        self.warm = self.req["warmup"]
        if self.warm == 0:
            self.start = time.perf_counter()

    def on_train_batch_end(self, batch, logs=None):
        now = time.perf_counter()
        if self.req is None:  # the first step, traced
            reply({"ready": True, "params": int(self.model.count_params()),
                   "jit_compile": bool(self.model.jit_compile),
                   "replicas": self.replicas,
                   "intra_op": tf.config.threading.get_intra_op_parallelism_threads(),
                   "inter_op": tf.config.threading.get_inter_op_parallelism_threads(),
                   "onednn": onednn(),
                   "tensorflow": tf.__version__, "keras": keras.__version__})
            self.next_request()
        elif self.warm > 0:
            self.warm -= 1
            if self.warm == 0:
                self.start = now
        else:
            self.steps += 1
            if now - self.start >= self.req["seconds"]:
                reply({"steps": self.steps, "seconds": now - self.start})
                self.next_request()



def serve(model, data, strategy):
    """Trains model on data in one model.fit, serving the harness's
    requests (see Server), and ends the process when its input ends."""
    model.fit(data, epochs=1, steps_per_epoch=1 << 30, verbose=0, shuffle=False,
              callbacks=[Server(strategy.num_replicas_in_sync)])
    # Skip the interpreter's teardown, which can wait on TensorFlow's threads.
    os._exit(0)
