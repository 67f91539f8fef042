package taskserver

import (
	"fmt"
	"io"
	"math"
	"reflect"
	"runtime"
	"slices"

	tf "github.com/wamuir/graft/tensorflow"
	typespb "github.com/wamuir/graft/tensorflow/core/framework/types_go_proto"

	"github.com/tfdist/tfdist/internal/graphutil"
	"github.com/tfdist/tfdist/internal/tfrt"
)

// A tensor on the wire is its name, its dtype, its rank and dimensions,
// and its contents: for a string tensor each element as a byte string,
// for another the length of its contents and the contents as
// (*tf.Tensor).WriteContentsTo writes them (the machine's byte order: the
// tasks of a job share an architecture).

// elemSizes holds the element size of the dtypes whose contents graft
// serializes.
var elemSizes = map[tf.DataType]int64{
	tf.Float: 4, tf.Double: 8, tf.Int32: 4, tf.Uint8: 1, tf.Int16: 2, tf.Int8: 1,
	tf.Complex64: 8, tf.Int64: 8, tf.Bool: 1, tf.Quint8: 1, tf.Qint32: 4, tf.Bfloat16: 2,
	tf.Qint16: 2, tf.Quint16: 2, tf.Uint16: 2, tf.Complex128: 16, tf.Half: 2,
	tf.Float8e5m2: 1, tf.Float8e4m3fn: 1, tf.Int4: 1, tf.Uint4: 1,
}

// maxRank is the largest rank TensorFlow allows.
const maxRank = 254

// maxEmptyStrings bounds the product of the non-zero dimensions of an
// empty string tensor, which Go values of its shape are made for.
const maxEmptyStrings = 1 << 20

// checkDType returns an error naming the tensor unless a tensor of dt can
// cross the wire.
func checkDType(name string, dt tf.DataType) error {
	if _, ok := elemSizes[dt]; ok || dt == tf.String {
		return nil
	}
	why := "graft cannot serialize its contents"
	if dt == tf.DataType(typespb.DataType_DT_RESOURCE) || dt == tf.DataType(typespb.DataType_DT_VARIANT) {
		why = "a handle means something only on its own task"
	}
	return fmt.Errorf("taskserver: tensor %q: dtype %s cannot cross tasks (%s)", name, graphutil.DTypeName(dt), why)
}

func (e *encoder) tensor(name string, t *tf.Tensor) error {
	if t == nil {
		return fmt.Errorf("taskserver: tensor %q: nil", name)
	}
	defer runtime.KeepAlive(t) // graft reads t's C memory after its last use of t
	dt := t.DataType()
	if err := checkDType(name, dt); err != nil {
		return err
	}
	shape := t.Shape()
	e.string(name)
	e.uvarint(uint64(dt))
	e.uvarint(uint64(len(shape)))
	for _, d := range shape {
		e.uvarint(uint64(d))
	}
	if dt == tf.String {
		for _, s := range flatStrings(reflect.ValueOf(t.Value()), nil) {
			e.string(s)
		}
		return nil
	}
	size := elemSizes[dt] * elements(shape)
	e.uvarint(uint64(size))
	n, err := t.WriteContentsTo(&e.buf)
	if err == nil && n != size {
		err = fmt.Errorf("%d bytes of contents, expected %d", n, size)
	}
	if err != nil {
		return fmt.Errorf("taskserver: tensor %q (%s %v): %w", name, graphutil.DTypeName(dt), shape, err)
	}
	return nil
}

func elements(shape []int64) int64 {
	n := int64(1)
	for _, d := range shape {
		n *= d
	}
	return n
}

// flatStrings appends the strings of v, a string or nested slices of
// them, in row-major order.
func flatStrings(v reflect.Value, out []string) []string {
	if v.Kind() == reflect.String {
		return append(out, v.String())
	}
	for i := range v.Len() {
		out = flatStrings(v.Index(i), out)
	}
	return out
}

func (d *decoder) tensor() (string, *tf.Tensor) {
	name := d.string("tensor name")
	dt := tf.DataType(d.uvarint("dtype"))
	rank := d.size("rank", 1)
	if d.err == nil && rank > maxRank {
		d.fail("tensor %q: rank %d, more than %d", name, rank, maxRank)
	}
	if d.err != nil {
		return "", nil
	}
	if err := checkDType(name, dt); err != nil {
		d.err = err
		return "", nil
	}
	var shape []int64 // nil for a scalar, as graft has it
	if rank > 0 {
		shape = make([]int64, rank)
	}
	n := int64(1)
	for i := range shape {
		dim := d.uvarint("dimension")
		if dim > math.MaxInt64 || (dim != 0 && n > math.MaxInt64/int64(dim)) {
			d.fail("tensor %q: dimension %d of %d overflows", name, i, dim)
			return "", nil
		}
		shape[i] = int64(dim)
		n *= int64(dim)
	}
	if d.err != nil {
		return "", nil
	}
	if dt == tf.String {
		return name, d.stringTensor(name, shape, n)
	}
	return name, d.contents(name, dt, shape, n)
}

// contents reads the contents of a tensor of n elements.
func (d *decoder) contents(name string, dt tf.DataType, shape []int64, n int64) *tf.Tensor {
	size := d.size("contents", 1)
	if d.err != nil {
		return nil
	}
	if n > math.MaxInt64/elemSizes[dt] || size != n*elemSizes[dt] {
		d.fail("tensor %q (%s %v): %d bytes of contents", name, graphutil.DTypeName(dt), shape, size)
		return nil
	}
	t, err := tfrt.ReadTensor(dt, shape, io.LimitReader(d.r, size))
	if err != nil {
		d.fail("tensor %q (%s %v): %v", name, graphutil.DTypeName(dt), shape, err)
		return nil
	}
	d.left -= size
	return t
}

func (d *decoder) stringTensor(name string, shape []int64, n int64) *tf.Tensor {
	if n > d.left {
		d.fail("tensor %q: %d strings, more than the %d bytes left hold", name, n, d.left)
		return nil
	}
	flat := make([]string, n)
	for i := range flat {
		flat[i] = d.string("string")
	}
	if d.err != nil {
		return nil
	}
	v, err := stringValue(shape, flat)
	if err == nil {
		var t *tf.Tensor
		if t, err = tf.NewTensor(v); err == nil {
			return t
		}
	}
	d.fail("tensor %q (string %v): %v", name, shape, err)
	return nil
}

// stringValue returns the Go value tf.NewTensor makes a string tensor of
// shape from, holding flat in row-major order. Slices give a value's
// shape only up to its first empty dimension: the dimensions after it are
// arrays'.
func stringValue(shape []int64, flat []string) (any, error) {
	if len(shape) == 0 {
		return flat[0], nil
	}
	z := slices.Index(shape, 0)
	if z < 0 {
		return nested(reflect.ValueOf(flat), shape).Interface(), nil
	}
	nonzero := int64(1)
	for _, d := range shape {
		nonzero *= max(d, 1)
		if nonzero > maxEmptyStrings {
			return nil, fmt.Errorf("an empty tensor of more than %d rows", maxEmptyStrings)
		}
	}
	typ := reflect.TypeOf("")
	for i := len(shape) - 1; i > z; i-- {
		typ = reflect.ArrayOf(int(shape[i]), typ)
	}
	v := reflect.MakeSlice(reflect.SliceOf(typ), 0, 0)
	for i := z - 1; i >= 0; i-- {
		outer := reflect.MakeSlice(reflect.SliceOf(v.Type()), int(shape[i]), int(shape[i]))
		for j := range outer.Len() {
			outer.Index(j).Set(v)
		}
		v = outer
	}
	return v.Interface(), nil
}

// nested returns flat as nested slices of shape, none of whose dimensions
// is 0.
func nested(flat reflect.Value, shape []int64) reflect.Value {
	if len(shape) == 1 {
		return flat
	}
	inner := int(elements(shape[1:]))
	var out reflect.Value
	for i := range int(shape[0]) {
		v := nested(flat.Slice(i*inner, (i+1)*inner), shape[1:])
		if i == 0 {
			out = reflect.MakeSlice(reflect.SliceOf(v.Type()), int(shape[0]), int(shape[0]))
		}
		out.Index(i).Set(v)
	}
	return out
}

// tensors writes named tensors.
func (e *encoder) tensors(names []string, ts []*tf.Tensor) error {
	if len(names) != len(ts) {
		return fmt.Errorf("taskserver: %d tensors for %d names", len(ts), len(names))
	}
	e.uvarint(uint64(len(ts)))
	for i, t := range ts {
		if err := e.tensor(names[i], t); err != nil {
			return err
		}
	}
	return nil
}

// tensorMap writes m's tensors, sorted by name.
func (e *encoder) tensorMap(m map[string]*tf.Tensor) error {
	names := make([]string, 0, len(m))
	for n := range m {
		names = append(names, n)
	}
	slices.Sort(names)
	ts := make([]*tf.Tensor, len(names))
	for i, n := range names {
		ts[i] = m[n]
	}
	return e.tensors(names, ts)
}

func (d *decoder) tensors() ([]string, []*tf.Tensor) {
	n := d.size("tensors", 3)
	names, ts := make([]string, n), make([]*tf.Tensor, n)
	for i := range ts {
		names[i], ts[i] = d.tensor()
	}
	return names, ts
}

func (d *decoder) tensorMap() map[string]*tf.Tensor {
	names, ts := d.tensors()
	m := make(map[string]*tf.Tensor, len(ts))
	for i, n := range names {
		if _, dup := m[n]; dup && d.err == nil {
			d.fail("tensor %q twice", n)
		}
		m[n] = ts[i]
	}
	return m
}
