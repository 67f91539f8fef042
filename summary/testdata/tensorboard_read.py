"""Reads a log directory with TensorBoard's own event-file machinery and
prints what TensorBoard would show, as JSON, for TestTensorBoardReadsEventFiles.

Usage: python tensorboard_read.py LOGDIR

Output: {"file_versions": [...], "scalars": {tag: [[step, value, wall_time], ...]},
"graph_nodes": [name, ...] (the graph's node names; [] without a graph)}
"""
import json
import os
import sys

from tensorboard.backend.event_processing import event_file_loader
from tensorboard.backend.event_processing import plugin_event_accumulator
from tensorboard.util import tensor_util


def main(logdir):
    # The raw events of every file, as TensorBoard's loader reads them.
    versions = []
    for name in sorted(os.listdir(logdir)):
        if "tfevents" not in name:
            continue
        loader = event_file_loader.LegacyEventFileLoader(os.path.join(logdir, name))
        events = list(loader.Load())
        if events and events[0].HasField("file_version"):
            versions.append(events[0].file_version)
    # What the scalars plugin serves: the accumulator migrates simple_value
    # summaries to tensors, as it does for every run TensorBoard loads.
    acc = plugin_event_accumulator.EventAccumulator(logdir, size_guidance={"tensors": 0})
    acc.Reload()
    scalars = {}
    for tag in acc.Tags()["tensors"]:
        meta = acc.SummaryMetadata(tag)
        if meta.plugin_data.plugin_name != "scalars":
            continue
        scalars[tag] = [
            [e.step, float(tensor_util.make_ndarray(e.tensor_proto)), e.wall_time]
            for e in acc.Tensors(tag)
        ]
    # What the graphs plugin serves.
    nodes = [n.name for n in acc.Graph().node] if acc.Tags()["graph"] else []
    json.dump({"file_versions": versions, "scalars": scalars, "graph_nodes": nodes}, sys.stdout)


if __name__ == "__main__":
    main(sys.argv[1])
