package checkpoint

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"sort"
	"strings"

	tf "github.com/wamuir/graft/tensorflow"

	"github.com/tfdist/tfdist/strategy"
)

// NameMap maps the names of a model's variables to the keys of the tensors
// of a checkpoint another program wrote: Python's tf.train.Checkpoint
// (object-based keys such as
// "model/_functional/_operations/1/_kernel/.ATTRIBUTES/VARIABLE_VALUE"),
// TensorFlow 1's name-based Saver ("dense/kernel"), or another tfdist job.
// CompareNames lists both sides to write one.
type NameMap map[string]string

// WarmStart restores the variables that names maps from the checkpoint at
// prefix, as tf.keras' warm start does: every other variable keeps its
// value, and tensors of the checkpoint that names does not take are
// ignored. A name of the map that is not a variable of the model, a key the
// checkpoint does not hold, a dtype or shape that differs, or a tensor
// saved as slices that do not cover it (*IncompleteError) is an error
// naming the variable, before any variable changes. Options are NewSaver's.
//
// Keras 3 writes model.save_weights as HDF5 (.weights.h5), which this does
// not read: write a TensorFlow checkpoint with
// tf.train.Checkpoint(model=model).write(prefix) instead.
func WarmStart(ctx context.Context, src Source, prefix string, names NameMap, opts ...Option) error {
	s, err := NewSaver(src, opts...)
	if err != nil {
		return err
	}
	ix, err := readIndex(prefix)
	if err != nil {
		return err
	}
	items, err := warmPlan(prefix, ix, s.st.Saveables(), names)
	if err != nil {
		return err
	}
	if len(items) == 0 {
		return nil
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	g, err := s.buildRestore(items, nil, nil)
	if err != nil {
		return err
	}
	pt, err := tf.NewTensor(prefix)
	if err != nil {
		return fmt.Errorf("checkpoint: warm start from %s: %w", prefix, err)
	}
	if _, err := s.st.Run(ctx, map[tf.Output]*tf.Tensor{g.prefix: pt}, nil, []*tf.Operation{g.target}, func() {
		for _, done := range g.done {
			done()
		}
	}); err != nil {
		return fmt.Errorf("checkpoint: warm start from %s: %w", prefix, err)
	}
	return nil
}

// warmPlan returns the model's saveables that names maps, each renamed to
// its checkpoint key, after checking them against the checkpoint.
func warmPlan(prefix string, ix *index, model []strategy.Saveable, names NameMap) ([]strategy.Saveable, error) {
	merr := &MismatchError{Prefix: prefix}
	byName := map[string]strategy.Saveable{}
	for _, v := range model {
		byName[v.Name] = v
	}
	var unknown, missing []string
	var items []strategy.Saveable
	for _, name := range slices.Sorted(maps.Keys(names)) {
		key := names[name]
		v, ok := byName[name]
		if !ok {
			unknown = append(unknown, name)
			continue
		}
		ent, ok := ix.entries[key]
		if !ok {
			missing = append(missing, fmt.Sprintf("%q (for variable %q)", key, name))
			continue
		}
		if !ent.fits(v) {
			merr.Mismatched = append(merr.Mismatched, Mismatch{Name: name, CheckpointDType: ent.DType,
				CheckpointShape: ent.Shape, ModelDType: v.DType, ModelShape: v.Shape})
			continue
		}
		if err := ent.complete(prefix); err != nil {
			return nil, err
		}
		v.Name = key
		items = append(items, v)
	}
	if len(unknown) > 0 {
		return nil, fmt.Errorf("checkpoint: warm start from %s: the name map names %s, which the model does not have (its variables: %s)",
			prefix, quoteList(unknown), quoteList(slices.Sorted(maps.Keys(byName))))
	}
	if len(missing) > 0 {
		return nil, fmt.Errorf("checkpoint: warm start from %s: the checkpoint holds no tensor %s (list its tensors with List or CompareNames)",
			prefix, strings.Join(missing, ", "))
	}
	if len(merr.Mismatched) > 0 {
		return nil, merr
	}
	return items, nil
}

// NameReport lists a model's variables and a checkpoint's tensors side by
// side, for writing a NameMap.
type NameReport struct {
	// Model and Checkpoint list every variable of the model and every
	// tensor of the checkpoint (its object graph and tfdist's metadata
	// aside), sorted by name.
	Model, Checkpoint []Entry
	// UnmatchedModel lists the variables the map does not restore;
	// UnmatchedCheckpoint, the tensors it does not take.
	UnmatchedModel, UnmatchedCheckpoint []Entry
}

// String lists the unmatched entries of both sides.
func (r *NameReport) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "%d of %d model variables unmatched:\n", len(r.UnmatchedModel), len(r.Model))
	for _, e := range r.UnmatchedModel {
		fmt.Fprintf(&b, "  %s\n", e)
	}
	fmt.Fprintf(&b, "%d of %d checkpoint tensors unmatched:\n", len(r.UnmatchedCheckpoint), len(r.Checkpoint))
	for _, e := range r.UnmatchedCheckpoint {
		fmt.Fprintf(&b, "  %s\n", e)
	}
	return b.String()
}

// CompareNames lists src's variables and the tensors of the checkpoint at
// prefix, and which of each names leaves unmatched.
func CompareNames(src Source, prefix string, names NameMap) (*NameReport, error) {
	if src == nil || src.State() == nil {
		return nil, fmt.Errorf("checkpoint: CompareNames: nil strategy")
	}
	entries, err := List(prefix)
	if err != nil {
		return nil, err
	}
	taken := map[string]bool{}
	for _, key := range names {
		taken[key] = true
	}
	r := &NameReport{}
	for _, v := range src.State().Saveables() {
		e := Entry{Name: v.Name, DType: v.DType, Shape: v.Shape}
		r.Model = append(r.Model, e)
		if _, ok := names[v.Name]; !ok {
			r.UnmatchedModel = append(r.UnmatchedModel, e)
		}
	}
	sort.Slice(r.Model, func(i, j int) bool { return r.Model[i].Name < r.Model[j].Name })
	sort.Slice(r.UnmatchedModel, func(i, j int) bool { return r.UnmatchedModel[i].Name < r.UnmatchedModel[j].Name })
	for _, e := range entries {
		if e.Name == objectGraphKey || strings.HasPrefix(e.Name, MetadataPrefix) || strings.HasPrefix(e.Name, CopiesPrefix) {
			continue
		}
		r.Checkpoint = append(r.Checkpoint, e)
		if !taken[e.Name] {
			r.UnmatchedCheckpoint = append(r.UnmatchedCheckpoint, e)
		}
	}
	return r, nil
}

// objectGraphKey is the tensor in which Python's tf.train.Checkpoint keeps
// its object graph.
const objectGraphKey = "_CHECKPOINTABLE_OBJECT_GRAPH"
