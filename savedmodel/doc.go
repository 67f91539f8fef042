// Package savedmodel exports a model trained by any tfdist strategy as a
// TensorFlow SavedModel, the format TensorFlow Serving, Python's
// tf.saved_model.load, saved_model_cli and graft's LoadSavedModel read.
//
// # What Export writes
//
// Export builds an inference graph from the same model code the training
// steps use: each Signature's function is a strategy.ReplicaFn, called once
// with a Replica of one replica whose Read gives the exported value of a
// variable, and with the signature's inputs as placeholders. Its outputs
// are the signature's outputs. The directory then holds:
//
//	saved_model.pb            a SavedModel with one MetaGraphDef tagged "serve"
//	variables/variables.index      the variables the signatures read,
//	variables/variables.data-00000-of-00001   in TensorFlow's checkpoint V2 format
//
// The MetaGraphDef carries a SaverDef whose restore op loads the variables,
// and one SignatureDef per Signature (method tensorflow/serving/predict),
// "serving_default" being the one serving tools call when none is named.
// Each variable is one resource variable named by its tfdist name, holding
// one copy of its value however the strategy held it: the primary copy of
// a mirrored variable, the aggregate of an OnRead one, the shards of a
// parameter-server variable joined. The graph names no device, so a server
// places it on its own GPUs or CPUs.
//
// The MetaGraphDef is in TensorFlow 1's form (a graph, a saver and
// signatures, no object graph), which every loader accepts:
//
//	m = tf.saved_model.load("/models/digits/1")
//	m.signatures["serving_default"](x=tf.constant(batch))["logits"]
//
// tf.saved_model.load gives an object with the signatures (and no Python
// attributes of the model); Keras' load_model, which needs Keras' own
// metadata, does not apply.
//
// # Versions and atomicity
//
// WithVersion and WithNextVersion write TensorFlow Serving's model layout,
// <dir>/<version>/, so that a server watching <dir> picks up each new
// version. An export is written into a temporary directory beside its
// target and renamed into place once every file is synced: a server never
// sees half an export, and a failed export leaves nothing behind. Export
// refuses a target that exists and is not empty, as TensorFlow's
// SavedModelBuilder does, so no export replaces one already written.
//
// # Under each strategy
//
// Export reads the variables through the strategy's Value. Under
// MultiWorkerMirrored every worker calls it (an OnRead variable's value is
// an all-reduce) and only the chief writes: a worker other than the chief
// reads without writing, with no option, by the rule checkpoint.NewManager
// follows (WithChief overrides it). The parameter-server strategy exports
// from the chief, which reads the shards from the ps tasks.
package savedmodel
