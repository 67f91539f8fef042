package dataset

import (
	"bytes"
	"fmt"
	"net"
	"reflect"
	"runtime"
	"slices"
	"unsafe"

	tf "github.com/wamuir/graft/tensorflow"

	"github.com/tfdist/tfdist/internal/graphutil"
	"github.com/tfdist/tfdist/internal/tensorutil"
)

// A column is one named value of an element, held on the host. Pipelines
// keep values as flat, row-major Go slices (a batch of large rows as the
// rows themselves: pieces) and create TensorFlow tensors only when an
// element leaves the pipeline (Iterator.Next, or the per-replica split of
// Distribute), so that a value crosses into TensorFlow's memory exactly
// once, and is copied only then.
//
// A column is immutable once built: its shape and data may be shared by many
// elements (views of one FromSlices array, or the shape of a feature spec).
type column struct {
	dtype tf.DataType
	shape []int64    // full shape; empty for a scalar
	data  any        // flat row-major slice of the dtype's Go type, or pieces of it; nil when t holds the value
	t     *tf.Tensor // set when the value came from a caller's tensor
}

// pieces is flat data held as consecutive parts, each a flat slice of the
// dtype's Go type: the rows a batch was stacked from, joined only where flat
// data is needed. A batch that goes straight into tensors (Iterator.Next, or
// the per-replica split of Distribute) is then copied once, from its rows
// into TensorFlow's memory, without a Go array of its own.
type pieces struct {
	parts []any
	n     int // elements in all
}

// minPieceBytes is the smallest row that a batch keeps as a piece rather
// than copy into one array: copying smaller rows costs less than keeping
// track of them.
const minPieceBytes = 256

// joinRows returns parts, each flat data or pieces of rows of rowSize
// elements, as one value of n elements: pieces sharing the parts' memory,
// or one flat copy when rows are small.
func joinRows(k kind, parts []any, n, rowSize int) any {
	if rowSize*k.size() < minPieceBytes {
		return k.concat(parts, n)
	}
	return joinPieces(parts, n)
}

// joinPieces returns the pieces of the parts in order, each part flat data
// or pieces, n elements in all.
func joinPieces(parts []any, n int) pieces {
	out := make([]any, 0, len(parts))
	for _, p := range parts {
		if ps, ok := p.(pieces); ok {
			out = append(out, ps.parts...)
		} else {
			out = append(out, p)
		}
	}
	return pieces{out, n}
}

// elemType lists the Go element types a host column can hold.
type elemType interface {
	float32 | float64 | int32 | int64 | uint8 | int8 | int16 | uint16 | uint32 | uint64 | bool | string
}

// kind implements the operations on the data of one dtype: flat slices,
// and pieces where the operation says so.
type kind interface {
	goType() reflect.Type
	size() int // bytes of an element in memory
	makeSlice(capacity int) any
	concat(parts []any, total int) any
	flat(data any) any
	sliceData(data any, lo, hi int) any
	gatherRows(data any, rows []int, rowSize int) any
	toTensor(data any, shape []int64) (*tf.Tensor, error)
	fromTensor(t *tf.Tensor) (any, error)
	padded(datas []any, shapes [][]int64, target []int64, fill any) (any, error)
}

type kindOf[T elemType] struct {
	dt tf.DataType
	// raw reports that graft can copy the Go memory of a []T in and out of a
	// tensor as is (tf.ReadTensor, Tensor.WriteContentsTo).
	raw bool
}

func (kindOf[T]) goType() reflect.Type       { return reflect.TypeFor[T]() }
func (kindOf[T]) makeSlice(capacity int) any { return make([]T, 0, capacity) }
func (kindOf[T]) size() int {
	var zero T
	return int(unsafe.Sizeof(zero))
}

// concat joins parts, each flat data or pieces, into one flat slice.
func (k kindOf[T]) concat(parts []any, total int) any {
	out := make([]T, 0, total)
	for _, p := range parts {
		if ps, ok := p.(pieces); ok {
			for _, q := range ps.parts {
				out = append(out, q.([]T)...)
			}
			continue
		}
		out = append(out, p.([]T)...)
	}
	return out
}

// flat returns data as one flat slice, joining pieces.
func (k kindOf[T]) flat(data any) any {
	if p, ok := data.(pieces); ok {
		return k.concat(p.parts, p.n)
	}
	return data
}

// sliceData returns elements [lo, hi) of data, sharing its memory: flat
// data when they lie in one part, else pieces.
func (kindOf[T]) sliceData(data any, lo, hi int) any {
	p, ok := data.(pieces)
	if !ok {
		return data.([]T)[lo:hi:hi]
	}
	if lo == hi {
		return []T{}
	}
	var out []any
	start := 0
	for _, part := range p.parts {
		s := part.([]T)
		end := start + len(s)
		if end > lo && start < hi {
			a, b := max(lo, start)-start, min(hi, end)-start
			out = append(out, s[a:b:b])
		}
		if end >= hi {
			break
		}
		start = end
	}
	if len(out) == 1 {
		return out[0]
	}
	return pieces{out, hi - lo}
}

func (k kindOf[T]) gatherRows(data any, rows []int, rowSize int) any {
	src := k.flat(data).([]T)
	out := make([]T, 0, len(rows)*rowSize)
	for _, r := range rows {
		out = append(out, src[r*rowSize:(r+1)*rowSize]...)
	}
	return out
}

func (k kindOf[T]) toTensor(data any, shape []int64) (*tf.Tensor, error) {
	shape = slices.Clone(shape)
	if p, ok := data.(pieces); ok && k.raw {
		bufs := make(net.Buffers, len(p.parts))
		for i, part := range p.parts {
			bufs[i] = memoryOf(part.([]T))
		}
		return tf.ReadTensor(k.dt, shape, &bufs)
	}
	s := k.flat(data).([]T)
	if k.raw {
		return tf.ReadTensor(k.dt, shape, bytes.NewReader(memoryOf(s)))
	}
	if len(shape) == 0 {
		return tf.NewTensor(s[0])
	}
	t, err := tf.NewTensor(s)
	if err != nil {
		return nil, err
	}
	if len(shape) > 1 {
		if err := t.Reshape(shape); err != nil {
			return nil, err
		}
	}
	return t, nil
}

func (k kindOf[T]) fromTensor(t *tf.Tensor) (any, error) {
	// Tensor.Value and WriteContentsTo read the tensor's C memory after
	// their last use of t: without this, its finalizer may free that memory
	// while they read it.
	defer runtime.KeepAlive(t)
	n := int(numElements(t.Shape()))
	if k.raw {
		out := make([]T, n)
		b := memoryOf(out)
		w := fixedWriter{buf: b}
		if _, err := t.WriteContentsTo(&w); err != nil {
			return nil, err
		}
		if w.n != len(b) {
			return nil, fmt.Errorf("tensor holds %d bytes, expected %d", w.n, len(b))
		}
		return out, nil
	}
	out := make([]T, 0, n)
	return flatten(reflect.ValueOf(t.Value()), out), nil
}

// flatten appends the leaves of v (a T or nested slices of T) to out.
func flatten[T elemType](v reflect.Value, out []T) []T {
	if v.Kind() != reflect.Slice && v.Kind() != reflect.Array {
		return append(out, v.Interface().(T))
	}
	if v.Type().Elem().Kind() != reflect.Slice && v.Type().Elem().Kind() != reflect.Array {
		n := v.Len()
		out = slices.Grow(out, n)
		reflect.Copy(reflect.ValueOf(out[len(out):len(out)+n]), v)
		return out[:len(out)+n]
	}
	for i := range v.Len() {
		out = flatten(v.Index(i), out)
	}
	return out
}

// memoryOf returns the memory of s's elements as bytes, in the host's
// byte order, sharing it.
func memoryOf[T any](s []T) []byte {
	var zero T
	return unsafe.Slice((*byte)(unsafe.Pointer(unsafe.SliceData(s))), len(s)*int(unsafe.Sizeof(zero)))
}

// fixedWriter writes into a fixed buffer.
type fixedWriter struct {
	buf []byte
	n   int
}

func (w *fixedWriter) Write(p []byte) (int, error) {
	if len(p) > len(w.buf)-w.n {
		return 0, fmt.Errorf("tensor data larger than its shape")
	}
	w.n += copy(w.buf[w.n:], p)
	return len(p), nil
}

var kinds = map[tf.DataType]kind{
	tf.Float:  kindOf[float32]{tf.Float, true},
	tf.Double: kindOf[float64]{tf.Double, true},
	tf.Int32:  kindOf[int32]{tf.Int32, true},
	tf.Int64:  kindOf[int64]{tf.Int64, true},
	tf.Uint8:  kindOf[uint8]{tf.Uint8, true},
	tf.Int8:   kindOf[int8]{tf.Int8, true},
	tf.Int16:  kindOf[int16]{tf.Int16, true},
	tf.Uint16: kindOf[uint16]{tf.Uint16, true},
	tf.Uint32: kindOf[uint32]{tf.Uint32, false},
	tf.Uint64: kindOf[uint64]{tf.Uint64, false},
	tf.Bool:   kindOf[bool]{tf.Bool, true},
	tf.String: kindOf[string]{tf.String, false},
}

// kindsByGoType maps a Go element type to its dtype.
var kindsByGoType = func() map[reflect.Type]tf.DataType {
	m := make(map[reflect.Type]tf.DataType, len(kinds))
	for dt, k := range kinds {
		m[k.goType()] = dt
	}
	return m
}()

func kindFor(dt tf.DataType) (kind, error) {
	k, ok := kinds[dt]
	if !ok {
		return nil, fmt.Errorf("%w: dtype %s (supported: float32, float64, int8/16/32/64, uint8/16/32/64, bool, string)", ErrUnsupportedType, graphutil.DTypeName(dt))
	}
	return k, nil
}

func numElements(shape []int64) int64 { return tensorutil.NumElements(shape) }

// hostData returns the column's flat data, reading it out of its tensor if
// need be (without changing c, which may be shared).
func (c column) hostData() (any, error) {
	d, err := c.view()
	if p, ok := d.(pieces); ok && err == nil {
		return kinds[c.dtype].concat(p.parts, p.n), nil
	}
	return d, err
}

// view is hostData that may return pieces, for the operations that take
// them (sliceData, concat, toTensor): rows and batches of a batch share its
// parts.
func (c column) view() (any, error) {
	if c.data != nil {
		return c.data, nil
	}
	if c.t == nil {
		return nil, fmt.Errorf("column holds no value")
	}
	k, err := kindFor(c.dtype)
	if err != nil {
		return nil, err
	}
	return k.fromTensor(c.t)
}

// hostBytes returns about how much memory the column's values take on
// the host: their bytes, and for strings their contents.
func (c column) hostBytes() int {
	k, err := kindFor(c.dtype)
	if err != nil {
		return 0
	}
	n := int(numElements(c.shape)) * k.size()
	if c.dtype != tf.String || c.data == nil {
		return n
	}
	parts := []any{c.data}
	if p, ok := c.data.(pieces); ok {
		parts = p.parts
	}
	for _, part := range parts {
		for _, s := range part.([]string) {
			n += len(s)
		}
	}
	return n
}

// host returns c with its data on the host.
func (c column) host() (column, error) {
	d, err := c.hostData()
	if err != nil {
		return column{}, err
	}
	return column{dtype: c.dtype, shape: c.shape, data: d}, nil
}

// tensor returns the column as a tensor, creating one from host data.
func (c column) tensor() (*tf.Tensor, error) {
	if c.t != nil {
		return c.t, nil
	}
	k, err := kindFor(c.dtype)
	if err != nil {
		return nil, err
	}
	return k.toTensor(c.data, c.shape)
}

// columnFromTensor wraps a caller's tensor.
func columnFromTensor(t *tf.Tensor) (column, error) {
	if _, err := kindFor(t.DataType()); err != nil {
		return column{}, err
	}
	return column{dtype: t.DataType(), shape: t.Shape(), t: t}, nil
}

// columnFromGo builds a column from a Go value: a scalar, a slice or an
// array, nested to any depth with every inner slice of the same length.
func columnFromGo(v any) (column, error) {
	if t, ok := v.(*tf.Tensor); ok {
		if t == nil {
			return column{}, fmt.Errorf("nil tensor")
		}
		c, err := columnFromTensor(t)
		if err != nil {
			return column{}, err
		}
		return c.host()
	}
	rv := reflect.ValueOf(v)
	if !rv.IsValid() {
		return column{}, fmt.Errorf("%w: nil value", ErrUnsupportedType)
	}
	var shape []int64
	typ := rv.Type()
	for typ.Kind() == reflect.Slice || typ.Kind() == reflect.Array {
		typ = typ.Elem()
	}
	dt, ok := kindsByGoType[typ]
	if !ok {
		return column{}, fmt.Errorf("%w: Go type %v (element type %v)", ErrUnsupportedType, rv.Type(), typ)
	}
	// The shape: the length at each depth, checked to be rectangular.
	for t, cur := rv.Type(), rv; t.Kind() == reflect.Slice || t.Kind() == reflect.Array; t = t.Elem() {
		shape = append(shape, int64(cur.Len()))
		if cur.Len() > 0 {
			cur = cur.Index(0)
		}
	}
	if err := checkRect(rv, shape, 0); err != nil {
		return column{}, err
	}
	k := kinds[dt]
	var data any
	switch kk := k.(type) {
	case kindOf[float32]:
		data = flatten(rv, make([]float32, 0, numElements(shape)))
	case kindOf[float64]:
		data = flatten(rv, make([]float64, 0, numElements(shape)))
	case kindOf[int32]:
		data = flatten(rv, make([]int32, 0, numElements(shape)))
	case kindOf[int64]:
		data = flatten(rv, make([]int64, 0, numElements(shape)))
	case kindOf[uint8]:
		data = flatten(rv, make([]uint8, 0, numElements(shape)))
	case kindOf[int8]:
		data = flatten(rv, make([]int8, 0, numElements(shape)))
	case kindOf[int16]:
		data = flatten(rv, make([]int16, 0, numElements(shape)))
	case kindOf[uint16]:
		data = flatten(rv, make([]uint16, 0, numElements(shape)))
	case kindOf[uint32]:
		data = flatten(rv, make([]uint32, 0, numElements(shape)))
	case kindOf[uint64]:
		data = flatten(rv, make([]uint64, 0, numElements(shape)))
	case kindOf[bool]:
		data = flatten(rv, make([]bool, 0, numElements(shape)))
	case kindOf[string]:
		data = flatten(rv, make([]string, 0, numElements(shape)))
	default:
		return column{}, fmt.Errorf("%w: %T", ErrUnsupportedType, kk)
	}
	return column{dtype: dt, shape: shape, data: data}, nil
}

func checkRect(v reflect.Value, shape []int64, depth int) error {
	if depth == len(shape) {
		return nil
	}
	if int64(v.Len()) != shape[depth] {
		return fmt.Errorf("%w: ragged value: length %d at depth %d, expected %d", ErrShape, v.Len(), depth, shape[depth])
	}
	if depth+1 == len(shape) {
		return nil
	}
	for i := range v.Len() {
		if err := checkRect(v.Index(i), shape, depth+1); err != nil {
			return err
		}
	}
	return nil
}
