package tfrt

// #cgo LDFLAGS: -ldl
// #define _GNU_SOURCE
// #include <dlfcn.h>
// #include <stdbool.h>
//
// // tfrt_enable_op_determinism calls tsl::EnableOpDeterminism(true), which
// // libtensorflow_framework exports but the C API does not; 0 when the
// // loaded libraries lack it.
// static int tfrt_enable_op_determinism(void) {
// 	void (*f)(bool) = (void (*)(bool))dlsym(RTLD_DEFAULT, "_ZN3tsl19EnableOpDeterminismEb");
// 	if (f == NULL) return 0;
// 	f(true);
// 	return 1;
// }
//
// // tfrt_op_determinism returns tsl::OpDeterminismRequired(), or 0 when
// // the loaded libraries lack it.
// static int tfrt_op_determinism(void) {
// 	bool (*f)(void) = (bool (*)(void))dlsym(RTLD_DEFAULT, "_ZN3tsl21OpDeterminismRequiredEv");
// 	return f != NULL && f();
// }
import "C"

import "errors"

// EnableOpDeterminism turns on TensorFlow's op determinism for the whole
// process, as Python's tf.config.experimental.enable_op_determinism does:
// kernels with no deterministic implementation (GPU kernels, mostly)
// fail when they run instead of adding in an order their scheduling
// chooses. It cannot be turned off.
func EnableOpDeterminism() error {
	if C.tfrt_enable_op_determinism() == 0 {
		return errors.New("tfrt: the loaded TensorFlow libraries lack tsl::EnableOpDeterminism")
	}
	return nil
}

// OpDeterminism reports whether TensorFlow's op determinism is on: set by
// EnableOpDeterminism or by TF_DETERMINISTIC_OPS in the environment.
func OpDeterminism() bool { return C.tfrt_op_determinism() != 0 }
