package checkpoint

import (
	"fmt"
	"strings"

	"github.com/tfdist/tfdist/internal/graphutil"
	tf "github.com/wamuir/graft/tensorflow"
)

// MismatchError says how a checkpoint and the model it is restored into
// disagree. Restore returns it (test with errors.As) before changing any
// variable.
type MismatchError struct {
	// Prefix is the checkpoint's prefix.
	Prefix string
	// Missing names the model's variables the checkpoint has no value for.
	// Tolerated with WithAllowPartial.
	Missing []string
	// Unused names the checkpoint's tensors no variable of the model takes
	// (metadata aside). Tolerated with WithAllowPartial.
	Unused []string
	// Mismatched lists the variables whose dtype or shape differs from the
	// checkpoint's. Never tolerated.
	Mismatched []Mismatch
}

// Mismatch is one variable whose dtype or shape differs between the
// checkpoint and the model.
type Mismatch struct {
	Name            string
	CheckpointDType tf.DataType
	CheckpointShape []int64
	ModelDType      tf.DataType
	ModelShape      []int64
}

// String describes the mismatch with both dtypes and shapes.
func (m Mismatch) String() string {
	return fmt.Sprintf("variable %q: the checkpoint has %s%v, the model has %s%v",
		m.Name, graphutil.DTypeName(m.CheckpointDType), m.CheckpointShape, graphutil.DTypeName(m.ModelDType), m.ModelShape)
}

// Error lists every disagreement, naming the variables.
func (e *MismatchError) Error() string {
	var parts []string
	for _, m := range e.Mismatched {
		parts = append(parts, m.String())
	}
	if len(e.Missing) > 0 {
		parts = append(parts, fmt.Sprintf("the checkpoint has no value for variable(s) %s (WithAllowPartial(true) keeps their current values)",
			quoteList(e.Missing)))
	}
	if len(e.Unused) > 0 {
		parts = append(parts, fmt.Sprintf("no variable of the model takes checkpoint tensor(s) %s "+
			"(if they are optimizer slots, build the training step, which creates them, before restoring; "+
			"WithAllowPartial(true) ignores them)", quoteList(e.Unused)))
	}
	return fmt.Sprintf("checkpoint: restore %s: %s", e.Prefix, strings.Join(parts, "; "))
}

func quoteList(names []string) string {
	const maxNames = 20
	q := make([]string, 0, min(len(names), maxNames))
	for i, n := range names {
		if i == maxNames {
			q = append(q, fmt.Sprintf("and %d more", len(names)-maxNames))
			break
		}
		q = append(q, fmt.Sprintf("%q", n))
	}
	return strings.Join(q, ", ")
}

// IncompleteError says that a variable's tensor was saved as slices that
// do not cover it, as when a shard of a checkpoint is lost. Restore and
// WarmStart return it (test with errors.As) before changing any variable.
type IncompleteError struct {
	// Prefix is the checkpoint's prefix.
	Prefix string
	// Name is the tensor's key in the checkpoint.
	Name string
	// Shape is the whole tensor's shape.
	Shape []int64
	// Missing is the first block no slice covers, in row-major order: the
	// range [start, end) of each dimension.
	Missing [][2]int64

	byRows bool       // the slices cut only the first dimension
	rows   [][2]int64 // then, the ranges of rows they cover
}

// Error names the variable and what its slices miss: the rows, when the
// slices cut only the first dimension, else the first block missing.
func (e *IncompleteError) Error() string {
	head := fmt.Sprintf("checkpoint: restore %s: variable %q %v", e.Prefix, e.Name, e.Shape)
	if !e.byRows {
		var dims []string
		for d, r := range e.Missing {
			dims = append(dims, fmt.Sprintf("%s of dimension %d", rangeList([][2]int64{r}), d))
		}
		return fmt.Sprintf("%s: its slices do not cover indices %s", head, strings.Join(dims, ", "))
	}
	var missing [][2]int64
	next := int64(0)
	for _, r := range e.rows {
		if r[0] > next {
			missing = append(missing, [2]int64{next, r[0]})
		}
		next = r[1]
	}
	if next < e.Shape[0] {
		missing = append(missing, [2]int64{next, e.Shape[0]})
	}
	covered := "no rows"
	if len(e.rows) > 0 {
		covered = "rows " + rangeList(e.rows)
	}
	return fmt.Sprintf("%s: its slices cover %s; rows %s are missing", head, covered, rangeList(missing))
}

// rangeList lists ranges [start, end) as inclusive ones: "0-3, 7".
func rangeList(rs [][2]int64) string {
	parts := make([]string, len(rs))
	for i, r := range rs {
		parts[i] = fmt.Sprint(r[0])
		if r[1]-r[0] > 1 {
			parts[i] += fmt.Sprintf("-%d", r[1]-1)
		}
	}
	return strings.Join(parts, ", ")
}
