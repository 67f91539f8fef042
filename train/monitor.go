package train

import (
	"fmt"
	"maps"
	"math"
	"slices"
	"strings"
)

// DefaultMonitor is the log key EarlyStopping and ModelCheckpoint watch
// when Monitor is empty, as in Keras.
const DefaultMonitor = "val_loss"

// monitor is the quantity EarlyStopping and ModelCheckpoint watch: a key
// of the logs, and whether larger values are better.
type monitor struct {
	key  string
	max  bool
	seen bool // some logs had the key
}

// newMonitor resolves Monitor and Mode: "min", "max", or "auto" (or ""),
// which maximizes a key whose name (without "val_") contains "acc" or
// "auc" and minimizes any other.
func newMonitor(key, mode string) (monitor, error) {
	if key == "" {
		key = DefaultMonitor
	}
	m := monitor{key: key}
	switch mode {
	case "", "auto":
		name := strings.TrimPrefix(key, "val_")
		m.max = strings.Contains(name, "acc") || strings.Contains(name, "auc")
	case "min":
	case "max":
		m.max = true
	default:
		return m, fmt.Errorf("unknown Mode %q, expected \"auto\", \"min\" or \"max\"", mode)
	}
	return m, nil
}

// worst is the value every other improves on.
func (m monitor) worst() float64 {
	if m.max {
		return math.Inf(-1)
	}
	return math.Inf(1)
}

// improves reports whether v is better than ref by more than delta (>= 0).
// NaN improves on nothing.
func (m monitor) improves(v, ref, delta float64) bool {
	if m.max {
		return v-delta > ref
	}
	return v+delta < ref
}

// value returns the monitored value of logs, the logs of what ("epoch 3").
// At an epoch's end (epochEnd) an epoch that did not validate has no
// "val_" keys: a validation key is then skipped (ok false, no error). A
// key missing otherwise is an error naming the keys there are, since a
// misspelt key would silently disable the callback.
func (m *monitor) value(logs Logs, what string, epochEnd bool) (v float64, ok bool, err error) {
	if v, ok := logs[m.key]; ok {
		m.seen = true
		return v, true, nil
	}
	if epochEnd && strings.HasPrefix(m.key, "val_") && !validated(logs) {
		return 0, false, nil
	}
	return 0, false, fmt.Errorf("no Monitor %q in the logs of %s, which have %s", m.key, what, logKeys(logs))
}

// validated is the error of a monitor of a validation key in a Fit that
// has no validation data.
func (m *monitor) validated(r *Run) error {
	if strings.HasPrefix(m.key, "val_") && r.ValidationFreq == 0 {
		return fmt.Errorf("the Monitor %q is a validation log, and Fit has no ValidationData", m.key)
	}
	return nil
}

// check is the error, at the end of training, of a monitor no logs had: a
// validation key when no epoch validated.
func (m *monitor) check() error {
	if m.seen {
		return nil
	}
	return fmt.Errorf("no epoch's logs had Monitor %q: no epoch validated (does Fit have ValidationData?)", m.key)
}

// validated reports whether logs hold validation results.
func validated(logs Logs) bool {
	for k := range logs {
		if strings.HasPrefix(k, "val_") {
			return true
		}
	}
	return false
}

// logKeys lists the keys of logs, sorted, for errors.
func logKeys(logs Logs) string {
	keys := slices.Sorted(maps.Keys(logs))
	if len(keys) == 0 {
		return "no key"
	}
	return strings.Join(keys, ", ")
}
