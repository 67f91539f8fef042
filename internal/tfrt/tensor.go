package tfrt

// #include "tensorflow/c/c_api.h"
import "C"

import (
	"fmt"
	"io"
	"reflect"
	"runtime"
	"unsafe"

	tf "github.com/wamuir/graft/tensorflow"
)

// carriers maps the dtypes graft can serialize but has no Go type for, on
// which its tf.ReadTensor panics, to a dtype of the same element size that
// it reads.
var carriers = map[tf.DataType]tf.DataType{
	tf.Half: tf.Uint16, tf.Bfloat16: tf.Uint16, tf.Qint16: tf.Int16, tf.Quint16: tf.Uint16,
	tf.Qint32: tf.Int32, tf.Quint8: tf.Uint8, tf.Float8e5m2: tf.Uint8, tf.Float8e4m3fn: tf.Uint8,
	tf.Int4: tf.Int8, tf.Uint4: tf.Uint8,
}

// ReadTensor is tf.ReadTensor for every dtype whose contents graft
// serializes (see (*tf.Tensor).WriteContentsTo): a dtype graft has no Go
// type for (half, bfloat16, …) is read as the unsigned or signed integers
// of its size, and the tensor then takes its dtype in place, as a Bitcast
// would.
func ReadTensor(dt tf.DataType, shape []int64, r io.Reader) (*tf.Tensor, error) {
	carrier, ok := carriers[dt]
	if !ok {
		return tf.ReadTensor(dt, shape, r)
	}
	t, err := tf.ReadTensor(carrier, shape, r)
	if err != nil {
		return nil, err
	}
	c, err := cTensor(t)
	if err != nil {
		return nil, err
	}
	var dims *C.int64_t
	if len(shape) > 0 {
		dims = (*C.int64_t)(unsafe.Pointer(&shape[0]))
	}
	status := C.TF_NewStatus()
	defer C.TF_DeleteStatus(status)
	C.TF_TensorBitcastFrom(c, C.TF_DataType(dt), c, dims, C.int(len(shape)), status)
	runtime.KeepAlive(t)
	if code := Code(C.TF_GetCode(status)); code != OK {
		return nil, &Error{Code: code, Op: fmt.Sprintf("read a tensor of dtype %d", dt), Msg: C.GoString(C.TF_Message(status))}
	}
	return t, nil
}

// cTensor returns the C tensor of t, which graft keeps in t's unexported
// field c, as cSession reads a session's.
func cTensor(t *tf.Tensor) (*C.TF_Tensor, error) {
	f := reflect.ValueOf(t).Elem().FieldByName("c")
	if !f.IsValid() || f.Kind() != reflect.Pointer || f.Type().Elem().Name() != "_Ctype_struct_TF_Tensor" {
		return nil, &Error{Code: Internal, Op: "read a tensor",
			Msg: "graft's tf.Tensor no longer keeps its *C.TF_Tensor in its field c (graft v0.10.0 does): update internal/tfrt/tensor.go"}
	}
	return (*C.TF_Tensor)(unsafe.Pointer(f.Pointer())), nil
}
