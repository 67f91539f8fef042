package tfrt

// #include "tensorflow/c/c_api.h"
import "C"

import (
	"reflect"
	"runtime"
)

// graftStatus is the type of graft's session errors: a TF_Status, whose
// code graft does not expose.
const graftStatus = "github.com/wamuir/graft/tensorflow.statusError"

// ClassifyStatus is Classify for the error of a local session's run: the
// code is its status's own, read from graft's TF_Status, unless that is
// UNKNOWN (its message then says more). The distributed runtime's errors
// stay with Classify, whose inference the strategies branch on.
func ClassifyStatus(op string, err error) error {
	if code, ok := statusCode(err); ok && code != Unknown {
		return &Error{Code: code, Op: op, Msg: err.Error()}
	}
	return Classify(op, err)
}

// statusCode returns the TensorFlow status code of err when it is one of
// graft's status errors, read from its TF_Status; false for any other
// error (were graft's layout to change, TestGraftStatusCodes fails).
func statusCode(err error) (Code, bool) {
	v := reflect.ValueOf(err)
	if v.Kind() != reflect.Pointer || v.IsNil() {
		return 0, false
	}
	e := v.Elem()
	if e.Kind() != reflect.Struct || e.Type().PkgPath()+"."+e.Type().Name() != graftStatus || e.NumField() != 1 ||
		e.Field(0).Kind() != reflect.Pointer {
		return 0, false
	}
	c := Code(C.TF_GetCode((*C.TF_Status)(e.Field(0).UnsafePointer())))
	runtime.KeepAlive(err) // its finalizer frees the TF_Status
	return c, c != OK
}
