"""The parameter-server soak of `tfdist soak -strategies ps`, in Python TensorFlow.

Runs tf.distribute.ParameterServerStrategy with a chief, --workers workers
and --ps ps tasks, each a process of its own on 127.0.0.1 (the workers and
ps tasks tf.distribute.Server), training the soak's model for --steps
steps, or until --seconds have passed: the digits classifier's
multi-layer perceptron (64 inputs, 64 hidden units with ReLU, 10 classes),
a batch of 64 per step, plain SGD at 0.1 on the ps tasks.
The inputs are random, of the digits' shapes: what is watched is the
runtime, not the accuracy.

Like tfdist's soak, it samples every process each --interval (OS threads,
resident memory, open file descriptors from /proc) and prints, per task,
the figures at a tenth of the run and at its end, and the steps' times:
each step from the start of its function on a worker to the end of its
updates (tf.timestamp inside the step), and each chunk of 100 scheduled
steps from the first Schedule to Join. It counts the lines of TensorFlow's
repeated-request refusal ("received twice") in every task's log.

  ~/.cache/tfdist/tensorflow-venv-*/bin/python scripts/python_ps_soak.py --steps 15000
  ~/.cache/tfdist/tensorflow-venv-*/bin/python scripts/python_ps_soak.py --steps 1000000000 --seconds 1800

(the Python environment the tests install; any Python with TensorFlow 2.18
will do).
"""

import argparse
import json
import os
import socket
import subprocess
import sys
import threading
import time

HIDDEN, CLASSES, FEATURES, BATCH, LR, CHUNK = 64, 10, 64, 64, 0.1, 100


def free_ports(n):
    socks = [socket.socket() for _ in range(n)]
    for s in socks:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in socks]
    for s in socks:
        s.close()
    return ports


def serve(cluster, role, index):
    import tensorflow as tf

    server = tf.distribute.Server(tf.train.ClusterSpec(cluster), job_name=role, task_index=index,
                                  protocol="grpc", start=True)
    server.join()


def chief(cluster, steps, seconds, out):
    import numpy as np
    import tensorflow as tf

    resolver = tf.distribute.cluster_resolver.SimpleClusterResolver(
        tf.train.ClusterSpec(cluster), task_type="chief", task_id=0, rpc_layer="grpc")
    strategy = tf.distribute.ParameterServerStrategy(resolver)
    coordinator = tf.distribute.coordinator.ClusterCoordinator(strategy)
    rng = np.random.default_rng(1)
    with strategy.scope():
        w1 = tf.Variable(rng.normal(0, 0.1, (FEATURES, HIDDEN)).astype("float32"))
        b1 = tf.Variable(np.zeros(HIDDEN, "float32"))
        w2 = tf.Variable(rng.normal(0, 0.1, (HIDDEN, CLASSES)).astype("float32"))
        b2 = tf.Variable(np.zeros(CLASSES, "float32"))
    variables = [w1, b1, w2, b2]
    x = rng.normal(0, 1, (1797, FEATURES)).astype("float32")
    y = rng.integers(0, CLASSES, 1797).astype("int32")

    def dataset_fn():
        ds = tf.data.Dataset.from_tensor_slices((x, y)).shuffle(1797).repeat()
        return ds.batch(BATCH, drop_remainder=True)

    iterator = iter(coordinator.create_per_worker_dataset(dataset_fn))

    @tf.function
    def step(it):
        start = tf.timestamp()
        xb, yb = next(it)
        with tf.GradientTape() as tape:
            h = tf.nn.relu(tf.matmul(xb, w1) + b1)
            logits = tf.matmul(h, w2) + b2
            loss = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(yb, logits))
        grads = tape.gradient(loss, variables)
        updates = [v.assign_sub(LR * g) for v, g in zip(variables, grads)]
        with tf.control_dependencies(updates):
            return loss, tf.timestamp() - start

    step_ms, chunk_ms = [], []
    done = 0
    began = time.time()
    while done < steps and (seconds <= 0 or time.time() - began < seconds):
        n = min(CHUNK, steps - done)
        t0 = time.time()
        rvs = [coordinator.schedule(step, args=(iterator,)) for _ in range(n)]
        coordinator.join()
        chunk_ms.append((time.time() - t0) * 1000)
        step_ms.extend(float(rv.fetch()[1]) * 1000 for rv in rvs)
        done += n
    elapsed = time.time() - began
    with open(out, "w") as f:
        json.dump({"steps": done, "elapsed": elapsed, "step_ms": step_ms, "chunk_ms": chunk_ms}, f)


def sample(pid):
    try:
        with open(f"/proc/{pid}/status") as f:
            st = dict(line.split(":", 1) for line in f if ":" in line)
        return {"threads": int(st["Threads"]), "rss": int(st["VmRSS"].split()[0]) * 1024,
                "fds": len(os.listdir(f"/proc/{pid}/fd"))}
    except (FileNotFoundError, ProcessLookupError, KeyError):
        return None


def quantile(xs, q):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, max(0, int(q * len(xs) + 0.999999) - 1))]


def report(tasks, workers, samples, result, logs):
    print(f"python-ps: {result['steps']} steps in {result['elapsed']:.0f}s "
          f"({result['steps'] / result['elapsed']:.0f} steps/s)")
    steps = result["step_ms"][workers:]  # each worker's first step is warm-up
    med = quantile(steps, 0.5)
    print(f"steps: median {med:.2f} ms, 99% {quantile(steps, 0.99):.2f} ms, 99.9% {quantile(steps, 0.999):.2f} ms, "
          f"slowest {max(steps):.1f} ms ({max(steps) / med:.1f} times the median)")
    chunks = result["chunk_ms"][1:]
    cmed = quantile(chunks, 0.5)
    print(f"chunks of {CHUNK} steps: median {cmed:.0f} ms, slowest {max(chunks):.0f} ms ({max(chunks) / cmed:.1f} times the median)")
    print(f"{'task':>10} {'samples':>8} {'threads max':>12} {'RSS 1/10':>10} {'RSS end':>10} {'growth':>8} "
          f"{'fds 1/10':>9} {'fds end':>8} {'repeated-request refusals':>26}")
    for name in tasks:
        ss = [s for s in samples[name] if s[1] is not None]
        if not ss:
            continue
        first, last = ss[0][0], ss[-1][0]
        tenth = next(s for s in ss if s[0] >= first + (last - first) / 10)[1]
        end = ss[-1][1]
        print(f"{name:>10} {len(ss):>8} {max(s[1]['threads'] for s in ss):>12} {tenth['rss'] / 2**20:>8.1f}Mi "
              f"{end['rss'] / 2**20:>8.1f}Mi {100 * (end['rss'] / tenth['rss'] - 1):>+7.1f}% {tenth['fds']:>9} "
              f"{end['fds']:>8} {logs[name]:>26}")


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=50000)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--ps", type=int, default=1)
    p.add_argument("--seconds", type=float, default=0, help="stop scheduling after this long (0: run every step)")
    p.add_argument("--interval", type=float, default=1.0)
    p.add_argument("--role")
    p.add_argument("--index", type=int, default=0)
    p.add_argument("--cluster")
    p.add_argument("--out")
    a = p.parse_args()
    if a.role == "chief":
        return chief(json.loads(a.cluster), a.steps, a.seconds, a.out)
    if a.role:
        return serve(json.loads(a.cluster), a.role, a.index)

    ports = iter(free_ports(1 + a.workers + a.ps))
    cluster = {"chief": [f"127.0.0.1:{next(ports)}"],
               "worker": [f"127.0.0.1:{next(ports)}" for _ in range(a.workers)],
               "ps": [f"127.0.0.1:{next(ports)}" for _ in range(a.ps)]}
    out = f"/tmp/python_ps_soak_{os.getpid()}.json"
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="1", CUDA_VISIBLE_DEVICES="")
    procs, tasks, logs = {}, [], {}
    for role in ("ps", "worker", "chief"):
        for i in range(len(cluster[role])):
            name = f"{role}:{i}"
            tasks.append(name)
            logs[name] = open(f"/tmp/python_ps_soak_{os.getpid()}_{role}{i}.log", "w+")
            args = [sys.executable, __file__, "--role", role, "--index", str(i), "--cluster", json.dumps(cluster),
                    "--steps", str(a.steps), "--seconds", str(a.seconds), "--out", out]
            procs[name] = subprocess.Popen(args, env=env, stdout=logs[name], stderr=subprocess.STDOUT)
    samples = {name: [] for name in tasks}
    stop = threading.Event()

    def watch():
        start = time.time()
        while not stop.wait(a.interval):
            for name, proc in procs.items():
                samples[name].append((time.time() - start, sample(proc.pid)))

    threading.Thread(target=watch, daemon=True).start()
    code = procs["chief:0"].wait()
    stop.set()
    for name, proc in procs.items():
        if name != "chief:0":
            proc.kill()
            proc.wait()
    counts = {}
    for name, f in logs.items():
        f.seek(0)
        counts[name] = f.read().count("received twice")
        f.close()
    if code != 0:
        print(f"FAIL: the chief exited with {code}; its log: {logs['chief:0'].name}")
        return 1
    with open(out) as f:
        result = json.load(f)
    os.remove(out)
    report(tasks, a.workers, samples, result, counts)
    return 0


if __name__ == "__main__":
    sys.exit(main())
