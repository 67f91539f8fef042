package collective

import (
	"math"
	"math/rand/v2"
)

var allDTypes = []DType{Float32, Float64, Float16, BFloat16, Int32, Int64, Int8}
var allReductions = []Reduction{Sum, Mean, Min, Max}

// randomBuffer returns n random elements of dt: integers over their whole
// range (sums wrap), floats of moderate magnitude.
func randomBuffer(rng *rand.Rand, dt DType, n int) []byte {
	b := make([]byte, n*dt.Size())
	for i := range n {
		switch dt {
		case Float32:
			view[float32](b)[i] = float32(rng.NormFloat64() * 100)
		case Float64:
			view[float64](b)[i] = rng.NormFloat64() * 100
		case Float16:
			view[uint16](b)[i] = f32ToF16(float32(rng.NormFloat64() * 4))
		case BFloat16:
			view[uint16](b)[i] = f32ToBF16(float32(rng.NormFloat64() * 4))
		case Int32:
			view[int32](b)[i] = int32(rng.Uint32())
		case Int64:
			view[int64](b)[i] = int64(rng.Uint64())
		case Int8:
			view[int8](b)[i] = int8(rng.Uint32())
		}
	}
	return b
}

// floats decodes a float buffer exactly.
func floats(dt DType, b []byte) []float64 {
	out := make([]float64, len(b)/dt.Size())
	for i := range out {
		switch dt {
		case Float32:
			out[i] = float64(view[float32](b)[i])
		case Float64:
			out[i] = view[float64](b)[i]
		case Float16:
			out[i] = float64(f16ToF32(view[uint16](b)[i]))
		case BFloat16:
			out[i] = float64(bf16ToF32(view[uint16](b)[i]))
		}
	}
	return out
}

// epsilon is the unit roundoff of a float dtype.
func epsilon(dt DType) float64 {
	switch dt {
	case Float32:
		return 1.0 / (1 << 24)
	case Float64:
		return 1.0 / (1 << 53)
	case Float16:
		return 1.0 / (1 << 11)
	}
	return 1.0 / (1 << 8)
}

// intReference reduces integer inputs exactly, wrapping like the engine.
func intReference[T int8 | int32 | int64](red Reduction, ins [][]T) []T {
	out := append([]T(nil), ins[0]...)
	for _, in := range ins[1:] {
		for i, v := range in {
			switch red {
			case Sum, Mean:
				out[i] += v
			case Min:
				out[i] = min(out[i], v)
			case Max:
				out[i] = max(out[i], v)
			}
		}
	}
	if red == Mean {
		for i := range out {
			out[i] /= T(len(ins))
		}
	}
	return out
}

// floatReference reduces float inputs in float64 and returns the result
// and the error bound of a sum computed in dt.
func floatReference(dt DType, red Reduction, ins [][]float64) (want, tol []float64) {
	n := len(ins)
	want, tol = make([]float64, len(ins[0])), make([]float64, len(ins[0]))
	for i := range want {
		acc, abs := ins[0][i], math.Abs(ins[0][i])
		for _, in := range ins[1:] {
			abs += math.Abs(in[i])
			switch red {
			case Sum, Mean:
				acc += in[i]
			case Min:
				acc = math.Min(acc, in[i])
			case Max:
				acc = math.Max(acc, in[i])
			}
		}
		if red == Mean {
			acc /= float64(n)
			abs /= float64(n)
		}
		want[i] = acc
		if red == Sum || red == Mean {
			tol[i] = float64(n+2) * epsilon(dt) * abs
		}
	}
	return want, tol
}
