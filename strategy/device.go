package strategy

import "github.com/tfdist/tfdist/internal/tfrt"

// LocalCPU returns the full name of this process's CPU device i.
func LocalCPU(i int) string {
	return tfrt.DeviceSpec{Job: "localhost", Replica: 0, Task: 0, Type: "CPU", Index: i}.String()
}
