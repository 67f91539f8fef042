package train

import (
	"bufio"
	"bytes"
	"context"
	"encoding/csv"
	"errors"
	"fmt"
	"maps"
	"os"
	"slices"
	"strconv"
)

// CSVLogger writes each epoch's logs to a CSV file, as Keras's CSVLogger:
// a header "epoch" and the log keys in order, then a row per epoch (its
// number from 0, its values; "NA" for a key the epoch lacks). It writes
// only on the chief.
//
// Each row is written in one write and synced before the next epoch
// starts, so a crash loses at most the epoch it interrupts. A key that
// first appears after the first row (validation every n-th epoch) adds a
// column: the file is rewritten, atomically, with "NA" in the earlier
// rows.
//
// Without CSVAppend it truncates the file when training begins; with it,
// it continues the file under its header.
type CSVLogger struct {
	BaseCallback
	path   string
	append bool
	sep    rune
	keys   []string // the columns after "epoch"; nil before the first row
}

// CSVOption configures a CSVLogger.
type CSVOption func(*CSVLogger)

// CSVAppend continues the file under its header instead of truncating it.
func CSVAppend() CSVOption { return func(c *CSVLogger) { c.append = true } }

// CSVSeparator sets the field separator (default ',').
func CSVSeparator(sep rune) CSVOption { return func(c *CSVLogger) { c.sep = sep } }

// NewCSVLogger returns a CSVLogger writing to the file at path.
func NewCSVLogger(path string, opts ...CSVOption) *CSVLogger {
	c := &CSVLogger{path: path, sep: ','}
	for _, o := range opts {
		o(c)
	}
	return c
}

// Name names the callback in errors.
func (c *CSVLogger) Name() string { return "CSVLogger" }

// OnTrainBegin implements Callback: it truncates the file, or reads the
// header of the file it appends to.
func (c *CSVLogger) OnTrainBegin(_ context.Context, r *Run) error {
	if c.path == "" {
		return errors.New("empty path, expected a file")
	}
	if _, err := c.encode([][]string{{"epoch"}}); err != nil {
		return fmt.Errorf("CSVSeparator(%q), expected a character other than a quote, a line break or NUL", c.sep)
	}
	c.keys = nil
	if !r.IsChief() {
		return nil
	}
	if !c.append {
		return os.WriteFile(c.path, nil, 0o644)
	}
	rows, err := c.read()
	if err != nil || len(rows) == 0 {
		return err
	}
	if len(rows[0]) == 0 || rows[0][0] != "epoch" {
		return fmt.Errorf("CSVAppend: %s has the header %q, expected one starting with \"epoch\"", c.path, rows[0])
	}
	c.keys = rows[0][1:]
	return nil
}

// OnEpochEnd implements Callback: it appends the epoch's row.
func (c *CSVLogger) OnEpochEnd(_ context.Context, r *Run, epoch int, logs Logs) error {
	if !r.IsChief() {
		return nil
	}
	var header bool
	switch {
	case c.keys == nil:
		c.keys, header = slices.Sorted(maps.Keys(logs)), true
	case !c.has(logs):
		if err := c.addColumns(logs); err != nil {
			return err
		}
	}
	row := []string{strconv.Itoa(epoch)}
	for _, k := range c.keys {
		row = append(row, formatCSV(logs, k))
	}
	var rows [][]string
	if header {
		rows = append(rows, append([]string{"epoch"}, c.keys...))
	}
	return c.appendRows(append(rows, row))
}

// has reports whether every key of logs has a column.
func (c *CSVLogger) has(logs Logs) bool {
	for k := range logs {
		if !slices.Contains(c.keys, k) {
			return false
		}
	}
	return true
}

// addColumns rewrites the file with a column for every key of logs,
// "NA" in the rows there are.
func (c *CSVLogger) addColumns(logs Logs) error {
	rows, err := c.read()
	if err != nil {
		return err
	}
	keys := slices.Clone(c.keys)
	for k := range logs {
		if !slices.Contains(keys, k) {
			keys = append(keys, k)
		}
	}
	slices.Sort(keys)
	out := [][]string{append([]string{"epoch"}, keys...)}
	if len(rows) > 0 {
		rows = rows[1:] // the old header
	}
	for _, row := range rows {
		old := map[string]string{}
		for i, k := range c.keys {
			if i+1 < len(row) {
				old[k] = row[i+1]
			}
		}
		next := []string{row[0]}
		for _, k := range keys {
			v, ok := old[k]
			if !ok {
				v = "NA"
			}
			next = append(next, v)
		}
		out = append(out, next)
	}
	c.keys = keys
	return c.replace(out)
}

func formatCSV(logs Logs, key string) string {
	v, ok := logs[key]
	if !ok {
		return "NA"
	}
	return strconv.FormatFloat(v, 'g', -1, 64)
}

// read returns the file's rows; none when it does not exist.
func (c *CSVLogger) read() ([][]string, error) {
	f, err := os.Open(c.path)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	defer f.Close()
	cr := csv.NewReader(bufio.NewReader(f))
	cr.Comma, cr.FieldsPerRecord = c.sep, -1
	rows, err := cr.ReadAll()
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", c.path, err)
	}
	return rows, nil
}

func (c *CSVLogger) encode(rows [][]string) ([]byte, error) {
	var buf bytes.Buffer
	w := csv.NewWriter(&buf)
	w.Comma = c.sep
	if err := w.WriteAll(rows); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

// appendRows appends rows to the file in one write and syncs it.
func (c *CSVLogger) appendRows(rows [][]string) error {
	data, err := c.encode(rows)
	if err != nil {
		return err
	}
	f, err := os.OpenFile(c.path, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o644)
	if err != nil {
		return err
	}
	_, err = f.Write(data)
	if err == nil {
		err = f.Sync()
	}
	return errors.Join(err, f.Close())
}

// replace writes the file anew: into a temporary file beside it, synced,
// then renamed over it.
func (c *CSVLogger) replace(rows [][]string) error {
	data, err := c.encode(rows)
	if err != nil {
		return err
	}
	tmp := c.path + ".tmp"
	f, err := os.Create(tmp)
	if err != nil {
		return err
	}
	_, err = f.Write(data)
	if err == nil {
		err = f.Sync()
	}
	if err = errors.Join(err, f.Close()); err == nil {
		err = os.Rename(tmp, c.path)
	}
	if err != nil {
		os.Remove(tmp)
	}
	return err
}
