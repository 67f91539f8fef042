package dataset

import (
	"context"
	"encoding/binary"
	"fmt"
	"maps"
	"math"
	"reflect"
	"slices"
	"strings"
	"sync"
	"unicode/utf8"
	"unsafe"

	"github.com/tfdist/tfdist/internal/graphutil"
	tf "github.com/wamuir/graft/tensorflow"
	pb "github.com/wamuir/graft/tensorflow/core/example/example_protos_go_proto"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
)

// Feature describes one fixed-length feature of a tf.Example, as
// tf.io.FixedLenFeature does.
type Feature struct {
	// Type is the dtype of the parsed tensor and says which list the
	// feature must hold: tf.Float reads a float_list; tf.Int64 reads an
	// int64_list, and so does tf.Int32, checking that every value fits;
	// tf.String reads a bytes_list.
	Type tf.DataType
	// Shape is the shape of the parsed tensor; nil or empty for a scalar.
	// The feature must hold exactly as many values as Shape has elements.
	Shape []int64
	// Default is the value used when the feature is absent; nil makes the
	// feature required. It is a scalar, repeated to fill Shape, or a flat
	// slice of exactly as many values as Shape has elements: float32 or
	// float64 for tf.Float, int, int32 or int64 for tf.Int64 and tf.Int32,
	// string or []byte for tf.String.
	Default any
	// VarLen makes the feature variable-length, as tf.io.VarLenFeature or
	// a RaggedFeature of one ragged dimension: it may hold any number of
	// values (none when absent), parsed into a 1-D tensor padded with
	// Default (zero when nil) to MaxLen values when MaxLen > 0 (a feature
	// with more is an error), or of its own length otherwise (PaddedBatch
	// then pads each batch). The parser adds the number of values as an
	// int32 scalar named LengthKey(name). Shape must be empty.
	VarLen bool
	// MaxLen is the length a VarLen feature is padded to; 0 leaves it
	// unpadded.
	MaxLen int
}

// LengthKey names the int32 scalar that holds the number of values of the
// VarLen feature name: name + "_length".
func LengthKey(name string) string { return name + "_length" }

// FeatureSpec names the features to parse from each tf.Example. Features of
// an Example that the spec does not name are ignored.
type FeatureSpec map[string]Feature

// ExampleParser parses serialized tf.Example protos into elements by a
// FeatureSpec. It reads the protobuf wire format directly (accepting exactly
// what proto.Unmarshal accepts, which its fuzz test checks) and allocates
// only the values it returns. It is safe for concurrent use.
type ExampleParser struct {
	feats     []compiledFeature
	index     map[string]int
	hasVarLen bool
}

type compiledFeature struct {
	name   string
	dtype  tf.DataType
	list   int8 // the Feature field that must hold the values
	shape  []int64
	n      int
	def    any        // flat default of n values, or nil; a VarLen feature's padding value
	varLen bool       // n is then the padded length, 0 for none
	lend   *sync.Pool // buffers of n values (float32 or int64, as list says) to parse into, or nil
}

// The fields of tensorflow.Feature's oneof, which are also the list kinds.
const (
	listNone  = 0
	listBytes = 1
	listFloat = 2
	listInt64 = 3
)

var listNames = [...]string{"no list", "bytes_list", "float_list", "int64_list"}

// NewExampleParser checks spec and returns its parser.
func NewExampleParser(spec FeatureSpec) (*ExampleParser, error) {
	if len(spec) == 0 {
		return nil, fmt.Errorf("dataset: feature spec: %w: no features", ErrInvalidArgument)
	}
	p := &ExampleParser{index: make(map[string]int, len(spec))}
	for _, name := range slices.Sorted(maps.Keys(spec)) {
		f := spec[name]
		if name == "" {
			return nil, fmt.Errorf("dataset: feature spec: %w: empty feature name", ErrInvalidArgument)
		}
		cf := compiledFeature{name: name, dtype: f.Type, shape: slices.Clone(f.Shape)}
		switch f.Type {
		case tf.Float:
			cf.list = listFloat
		case tf.Int64, tf.Int32:
			cf.list = listInt64
		case tf.String:
			cf.list = listBytes
		default:
			return nil, fmt.Errorf("dataset: feature spec: feature %q: %w: dtype %s, expected tf.Float, tf.Int64, tf.Int32 or tf.String",
				name, ErrUnsupportedType, graphutil.DTypeName(f.Type))
		}
		for _, d := range f.Shape {
			if d < 0 {
				return nil, fmt.Errorf("dataset: feature spec: feature %q: %w: shape %v, expected fixed non-negative dimensions",
					name, ErrInvalidArgument, f.Shape)
			}
		}
		cf.n = int(numElements(f.Shape))
		if f.VarLen {
			if err := compileVarLen(&cf, f, spec); err != nil {
				return nil, fmt.Errorf("dataset: feature spec: feature %q: %w", name, err)
			}
		} else if f.Default != nil {
			def, err := compileDefault(f.Type, f.Default, cf.n)
			if err != nil {
				return nil, fmt.Errorf("dataset: feature spec: feature %q: default: %w", name, err)
			}
			cf.def = def
		}
		switch {
		case cf.varLen || cf.n < minLent:
		case cf.list == listFloat:
			cf.lend = newPool[float32](cf.n)
		case cf.list == listInt64:
			cf.lend = newPool[int64](cf.n)
		}
		p.index[name] = len(p.feats)
		p.feats = append(p.feats, cf)
		p.hasVarLen = p.hasVarLen || cf.varLen
	}
	return p, nil
}

// compileVarLen sets up a VarLen feature: its padded length and padding
// value.
func compileVarLen(cf *compiledFeature, f Feature, spec FeatureSpec) error {
	switch {
	case len(f.Shape) > 0:
		return fmt.Errorf("%w: VarLen with shape %v, expected none (a VarLen feature is 1-D)", ErrInvalidArgument, f.Shape)
	case f.MaxLen < 0:
		return fmt.Errorf("%w: MaxLen %d, expected 0 (no padding) or more", ErrInvalidArgument, f.MaxLen)
	}
	if _, clash := spec[LengthKey(cf.name)]; clash {
		return fmt.Errorf("%w: its length would be named %q, which the spec names too", ErrInvalidArgument, LengthKey(cf.name))
	}
	pad := f.Default
	if pad == nil {
		pad = map[tf.DataType]any{tf.Float: 0.0, tf.Int64: 0, tf.Int32: 0, tf.String: ""}[f.Type]
	}
	def, err := compileDefault(f.Type, pad, 1)
	if err != nil {
		return fmt.Errorf("padding value: %w", err)
	}
	cf.varLen, cf.n, cf.def, cf.shape = true, f.MaxLen, def, nil
	return nil
}

// compileDefault converts a default value to flat data of n values.
func compileDefault(dt tf.DataType, v any, n int) (any, error) {
	rv := reflect.ValueOf(v)
	var vals []reflect.Value
	if rv.Kind() == reflect.Slice && rv.Type() != reflect.TypeFor[[]byte]() {
		for i := range rv.Len() {
			vals = append(vals, rv.Index(i))
		}
		if len(vals) != n {
			return nil, fmt.Errorf("%w: %d values, expected %d (or one scalar)", ErrShape, len(vals), n)
		}
	} else {
		for range n {
			vals = append(vals, rv)
		}
	}
	mismatch := func(x reflect.Value) error {
		return fmt.Errorf("%w: value %v of type %v for dtype %s", ErrUnsupportedType, x, x.Type(), graphutil.DTypeName(dt))
	}
	switch dt {
	case tf.Float:
		out := make([]float32, n)
		for i, x := range vals {
			if !x.CanFloat() {
				return nil, mismatch(x)
			}
			out[i] = float32(x.Float())
		}
		return out, nil
	case tf.Int64, tf.Int32:
		out64 := make([]int64, n)
		for i, x := range vals {
			if !x.CanInt() {
				return nil, mismatch(x)
			}
			out64[i] = x.Int()
		}
		if dt == tf.Int64 {
			return out64, nil
		}
		return toInt32(out64)
	default: // tf.String
		out := make([]string, n)
		for i, x := range vals {
			switch {
			case x.Kind() == reflect.String:
				out[i] = x.String()
			case x.Type() == reflect.TypeFor[[]byte]():
				out[i] = string(x.Bytes())
			default:
				return nil, mismatch(x)
			}
		}
		return out, nil
	}
}

func toInt32(v []int64) ([]int32, error) {
	out := make([]int32, len(v))
	for i, x := range v {
		if x < math.MinInt32 || x > math.MaxInt32 {
			return nil, fmt.Errorf("%w: value %d at index %d does not fit in int32", ErrFeatureType, x, i)
		}
		out[i] = int32(x)
	}
	return out, nil
}

// Parse parses one serialized tf.Example into tensors.
func (p *ExampleParser) Parse(record []byte) (Element, error) {
	cols, loans, err := p.parse(record)
	if err != nil {
		return nil, fmt.Errorf("dataset: parse tf.Example: %w", err)
	}
	return hostElem{cols: cols, loans: loans}.emit()
}

// slot gathers the values of one spec feature while parsing.
type slot struct {
	present bool
	list    int8
	floats  []float32
	ints    []int64
	bytes   [][]byte
	lentF   *[]float32 // the lent buffer floats started in, if any
	lentI   *[]int64   // the lent buffer ints started in, if any
}

func (s *slot) reset() {
	s.present, s.list = true, listNone
	s.floats, s.ints, s.bytes = s.floats[:0], s.ints[:0], s.bytes[:0]
}

// hostLittleEndian is whether float32s in memory have the byte order of a
// packed FloatList on the wire.
var hostLittleEndian = binary.NativeEndian.Uint16([]byte{1, 0}) == 1

// appendPackedFloats appends the little-endian float32s of a packed
// FloatList, len(b) a multiple of 4, to dst: one copy on a little-endian
// host, where the wire's bytes are the values' memory.
func appendPackedFloats(dst []float32, b []byte) []float32 {
	n := len(b) / 4
	if hostLittleEndian {
		// b viewed as float32s is only read by append's copy, a memmove,
		// so its alignment does not matter; and append, unlike
		// slices.Grow, does not zero the space it then fills.
		return append(dst, unsafe.Slice((*float32)(unsafe.Pointer(unsafe.SliceData(b))), n)...)
	}
	dst = slices.Grow(dst, n)
	out := dst[len(dst) : len(dst)+n]
	for i := range out {
		out[i] = math.Float32frombits(binary.LittleEndian.Uint32(b[4*i:]))
	}
	return dst[:len(dst)+n]
}

var errWire = fmt.Errorf("%w: invalid protobuf wire format", ErrMalformedExample)

// consumeTag reads a field tag the way proto.Unmarshal does: field numbers
// outside [1, 2^29-1] are errors.
func consumeTag(b []byte) (protowire.Number, protowire.Type, int, error) {
	num, typ, n := protowire.ConsumeTag(b)
	if n < 0 || num > protowire.MaxValidNumber {
		return 0, 0, 0, errWire
	}
	return num, typ, n, nil
}

func skipField(num protowire.Number, typ protowire.Type, b []byte) (int, error) {
	n := protowire.ConsumeFieldValue(num, typ, b)
	if n < 0 {
		return 0, errWire
	}
	return n, nil
}

// parse parses a serialized tf.Example into the spec's columns, the values
// of its larger fixed-length float and int64 features in buffers the
// parser lends, and returns those loans (see recycle.go).
func (p *ExampleParser) parse(b []byte) ([]namedColumn, []loan, error) {
	var few [4]slot // the slots of a small spec stay off the heap
	slots := few[:]
	if len(p.feats) > len(few) {
		slots = make([]slot, len(p.feats))
	}
	slots = slots[:len(p.feats)]
	for i := range slots {
		if f := &p.feats[i]; f.lend != nil {
			s := &slots[i]
			if f.list == listFloat {
				s.lentF = borrow[float32](f.lend)
				s.floats = *s.lentF
			} else {
				s.lentI = borrow[int64](f.lend)
				s.ints = *s.lentI
			}
		}
	}
	cols, err := p.parseWire(b, slots)
	var loans []loan
	for i := range slots {
		f := &p.feats[i]
		if f.lend == nil {
			continue
		}
		var data any
		if err == nil {
			c, _ := hostElem{cols: cols}.get(f.name)
			data = c.data
		}
		loans = settle(f.lend, slots[i].lentF, data, loans)
		loans = settle(f.lend, slots[i].lentI, data, loans)
	}
	return cols, loans, err
}

// parseWire parses b into slots and returns the spec's columns. It follows
// proto.Unmarshal's merge rules: a repeated Features message or map entry
// merges into the map, a later entry for a key replaces the earlier,
// repeated occurrences of the same oneof member merge (their lists
// concatenate) and a different member replaces it, and fields of an
// unexpected number or wire type are skipped as unknown.
func (p *ExampleParser) parseWire(b []byte, slots []slot) ([]namedColumn, error) {
	for len(b) > 0 {
		num, typ, n, err := consumeTag(b)
		if err != nil {
			return nil, err
		}
		b = b[n:]
		if num == 1 && typ == protowire.BytesType { // Example.features
			v, n := protowire.ConsumeBytes(b)
			if n < 0 {
				return nil, errWire
			}
			if err := p.parseFeatures(v, slots); err != nil {
				return nil, err
			}
			b = b[n:]
			continue
		}
		if n, err = skipField(num, typ, b); err != nil {
			return nil, err
		}
		b = b[n:]
	}
	cols := make([]namedColumn, 0, len(p.feats))
	for i := range p.feats {
		f := &p.feats[i]
		if f.varLen {
			vals, length, err := f.varColumns(&slots[i])
			if err != nil {
				return nil, err
			}
			cols = append(cols, namedColumn{f.name, vals}, namedColumn{LengthKey(f.name), length})
			continue
		}
		c, err := f.column(&slots[i])
		if err != nil {
			return nil, err
		}
		cols = append(cols, namedColumn{f.name, c})
	}
	if p.hasVarLen { // keep the columns sorted by name, as without lengths
		slices.SortFunc(cols, func(a, b namedColumn) int { return strings.Compare(a.name, b.name) })
	}
	return cols, nil
}

func (p *ExampleParser) parseFeatures(b []byte, slots []slot) error {
	var scratch slot
	for len(b) > 0 {
		num, typ, n, err := consumeTag(b)
		if err != nil {
			return err
		}
		b = b[n:]
		if num != 1 || typ != protowire.BytesType { // Features.feature map entries
			if n, err = skipField(num, typ, b); err != nil {
				return err
			}
			b = b[n:]
			continue
		}
		entry, n := protowire.ConsumeBytes(b)
		if n < 0 {
			return errWire
		}
		b = b[n:]
		var (
			key    []byte
			values [][]byte
			buf    [2][]byte
		)
		values = buf[:0]
		for len(entry) > 0 {
			num, typ, n, err := consumeTag(entry)
			if err != nil {
				return err
			}
			entry = entry[n:]
			switch {
			case num == 1 && typ == protowire.BytesType:
				k, n := protowire.ConsumeBytes(entry)
				if n < 0 {
					return errWire
				}
				if !utf8.Valid(k) {
					return fmt.Errorf("%w: feature name is not valid UTF-8", ErrMalformedExample)
				}
				key = k
				entry = entry[n:]
			case num == 2 && typ == protowire.BytesType:
				v, n := protowire.ConsumeBytes(entry)
				if n < 0 {
					return errWire
				}
				values = append(values, v)
				entry = entry[n:]
			default:
				if n, err = skipField(num, typ, entry); err != nil {
					return err
				}
				entry = entry[n:]
			}
		}
		s, acc := &scratch, false
		if i, ok := p.index[string(key)]; ok {
			s, acc = &slots[i], true
		}
		s.reset()
		for _, v := range values {
			if err := parseFeature(v, s, acc); err != nil {
				return err
			}
		}
	}
	return nil
}

// parseFeature merges one serialized tensorflow.Feature into s, keeping the
// values only when acc is set.
func parseFeature(b []byte, s *slot, acc bool) error {
	for len(b) > 0 {
		num, typ, n, err := consumeTag(b)
		if err != nil {
			return err
		}
		b = b[n:]
		if num < listBytes || num > listInt64 || typ != protowire.BytesType {
			if n, err = skipField(num, typ, b); err != nil {
				return err
			}
			b = b[n:]
			continue
		}
		v, n := protowire.ConsumeBytes(b)
		if n < 0 {
			return errWire
		}
		b = b[n:]
		if list := int8(num); s.list != list {
			s.list = list
			s.floats, s.ints, s.bytes = s.floats[:0], s.ints[:0], s.bytes[:0]
		}
		if err := parseList(v, s, acc); err != nil {
			return err
		}
	}
	return nil
}

// parseList merges one serialized BytesList, FloatList or Int64List (as
// s.list says) into s.
func parseList(b []byte, s *slot, acc bool) error {
	for len(b) > 0 {
		num, typ, n, err := consumeTag(b)
		if err != nil {
			return err
		}
		b = b[n:]
		if num != 1 {
			if n, err = skipField(num, typ, b); err != nil {
				return err
			}
			b = b[n:]
			continue
		}
		switch {
		case s.list == listBytes && typ == protowire.BytesType:
			v, n := protowire.ConsumeBytes(b)
			if n < 0 {
				return errWire
			}
			if acc {
				s.bytes = append(s.bytes, v)
			}
			b = b[n:]
		case s.list == listFloat && typ == protowire.BytesType: // packed
			v, n := protowire.ConsumeBytes(b)
			if n < 0 || len(v)%4 != 0 {
				return errWire
			}
			if acc {
				s.floats = appendPackedFloats(s.floats, v)
			}
			b = b[n:]
		case s.list == listFloat && typ == protowire.Fixed32Type:
			v, n := protowire.ConsumeFixed32(b)
			if n < 0 {
				return errWire
			}
			if acc {
				s.floats = append(s.floats, math.Float32frombits(v))
			}
			b = b[n:]
		case s.list == listInt64 && typ == protowire.BytesType: // packed
			v, n := protowire.ConsumeBytes(b)
			if n < 0 {
				return errWire
			}
			if acc {
				s.ints = slices.Grow(s.ints, countVarints(v))
			}
			for len(v) > 0 {
				x, m := protowire.ConsumeVarint(v)
				if m < 0 {
					return errWire
				}
				if acc {
					s.ints = append(s.ints, int64(x))
				}
				v = v[m:]
			}
			b = b[n:]
		case s.list == listInt64 && typ == protowire.VarintType:
			x, n := protowire.ConsumeVarint(b)
			if n < 0 {
				return errWire
			}
			if acc {
				s.ints = append(s.ints, int64(x))
			}
			b = b[n:]
		default:
			if n, err = skipField(num, typ, b); err != nil {
				return err
			}
			b = b[n:]
		}
	}
	return nil
}

// countVarints counts the varints packed in b (their final bytes).
func countVarints(b []byte) int {
	n := 0
	for _, c := range b {
		if c < 0x80 {
			n++
		}
	}
	return n
}

// column checks the gathered values of f against its spec.
//
// As in TensorFlow's parser, a feature whose Feature message sets no list
// counts as absent, while an empty list of the wrong kind is a type error and
// an empty list of the right kind a size error.
func (f *compiledFeature) column(s *slot) (column, error) {
	if !s.present || s.list == listNone {
		if f.def == nil {
			return column{}, fmt.Errorf("feature %q: %w: absent from the example and no default is set (expected %s of %d values)",
				f.name, ErrFeatureMissing, listNames[f.list], f.n)
		}
		return column{dtype: f.dtype, shape: f.shape, data: f.def}, nil
	}
	if s.list != f.list {
		return column{}, fmt.Errorf("feature %q: %w: holds %s, expected %s for dtype %s",
			f.name, ErrFeatureType, listNames[s.list], listNames[f.list], graphutil.DTypeName(f.dtype))
	}
	got := len(s.floats) + len(s.ints) + len(s.bytes)
	if got != f.n {
		return column{}, fmt.Errorf("feature %q: %w: holds %d values, expected %d for shape %v",
			f.name, ErrFeatureSize, got, f.n, f.shape)
	}
	data, err := f.values(s, 0)
	return column{dtype: f.dtype, shape: f.shape, data: data}, err
}

// values returns the slot's values as the feature's flat data, with pad
// copies of the padding value after them.
func (f *compiledFeature) values(s *slot, pad int) (any, error) {
	switch f.dtype {
	case tf.Float:
		return padded(s.floats, f.def, pad), nil
	case tf.Int64:
		return padded(s.ints, f.def, pad), nil
	case tf.Int32:
		v, err := toInt32(s.ints)
		if err != nil {
			return nil, fmt.Errorf("feature %q: %w", f.name, err)
		}
		return padded(v, f.def, pad), nil
	}
	strs := make([]string, len(s.bytes))
	for i, b := range s.bytes {
		strs[i] = string(b)
	}
	return padded(strs, f.def, pad), nil
}

// padded returns vals (clipped, so that appending copies) followed by pad
// copies of the one value in def.
func padded[T any](vals []T, def any, pad int) []T {
	vals = slices.Clip(vals)
	if pad == 0 {
		return vals
	}
	p := def.([]T)[0]
	for range pad {
		vals = append(vals, p)
	}
	return vals
}

// varColumns returns a VarLen feature's values, padded to its length when
// it has one, and their number.
func (f *compiledFeature) varColumns(s *slot) (vals, length column, err error) {
	got := 0
	if s.present && s.list != listNone {
		if s.list != f.list {
			return vals, length, fmt.Errorf("feature %q: %w: holds %s, expected %s for dtype %s",
				f.name, ErrFeatureType, listNames[s.list], listNames[f.list], graphutil.DTypeName(f.dtype))
		}
		got = len(s.floats) + len(s.ints) + len(s.bytes)
	}
	if f.n > 0 && got > f.n {
		return vals, length, fmt.Errorf("feature %q: %w: holds %d values, more than MaxLen %d", f.name, ErrFeatureSize, got, f.n)
	}
	pad := 0
	if f.n > 0 {
		pad = f.n - got
	}
	data, err := f.values(s, pad)
	vals = column{dtype: f.dtype, shape: []int64{int64(got + pad)}, data: data}
	length = column{dtype: tf.Int32, data: []int32{int32(got)}}
	return vals, length, err
}

// ParseExamples returns a dataset of the tf.Examples held by the RecordKey
// values of ds (as TFRecordFiles yields them), parsed by p. A record that
// does not parse ends the pass with an error naming its file, byte offset and
// feature. WithParallelism spreads the parsing over goroutines; without it,
// the records of a TFRecordFiles or TFRecordFile input are parsed where they
// are read, without a copy.
func ParseExamples(ds Dataset, p *ExampleParser, opts ...MapOption) Dataset {
	if p == nil {
		return invalid("ParseExamples: nil parser")
	}
	m := newMap(ds, "ParseExamples", func(i int64, e hostElem) (hostElem, error) {
		c, ok := e.get(RecordKey)
		if !ok || len(e.cols) != 1 || c.dtype != tf.String || len(c.shape) != 0 {
			return hostElem{}, fmt.Errorf("dataset: ParseExamples: element %d holds {%s}, expected {%s string[]}",
				i, describe(e.cols), RecordKey)
		}
		d, err := c.hostData()
		if err != nil {
			return hostElem{}, err
		}
		rec := d.([]string)[0]
		return p.parseRecord(i, unsafe.Slice(unsafe.StringData(rec), len(rec)), e.origin)
	}, opts)
	if md, ok := m.(*mapDS); ok {
		return &parseDS{mapDS: md, p: p}
	}
	return m
}

// parseRecord parses record number i, found at o.
func (p *ExampleParser) parseRecord(i int64, rec []byte, o origin) (hostElem, error) {
	cols, loans, err := p.parse(rec)
	if err != nil {
		where := o.String()
		if where == "" {
			where = fmt.Sprintf("element %d", i)
		}
		return hostElem{}, fmt.Errorf("dataset: parse tf.Example at %s: %w", where, err)
	}
	return hostElem{cols: cols, origin: o, loans: loans}, nil
}

// parseDS is ParseExamples: a map that, on the caller's goroutine, parses
// the records of a TFRecordDataset input in the reader's buffer (the parser
// copies what it keeps), sparing a copy and an allocation per record.
type parseDS struct {
	*mapDS
	p *ExampleParser
}

func (d *parseDS) Iterator(ctx context.Context) (Iterator, error) { return iterate(ctx, d) }
func (d *parseDS) withInput(in Dataset) node {
	return &parseDS{mapDS: d.mapDS.withInput(in).(*mapDS), p: d.p}
}
func (d *parseDS) open(ctx context.Context) (hostIter, error) {
	src, ok := d.in.(*TFRecordDataset)
	if !ok || d.parallelism > 1 {
		return d.mapDS.open(ctx)
	}
	return &parseRecordsIter{recs: &recordIter{d: src}, p: d.p}, nil
}

type parseRecordsIter struct {
	recs *recordIter
	p    *ExampleParser
	i    int64
	s    sticky
}

func (it *parseRecordsIter) next(ctx context.Context) (hostElem, error) {
	if it.s.err != nil {
		return hostElem{}, it.s.err
	}
	rec, o, err := it.recs.nextRecord(ctx)
	if err != nil {
		return hostElem{}, it.s.fail(ctx, err)
	}
	e, err := it.p.parseRecord(it.i, rec, o)
	it.i++
	return e, it.s.fail(ctx, err)
}

func (it *parseRecordsIter) close() error { return it.recs.close() }

// EncodeExample serializes a tf.Example holding features. Each value becomes
// a float_list (float32, float64), an int64_list (any integer type, bool) or
// a bytes_list (string, and []byte as one value): a scalar, a slice, nested
// slices (flattened in row-major order) or a *tf.Tensor.
func EncodeExample(features map[string]any) ([]byte, error) {
	ex := &pb.Example{Features: &pb.Features{Feature: make(map[string]*pb.Feature, len(features))}}
	for name, v := range features {
		f, err := encodeFeature(v)
		if err != nil {
			return nil, fmt.Errorf("dataset: EncodeExample: feature %q: %w", name, err)
		}
		ex.Features.Feature[name] = f
	}
	b, err := proto.MarshalOptions{Deterministic: true}.Marshal(ex)
	if err != nil {
		return nil, fmt.Errorf("dataset: EncodeExample: %w", err)
	}
	return b, nil
}

func encodeFeature(v any) (*pb.Feature, error) {
	switch x := v.(type) {
	case []byte:
		return &pb.Feature{Kind: &pb.Feature_BytesList{BytesList: &pb.BytesList{Value: [][]byte{x}}}}, nil
	case [][]byte:
		return &pb.Feature{Kind: &pb.Feature_BytesList{BytesList: &pb.BytesList{Value: x}}}, nil
	case int:
		return encodeFeature(int64(x))
	case []int:
		out := make([]int64, len(x))
		for i, y := range x {
			out[i] = int64(y)
		}
		return encodeFeature(out)
	}
	c, err := columnFromGo(v)
	if err != nil {
		return nil, err
	}
	switch d := c.data.(type) {
	case []float32:
		return &pb.Feature{Kind: &pb.Feature_FloatList{FloatList: &pb.FloatList{Value: d}}}, nil
	case []float64:
		f := make([]float32, len(d))
		for i, y := range d {
			f[i] = float32(y)
		}
		return &pb.Feature{Kind: &pb.Feature_FloatList{FloatList: &pb.FloatList{Value: f}}}, nil
	case []string:
		bs := make([][]byte, len(d))
		for i, s := range d {
			bs[i] = []byte(s)
		}
		return &pb.Feature{Kind: &pb.Feature_BytesList{BytesList: &pb.BytesList{Value: bs}}}, nil
	case []int64:
		return &pb.Feature{Kind: &pb.Feature_Int64List{Int64List: &pb.Int64List{Value: d}}}, nil
	}
	rv := reflect.ValueOf(c.data)
	ints := make([]int64, rv.Len())
	for i := range ints {
		switch x := rv.Index(i); {
		case x.CanInt():
			ints[i] = x.Int()
		case x.CanUint():
			ints[i] = int64(x.Uint())
		case x.Kind() == reflect.Bool && x.Bool():
			ints[i] = 1
		}
	}
	return &pb.Feature{Kind: &pb.Feature_Int64List{Int64List: &pb.Int64List{Value: ints}}}, nil
}
