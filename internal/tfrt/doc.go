// Package tfrt is tfdist's thin layer over the parts of TensorFlow's C API
// that the graft bindings do not wrap: the in-process distributed runtime
// server (TF_NewServer and friends), sessions whose runs a context bounds
// (Session), tensors of the dtypes graft cannot read (ReadTensor),
// ConfigProto builders, device listing and the mapping of TensorFlow
// status codes onto Go errors. It imports no other package of
// tfdist.
//
// It links against libtensorflow (TensorFlow 2.18); scripts/libtensorflow.sh
// installs it and prints the CGO_CFLAGS and CGO_LDFLAGS to build with.
// tfdist's TensorFlow ops and kernels, which also use cgo, live in
// internal/engineops.
package tfrt
