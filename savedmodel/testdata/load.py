"""Loads a SavedModel the way Python users do and returns its predictions.

Reads {"dir": ..., "x": [[...], ...]} on stdin; prints {"logits": [[...]],
"cli": <saved_model_cli show --all output>, "signatures": [...]}.
"""
import json
import subprocess
import sys

import numpy as np
import tensorflow as tf

req = json.load(sys.stdin)
model = tf.saved_model.load(req["dir"])
serve = model.signatures["serving_default"]
out = serve(x=tf.constant(np.array(req["x"], dtype=np.float32)))
# saved_model_cli, run from its module: the console script's interpreter
# path is not reliable in a relocated virtual environment.
cli = subprocess.run(
    [sys.executable, "-c",
     "import sys; from tensorflow.python.tools.saved_model_cli import main; sys.argv[0] = 'saved_model_cli'; sys.exit(main())",
     "show", "--dir", req["dir"], "--all"],
    check=True, capture_output=True, text=True).stdout
json.dump({"logits": out["logits"].numpy().tolist(), "cli": cli,
           "signatures": sorted(model.signatures.keys())}, sys.stdout)
