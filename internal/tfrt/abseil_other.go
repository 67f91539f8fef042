//go:build !linux

package tfrt

// quietAbseil leaves Abseil's level alone where the library is not ELF.
func quietAbseil() error { return nil }
