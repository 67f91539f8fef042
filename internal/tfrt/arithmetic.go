package tfrt

// #cgo LDFLAGS: -ldl
// #define _GNU_SOURCE
// #include <dlfcn.h>
// #include <stdbool.h>
//
// // tfrt_onednn returns tensorflow::IsMKLEnabled(): whether TensorFlow
// // runs oneDNN's kernels in place of its own CPU kernels, which it
// // decides once, from TF_ENABLE_ONEDNN_OPTS, when its libraries load.
// // 0 when the loaded libraries lack the function (a build without
// // oneDNN).
// static int tfrt_onednn(void) {
// 	bool (*f)(void) = (bool (*)(void))dlsym(RTLD_DEFAULT, "_ZN10tensorflow12IsMKLEnabledEv");
// 	return f != NULL && f();
// }
import "C"

import (
	"fmt"
	"runtime"
	"strings"

	"golang.org/x/sys/cpu"
)

// Arithmetic is what in a process, besides its program, data and
// topology, decides the bits its CPU kernels compute: two processes that
// differ in any of it may compute the same step with other roundings.
type Arithmetic struct {
	// TensorFlow is the loaded libraries' version.
	TensorFlow string
	// IntraOpThreads is the size of the intra-op pool: some kernels split
	// a sum among its threads.
	IntraOpThreads int
	// OneDNN reports whether oneDNN's kernels replace TensorFlow's own
	// (TF_ENABLE_ONEDNN_OPTS, read when TensorFlow loads).
	OneDNN bool
	// CPU names the architecture and the vector extensions that
	// oneDNN's code chooses its kernels by, e.g. "amd64 avx2 fma avx512".
	CPU string
}

// LocalArithmetic returns this process's Arithmetic, with intraOp as its
// intra-op pool's size.
func LocalArithmetic(intraOp int) Arithmetic {
	return Arithmetic{TensorFlow: Version(), IntraOpThreads: intraOp, OneDNN: C.tfrt_onednn() != 0, CPU: cpuExtensions()}
}

// cpuExtensions names the architecture and the vector extensions that
// decide which of oneDNN's kernels run on float32: AVX2 with FMA, and
// AVX-512's core (F, BW, DQ and VL); SVE on arm64.
func cpuExtensions() string {
	ext := []string{runtime.GOARCH}
	switch runtime.GOARCH {
	case "amd64", "386":
		for _, f := range []struct {
			name string
			has  bool
		}{
			{"avx2", cpu.X86.HasAVX2},
			{"fma", cpu.X86.HasFMA},
			{"avx512", cpu.X86.HasAVX512F && cpu.X86.HasAVX512BW && cpu.X86.HasAVX512DQ && cpu.X86.HasAVX512VL},
		} {
			if f.has {
				ext = append(ext, f.name)
			}
		}
	case "arm64":
		if cpu.ARM64.HasSVE {
			ext = append(ext, "sve")
		}
	}
	return strings.Join(ext, " ")
}

// Match returns nil when a, process aName's, and b, process bName's,
// are alike, else an error naming the first field they differ in, what
// each has, and what would make them agree.
func (a Arithmetic) Match(b Arithmetic, aName, bName string) error {
	var field, av, bv, fix string
	switch {
	case a.TensorFlow != b.TensorFlow:
		field, av, bv, fix = "TensorFlow", a.TensorFlow, b.TensorFlow, "load one TensorFlow build in every process"
	case a.IntraOpThreads != b.IntraOpThreads:
		field, av, bv = "intra-op threads", fmt.Sprint(a.IntraOpThreads), fmt.Sprint(b.IntraOpThreads)
		fix = "set one count in every process: TF_NUM_INTRAOP_THREADS, or WithThreads"
	case a.OneDNN != b.OneDNN:
		field, av, bv = "oneDNN's kernels", onOff(a.OneDNN), onOff(b.OneDNN)
		fix = "set TF_ENABLE_ONEDNN_OPTS to one value, 0 or 1, in every process's environment"
	case a.CPU != b.CPU:
		field, av, bv, fix = "CPU", a.CPU, b.CPU, "run every process on machines of one instruction set"
	default:
		return nil
	}
	return fmt.Errorf("%s: %s has %s and %s has %s, so their kernels may round one step otherwise; %s",
		field, aName, av, bName, bv, fix)
}

func onOff(on bool) string {
	if on {
		return "on"
	}
	return "off"
}
