package notebooks_test

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// notebook is the part of the .ipynb format the test reads.
type notebook struct {
	Cells []struct {
		CellType       string          `json:"cell_type"`
		Source         json.RawMessage `json:"source"`
		ExecutionCount *int            `json:"execution_count"`
		Outputs        []struct {
			OutputType string          `json:"output_type"`
			Name       string          `json:"name"`
			Text       json.RawMessage `json:"text"`
			EName      string          `json:"ename"`
			EValue     string          `json:"evalue"`
		} `json:"outputs"`
	} `json:"cells"`
	Metadata struct {
		Kernelspec struct {
			Name string `json:"name"`
		} `json:"kernelspec"`
	} `json:"metadata"`
}

// text joins a notebook string field, stored as a string or a list of lines.
func text(raw json.RawMessage) string {
	var lines []string
	if json.Unmarshal(raw, &lines) == nil {
		return strings.Join(lines, "")
	}
	var s string
	_ = json.Unmarshal(raw, &s)
	return s
}

func readNotebook(t *testing.T, path string) notebook {
	t.Helper()
	data, err := os.ReadFile(path)
	require.NoError(t, err)
	var nb notebook
	require.NoError(t, json.Unmarshal(data, &nb), path)
	return nb
}

// stdout is everything a notebook's code cells printed.
func (nb notebook) stdout() string {
	var b strings.Builder
	for _, c := range nb.Cells {
		for _, o := range c.Outputs {
			if o.OutputType == "stream" && o.Name == "stdout" {
				b.WriteString(text(o.Text))
			}
		}
	}
	return b.String()
}

// checks holds, per notebook, what its outputs must show.
var checks = map[string]func(t *testing.T, out string){
	"mirrored_quickstart.ipynb": func(t *testing.T, out string) {
		assert.Contains(t, out, "replicas in sync: 2")
		assert.Contains(t, out, "global batch 64 = 2 replicas × 32 examples")
		var losses []float64
		for _, m := range regexp.MustCompile(`(?m)^step +\d+/300  loss (\d+\.\d+)`).FindAllStringSubmatch(out, -1) {
			l, err := strconv.ParseFloat(m[1], 64)
			require.NoError(t, err)
			losses = append(losses, l)
		}
		require.GreaterOrEqual(t, len(losses), 6, "a progress line every 50 of 300 steps, and the final one")
		assert.Less(t, losses[len(losses)-1], losses[0]/3, "the loss falls: %v", losses)
		assert.Regexp(t, `loss fell from \d+\.\d+ to \d+\.\d+`, out)
		assert.GreaterOrEqual(t, accuracy(t, out), 0.9)
		assert.Contains(t, out, "the 2 copies of each of the 4 variables are identical")
		assert.Regexp(t, `events\.out\.tfevents\.\d+\.\S+: 300 scalars, step 1 loss`, out)
	},
	"dataset_sharding.ipynb": func(t *testing.T, out string) {
		for _, line := range []string{
			"2 workers × 2 replicas = 4 replicas in sync",
			"global batch 8 = 4 per worker = 2 per replica",
			// DATA: worker w keeps the ids ≡ w mod 2, split among its replicas.
			"worker 0 step 0:  replica 0 [0 2]  replica 1 [4 6]  (counts [2 2], global count 8)",
			"worker 1 step 0:  replica 0 [1 3]  replica 1 [5 7]  (counts [2 2], global count 8)",
			// The partial final batch: 5 examples, split as evenly as possible.
			"worker 0 step 2:  replica 0 [16 18]  replica 1 [20]  (counts [2 1], global count 5)",
			"worker 1 step 2:  replica 0 [17]  replica 1 [19]  (counts [1 1], global count 5)",
			"step 0: union of the replicas [0 1 2 3 4 5 6 7], global batch [0 1 2 3 4 5 6 7], equal: true",
			"step 2: union of the replicas [16 17 18 19 20], global batch [16 17 18 19 20], equal: true",
			// FILE: worker 0 reads part-0 and part-2, worker 1 part-1 and part-3.
			"worker 0 step 0:  replica 0 [0 1]  replica 1 [2 3]  (counts [2 2], global count 8)",
			"worker 0 step 1:  replica 0 [4 10]  replica 1 [11 12]  (counts [2 2], global count 8)",
			"worker 1 step 0:  replica 0 [5 6]  replica 1 [7 8]  (counts [2 2], global count 8)",
			"AUTO chose DATA",
			"AUTO chose FILE",
			// DistributeFromFunction: the data runs out mid-step.
			"worker 1 step 2:  replica 0 [17 19]  replica 1 []  (counts [2 0], global count 6)",
		} {
			assert.Contains(t, out, line+"\n")
		}
		assert.Regexp(t, `(?m)^global batch 6: .*divide`, out, "a global batch the replicas cannot share is refused")
		assert.NotContains(t, out, "equal: false")
	},
}

func accuracy(t *testing.T, out string) float64 {
	t.Helper()
	m := regexp.MustCompile(`held-out accuracy (\d\.\d+)`).FindStringSubmatch(out)
	require.NotNil(t, m, "no accuracy line in:\n%s", out)
	a, err := strconv.ParseFloat(m[1], 64)
	require.NoError(t, err)
	return a
}

// The notebooks run headlessly on the Go kernel with tfdist compiled in,
// every cell succeeds and prints what the walkthrough promises, and the
// outputs saved in the committed notebooks are those of a real run. A
// notebook whose cell fails makes the run fail, naming it.
//
// scripts/notebooks.sh installs what it needs the first time (Jupyter's
// runner from the Python package index, gophernotes from the Go module
// proxy) and builds the kernel; later runs take a minute or less.
func TestNotebooks(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: skipping the notebooks, which build a Jupyter kernel")
	}
	root, err := filepath.Abs(filepath.Join("..", ".."))
	require.NoError(t, err)
	committed, err := filepath.Glob("*.ipynb")
	require.NoError(t, err)
	require.NotEmpty(t, committed)
	for _, name := range committed {
		require.Contains(t, checks, name, "every notebook has its checks")
	}

	// A notebook whose second cell fails, run with the others: the run
	// must fail because of it, and only it.
	bad := filepath.Join(t.TempDir(), "broken.ipynb")
	require.NoError(t, os.WriteFile(bad, []byte(brokenNotebook), 0o644))

	out := t.TempDir()
	ctx, cancel := context.WithTimeout(context.Background(), testTimeout(t))
	defer cancel()
	args := append([]string{filepath.Join(root, "scripts", "notebooks.sh"), "-o", out}, committed...)
	cmd := exec.CommandContext(ctx, "bash", append(args, bad)...)
	var log bytes.Buffer
	cmd.Stdout, cmd.Stderr = &log, &log
	err = cmd.Run()
	require.Error(t, err, "a failed cell must fail the run:\n%s", log.String())
	var exit *exec.ExitError
	require.ErrorAs(t, err, &exit, "the script did not run to the end:\n%s", log.String())
	failed := regexp.MustCompile(`(?m)^notebooks\.sh: FAILED: (.*)$`).FindAllStringSubmatch(log.String(), -1)
	require.Len(t, failed, 1, "only the broken notebook fails:\n%s", log.String())
	assert.Equal(t, bad, failed[0][1])
	assert.Contains(t, log.String(), "deliberate failure", "the failing cell's error is shown")

	for _, name := range committed {
		t.Run(name, func(t *testing.T) {
			fresh := readNotebook(t, filepath.Join(out, name))
			saved := readNotebook(t, name)
			assert.Equal(t, "tfdist-go", saved.Metadata.Kernelspec.Name)
			require.Equal(t, len(saved.Cells), len(fresh.Cells))
			for i, c := range fresh.Cells {
				if c.CellType != "code" {
					continue
				}
				src := text(c.Source)
				assert.NotNil(t, c.ExecutionCount, "cell %d ran:\n%s", i, src)
				assert.NotNil(t, saved.Cells[i].ExecutionCount, "cell %d has saved outputs (run scripts/notebooks.sh --inplace):\n%s", i, src)
				assert.Equal(t, src, text(saved.Cells[i].Source), "cell %d", i)
				for _, o := range c.Outputs {
					assert.NotEqual(t, "error", o.OutputType, "cell %d failed: %s %s", i, o.EName, o.EValue)
				}
			}
			t.Run("fresh", func(t *testing.T) { checks[name](t, fresh.stdout()) })
			t.Run("saved", func(t *testing.T) { checks[name](t, saved.stdout()) })
		})
	}
	// The saved accuracy is the one a run gets (up to float summation order
	// on another machine).
	fresh := readNotebook(t, filepath.Join(out, "mirrored_quickstart.ipynb")).stdout()
	saved := readNotebook(t, "mirrored_quickstart.ipynb").stdout()
	assert.InDelta(t, accuracy(t, fresh), accuracy(t, saved), 0.01)
}

// testTimeout leaves the test a minute to report before go test's deadline.
func testTimeout(t *testing.T) time.Duration {
	if d, ok := t.Deadline(); ok {
		return time.Until(d) - time.Minute
	}
	return time.Hour
}

const brokenNotebook = `{
 "cells": [
  {"cell_type": "code", "execution_count": null, "metadata": {}, "outputs": [],
   "source": ["import \"errors\""]},
  {"cell_type": "code", "execution_count": null, "metadata": {}, "outputs": [],
   "source": ["panic(errors.New(\"deliberate failure\"))"]},
  {"cell_type": "code", "execution_count": null, "metadata": {}, "outputs": [],
   "source": ["println(\"not reached\")"]}
 ],
 "metadata": {"kernelspec": {"display_name": "Go (tfdist)", "language": "go", "name": "tfdist-go"}},
 "nbformat": 4,
 "nbformat_minor": 5
}
`
