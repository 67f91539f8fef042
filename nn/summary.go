package nn

import (
	"fmt"
	"strconv"
	"strings"
	"text/tabwriter"

	"github.com/tfdist/tfdist/strategy"
)

// Summary returns the model's layers as Keras' model.summary() prints
// them: each input and layer with its type, output shape (None: the
// batch), parameter count and the layers it takes its inputs from, then
// the totals of every variable, trainable and not.
func (m *Model) Summary() string {
	var sb strings.Builder
	fmt.Fprintf(&sb, "Model: %q\n", m.name)
	w := tabwriter.NewWriter(&sb, 0, 0, 3, ' ', 0)
	rule := strings.Repeat("─", 96)
	fmt.Fprintln(&sb, rule)
	fmt.Fprintln(w, "Layer (type)\tOutput Shape\tParam #\tConnected to\t")
	for _, in := range m.inputs {
		fmt.Fprintf(w, "%s (input)\t%s\t0\t\t\n", m.names[in], shapeString(in.shape))
	}
	for _, l := range m.layers {
		fmt.Fprintf(w, "%s (%s)\t%s\t%s\t%s\t\n", m.shortName(l), l.kind, m.layerShape(l),
			commas(countParams(l.vars)), strings.Join(m.sources(l), ", "))
	}
	w.Flush()
	all := m.Variables()
	trainable := countParams(m.Vars())
	total := countParams(all)
	fmt.Fprintln(&sb, rule)
	fmt.Fprintf(&sb, "Total params: %s\nTrainable params: %s\nNon-trainable params: %s\n",
		commas(total), commas(trainable), commas(total-trainable))
	return sb.String()
}

// shortName returns l's name without the model's prefix.
func (m *Model) shortName(l *builtLayer) string { return strings.TrimPrefix(l.name, m.name+"/") }

// layerShape returns the output shape of l, "multiple" for a layer
// called on inputs of different shapes.
func (m *Model) layerShape(l *builtLayer) string {
	shape := ""
	for _, t := range m.calls {
		if m.built[t] != l {
			continue
		}
		s := shapeString(m.shapes[t])
		if shape != "" && s != shape {
			return "multiple"
		}
		shape = s
	}
	return shape
}

// sources returns the names of the inputs and layers whose outputs l's
// calls take.
func (m *Model) sources(l *builtLayer) []string {
	var out []string
	for _, t := range m.calls {
		if m.built[t] != l {
			continue
		}
		for _, x := range t.call.inputs {
			if name, ok := m.names[x]; ok {
				out = append(out, name)
			} else {
				out = append(out, m.shortName(m.built[x]))
			}
		}
	}
	return out
}

// shapeString writes a shape as Keras does: (None, 8, 8, 16).
func shapeString(shape []int64) string {
	parts := []string{"None"}
	for _, d := range shape {
		if d < 0 {
			parts = append(parts, "None")
		} else {
			parts = append(parts, strconv.FormatInt(d, 10))
		}
	}
	return "(" + strings.Join(parts, ", ") + ")"
}

// countParams returns the number of elements of vs.
func countParams(vs []strategy.Variable) int64 {
	n := int64(0)
	for _, v := range vs {
		n += prod(v.Shape())
	}
	return n
}

// commas writes n with thousands separators: 1,234,567.
func commas(n int64) string {
	s := strconv.FormatInt(n, 10)
	for i := len(s) - 3; i > 0; i -= 3 {
		s = s[:i] + "," + s[i:]
	}
	return s
}
