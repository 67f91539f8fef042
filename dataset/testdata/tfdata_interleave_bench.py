"""Times tf.data reading and parsing many TFRecord files four at a time,
as BenchmarkInterleaveAgainstTFData does with tfdist's pipeline.

Reads from stdin a JSON object {"pattern": glob, "records": n, "passes":
p, "batch": b, "features": f}: files of tf.Examples with a float feature
"x" of f values and an int64 "y". Times p passes of each pipeline, each
sequential (num_parallel_calls=None) and with 4 parallel reads
(deterministic), alternating after a warm-up pass of each, and prints a
JSON object {"per_record": {"sequential": s, "parallel": s}, "batched":
{...}} of seconds per pass:

- per_record: list_files().interleave(lambda f:
  TFRecordDataset(f).map(parse_single_example), cycle_length=4,
  block_length=1).batch(b), the pipeline's usual form;
- batched: list_files().interleave(TFRecordDataset, cycle_length=4,
  block_length=1).batch(b).map(parse_example), tf.data's faster form,
  which parses whole batches.
"""
import json
import os
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
import tensorflow as tf  # noqa: E402


def pipelines(cfg):
    spec = {"x": tf.io.FixedLenFeature([cfg["features"]], tf.float32),
            "y": tf.io.FixedLenFeature([], tf.int64)}

    def files():
        return tf.data.Dataset.list_files(cfg["pattern"], shuffle=False)

    def interleave(fn, par):
        kw = {} if par is None else {"num_parallel_calls": par, "deterministic": True}
        return files().interleave(fn, cycle_length=4, block_length=1, **kw)

    def per_record(par):
        return interleave(lambda f: tf.data.TFRecordDataset(f).map(lambda r: tf.io.parse_single_example(r, spec)),
                          par).batch(cfg["batch"])

    def batched(par):
        return interleave(tf.data.TFRecordDataset, par).batch(cfg["batch"]).map(lambda r: tf.io.parse_example(r, spec))

    return {"per_record": per_record, "batched": batched}


def timed(ds, records):
    start, n = time.perf_counter(), 0
    for b in ds:
        n += int(b["y"].shape[0])
    if n != records:
        raise SystemExit(f"read {n} records, expected {records}")
    return time.perf_counter() - start


def main():
    cfg = json.load(sys.stdin)
    out = {}
    for name, make in pipelines(cfg).items():
        seq, par = make(None), make(4)
        timed(seq, cfg["records"])
        timed(par, cfg["records"])
        t = {"sequential": 0.0, "parallel": 0.0}
        for _ in range(cfg["passes"]):
            t["sequential"] += timed(seq, cfg["records"])
            t["parallel"] += timed(par, cfg["records"])
        out[name] = {k: v / cfg["passes"] for k, v in t.items()}
    json.dump(out, sys.stdout)


if __name__ == "__main__":
    main()
