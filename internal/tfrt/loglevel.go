package tfrt

// TensorFlow's C++ runtime logs INFO lines by default, such as "This
// TensorFlow binary is optimized to use available CPU instructions..."
// (cpu_feature_guard) when a process makes its first device. It drops the
// lines below the level in TF_CPP_MIN_LOG_LEVEL (0 keeps all, 1 drops INFO,
// 2 WARNING too, 3 ERROR too), which it reads once, at the first log
// statement it executes: usually when the program first makes a session
// or a server. So this package's init, which runs before main in every
// program that uses a strategy, sets the variable to 1 when the user has
// not set it; a value the user set, even empty, stays.
//
// It is set in the C environment only (setenv(3)), which TensorFlow reads:
// Go's os.Getenv and the environment of the processes a program starts stay
// the user's. tfdist launch gives its tasks the same default where the user
// set none, in their environment, where TensorFlow finds it even while its
// library loads.
//
// Where TensorFlow logged before (while it loaded, on a CPU for which it
// turns oneDNN on), and for the few lines it logs through a private copy
// of Abseil's logging, init then stores the level in those loggers
// themselves (quietTensorFlow).

// #include <stdlib.h>
//
// static void tfrt_default_log_level(void) {
// 	setenv("TF_CPP_MIN_LOG_LEVEL", "1", 0); // 0: keep a value already set
// }
import "C"

func init() {
	C.tfrt_default_log_level()
	_ = quietTensorFlow() // where it fails, TensorFlow's INFO lines print, as before
}
