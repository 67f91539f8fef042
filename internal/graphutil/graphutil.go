// Package graphutil holds the graph-building pieces that both of tfdist's
// engines (the in-graph engine and the parameter-server strategy) build the
// same way.
package graphutil

import (
	"fmt"
	"strings"

	tf "github.com/wamuir/graft/tensorflow"
	typespb "github.com/wamuir/graft/tensorflow/core/framework/types_go_proto"
	"github.com/wamuir/graft/tensorflow/op"
)

// SumAll returns the sum of every element of x, a scalar, whose shape the
// graph knows to be a scalar.
func SumAll(s *op.Scope, x tf.Output) tf.Output {
	sum := op.Sum(s, x, op.Range(s.SubScope("axes"), op.Const(s.SubScope("zero"), int32(0)),
		op.Rank(s.SubScope("rank"), x), op.Const(s.SubScope("one"), int32(1))))
	return op.Reshape(s.SubScope("scalar"), sum, op.Const(s.SubScope("scalar_shape"), []int32{}))
}

// AverageLoss returns sum(perExample) / n, 0 when n is 0; n is a float32
// scalar, cast to perExample's type.
func AverageLoss(s *op.Scope, perExample, n tf.Output) tf.Output {
	total := SumAll(s.SubScope("sum"), perExample)
	return op.DivNoNan(s, total, CastTo(s, n, perExample.DataType()))
}

// CastTo returns x cast to dtype on s.SubScope("cast"), or x itself when
// it has that type already.
func CastTo(s *op.Scope, x tf.Output, dtype tf.DataType) tf.Output {
	if x.DataType() == dtype {
		return x
	}
	return op.Cast(s.SubScope("cast"), x, dtype)
}

// CheckedIDs returns ids (int32 or int64, any shape) flattened to int64,
// with a check that fails the step, naming the variable and the ids, when
// one is outside [0, rows).
func CheckedIDs(s *op.Scope, name string, rows int64, ids tf.Output) tf.Output {
	flat := op.Reshape(s.SubScope("flat"), op.Cast(s.SubScope("cast"), ids, tf.Int64), op.Const(s.SubScope("minus_one"), []int32{-1}))
	inRange := op.All(s.SubScope("in_range"), op.LogicalAnd(s.SubScope("and"),
		op.GreaterEqual(s.SubScope("ge"), flat, op.Const(s.SubScope("zero_id"), int64(0))),
		op.Less(s.SubScope("lt"), flat, op.Const(s.SubScope("rows"), rows))), op.Const(s.SubScope("all_axis"), int32(0)))
	check := op.Assert(s.SubScope("check"), inRange, []tf.Output{
		op.Const(s.SubScope("message"), fmt.Sprintf("Lookup %q: every id must be in [0, %d); the ids:", name, rows)), flat},
		op.AssertSummarize(10))
	return op.Identity(s.SubScope("checked").WithControlDependencies(check), flat)
}

// RowsShape returns the shape of a lookup's result, ids' shape followed by
// rowShape, as an int32 vector.
func RowsShape(s *op.Scope, ids tf.Output, rowShape []int64) tf.Output {
	rs := make([]int32, len(rowShape))
	for i, d := range rowShape {
		rs[i] = int32(d)
	}
	return op.ConcatV2(s, []tf.Output{op.Shape(s.SubScope("ids_shape"), ids, op.ShapeOutType(tf.Int32)),
		op.Const(s.SubScope("row_shape"), rs)}, op.Const(s.SubScope("axis"), int32(0)))
}

var dtypeNames = map[tf.DataType]string{
	tf.Float: "float32", tf.Double: "float64", tf.Half: "float16", tf.Bfloat16: "bfloat16",
	tf.Int32: "int32", tf.Int64: "int64", tf.Uint8: "uint8", tf.Int8: "int8",
	tf.Int16: "int16", tf.Uint16: "uint16", tf.Uint32: "uint32", tf.Uint64: "uint64",
	tf.Bool: "bool", tf.String: "string",
}

// IsFloat reports whether dt is a floating-point type.
func IsFloat(dt tf.DataType) bool {
	return dt == tf.Float || dt == tf.Double || dt == tf.Half || dt == tf.Bfloat16
}

// DTypeName returns the name Python TensorFlow gives a dtype ("float32",
// "int64", …), as error messages show it.
func DTypeName(dt tf.DataType) string {
	if s, ok := dtypeNames[dt]; ok {
		return s
	}
	if n, ok := typespb.DataType_name[int32(dt)]; ok {
		return strings.ToLower(strings.TrimPrefix(n, "DT_"))
	}
	return fmt.Sprintf("DataType(%d)", int(dt))
}

// Safely runs fn and turns a panic (graft panics on ops built from a failed
// scope, and strategy.MustRead on a variable of another strategy) into an
// error.
func Safely(fn func() error) (err error) {
	defer func() {
		if p := recover(); p != nil {
			err = fmt.Errorf("panic while building the graph: %v", p)
		}
	}()
	return fn()
}

// CheckLookup returns the error of Replica.Lookup of the variable name,
// of the given shape, with ids; nil when they fit.
func CheckLookup(name string, shape []int64, ids tf.Output) error {
	if len(shape) == 0 {
		return fmt.Errorf("%s: the variable is a scalar; expected one with rows", lookupOf(name))
	}
	if dt := ids.DataType(); dt != tf.Int32 && dt != tf.Int64 {
		return fmt.Errorf("%s: ids are %s, expected int32 or int64", lookupOf(name), DTypeName(dt))
	}
	return nil
}

// lookupOf names a Lookup of the variable name in errors, after the
// Replica method.
func lookupOf(name string) string { return fmt.Sprintf("Lookup %q", name) }

// WrapLookup wraps err, of building a Lookup of the variable name.
func WrapLookup(name string, err error) error { return fmt.Errorf("%s: %w", lookupOf(name), err) }

// LookupRows returns the rows of value, the value of the variable name of
// the given shape, that ids (int32 or int64, any shape) name: shape
// ids.shape + shape[1:]. An id out of range fails the step naming the
// variable.
func LookupRows(s *op.Scope, name string, shape []int64, value, ids tf.Output) (out tf.Output, err error) {
	if err := CheckLookup(name, shape, ids); err != nil {
		return tf.Output{}, err
	}
	err = Safely(func() error {
		flat := CheckedIDs(s.SubScope("ids"), name, shape[0], ids)
		rows := op.GatherV2(s.SubScope("gather"), value, flat, op.Const(s.SubScope("axis"), int32(0)))
		out = op.Reshape(s.SubScope("out"), rows, RowsShape(s.SubScope("shape"), ids, shape[1:]))
		return s.Err()
	})
	if err != nil {
		return tf.Output{}, WrapLookup(name, err)
	}
	return out, nil
}

// StaticShape returns o's shape as the graph knows it, and whether every
// dimension is known.
func StaticShape(o tf.Output) ([]int64, bool) {
	dims, err := o.Shape().ToSlice()
	if err != nil {
		return nil, false
	}
	for _, d := range dims {
		if d < 0 {
			return dims, false
		}
	}
	return dims, true
}
