//go:build !linux

package tfrt

// quietTensorFlow leaves TensorFlow's loggers alone where the library is
// not ELF.
func quietTensorFlow() error { return nil }
