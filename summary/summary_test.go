package summary_test

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"math"
	"os"
	"path/filepath"
	"regexp"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	tf "github.com/wamuir/graft/tensorflow"
	summarypb "github.com/wamuir/graft/tensorflow/core/framework/summary_go_proto"
	eventpb "github.com/wamuir/graft/tensorflow/core/util/event_go_proto"
	"google.golang.org/protobuf/proto"

	"github.com/tfdist/tfdist/dataset/tfrecord"
	"github.com/tfdist/tfdist/summary"
)

// logged is what the tests log: a falling loss and a rising accuracy, with
// values that float32 does not hold exactly.
type point struct {
	step  int64
	tag   string
	value float64
}

func logRun(t *testing.T, w *summary.Writer, steps int) []point {
	t.Helper()
	var pts []point
	for step := int64(1); step <= int64(steps); step++ {
		loss := 2.3 / float64(step)
		require.NoError(t, w.Scalar(step, "loss", loss))
		pts = append(pts, point{step, "loss", loss})
		if step%5 == 0 {
			acc, lr := 1-1/float64(step+1), 0.1*math.Pow(0.9, float64(step))
			require.NoError(t, w.Scalars(step, map[string]float64{"accuracy": acc, "lr": lr}))
			pts = append(pts, point{step, "accuracy", acc}, point{step, "lr", lr})
		}
	}
	return pts
}

// An event file read back holds the file version first, then exactly the
// scalars that were logged, in order, at float32 precision, with wall times
// of when they were written — in both scalar forms.
func TestScalarsReadBackAsLogged(t *testing.T) {
	for _, form := range []struct {
		name string
		opts []summary.Option
	}{{"simple_value", nil}, {"tensor", []summary.Option{summary.WithTensorScalars()}}} {
		t.Run(form.name, func(t *testing.T) {
			dir := filepath.Join(t.TempDir(), "run")
			before := time.Now()
			w, err := summary.NewWriter(dir, form.opts...)
			require.NoError(t, err)
			pts := logRun(t, w, 20)
			require.NoError(t, w.Close())
			after := time.Now()

			host, _ := os.Hostname()
			files, err := summary.EventFiles(dir)
			require.NoError(t, err)
			require.Equal(t, []string{w.Path()}, files)
			assert.Regexp(t, `^events\.out\.tfevents\.\d{10}\.`+regexp.QuoteMeta(host)+`$`, filepath.Base(w.Path()))

			events, err := summary.ReadEvents(w.Path())
			require.NoError(t, err)
			require.NotEmpty(t, events)
			assert.Equal(t, summary.FileVersion, events[0].GetFileVersion())
			assert.Equal(t, "brain.Event:2", events[0].GetFileVersion())

			got, err := summary.ReadScalars(w.Path())
			require.NoError(t, err)
			require.Len(t, got, len(pts))
			for i, p := range pts {
				assert.Equal(t, p.step, got[i].Step, "scalar %d", i)
				assert.Equal(t, p.tag, got[i].Tag, "scalar %d", i)
				assert.Equal(t, float64(float32(p.value)), got[i].Value, "scalar %d (%s at step %d)", i, p.tag, p.step)
				assert.False(t, got[i].WallTime.Before(before.Truncate(time.Microsecond)), "wall time %v before the run", got[i].WallTime)
				assert.False(t, got[i].WallTime.After(after), "wall time %v after the run", got[i].WallTime)
			}
		})
	}
}

// The framing of every record is TensorFlow's, checked here by an
// implementation written from tensorflow/core/lib/io/record_writer.cc and
// tensorflow/core/lib/hash/crc32c.h rather than by package tfrecord.
func TestRecordsFollowTensorFlowFraming(t *testing.T) {
	w, err := summary.NewWriter(t.TempDir())
	require.NoError(t, err)
	logRun(t, w, 10)
	require.NoError(t, w.Close())
	data, err := os.ReadFile(w.Path())
	require.NoError(t, err)

	table := crc32.MakeTable(crc32.Castagnoli)
	masked := func(b []byte) uint32 {
		c := crc32.Checksum(b, table)
		return ((c >> 15) | (c << 17)) + 0xa282ead8
	}
	var events []*eventpb.Event
	for off := 0; off < len(data); {
		require.GreaterOrEqual(t, len(data)-off, 12, "header at %d", off)
		n := int(binary.LittleEndian.Uint64(data[off:]))
		require.Equal(t, masked(data[off:off+8]), binary.LittleEndian.Uint32(data[off+8:]), "length crc at %d", off)
		body := data[off+12 : off+12+n]
		require.Equal(t, masked(body), binary.LittleEndian.Uint32(data[off+12+n:]), "data crc at %d", off)
		e := new(eventpb.Event)
		require.NoError(t, proto.Unmarshal(body, e))
		events = append(events, e)
		off += 12 + n + 4
	}
	require.Len(t, events, 1+10+2)
	assert.Equal(t, "brain.Event:2", events[0].GetFileVersion())
	assert.Equal(t, "loss", events[1].GetSummary().GetValue()[0].GetTag())
	assert.Equal(t, float32(2.3), events[1].GetSummary().GetValue()[0].GetSimpleValue())
}

// A damaged record is reported with its byte offset, never returned as data.
func TestReaderRejectsDamagedRecords(t *testing.T) {
	w, err := summary.NewWriter(t.TempDir())
	require.NoError(t, err)
	logRun(t, w, 3)
	require.NoError(t, w.Close())
	data, err := os.ReadFile(w.Path())
	require.NoError(t, err)
	fr := tfrecord.NewReader(bytes.NewReader(data))
	_, err = fr.Next()
	require.NoError(t, err)
	first := int(fr.Offset()) // where the second record starts

	bad := append([]byte(nil), data...)
	bad[first+14] ^= 0x40 // inside the second record's data
	path := filepath.Join(t.TempDir(), "damaged")
	require.NoError(t, os.WriteFile(path, bad, 0o644))
	_, err = summary.ReadScalars(path)
	require.ErrorIs(t, err, tfrecord.ErrCorrupt)
	var ce *tfrecord.CorruptError
	require.ErrorAs(t, err, &ce)
	assert.Equal(t, int64(first), ce.Offset)
	assert.Contains(t, err.Error(), path)

	r := summary.NewReader(bytes.NewReader(data[:len(data)-3])) // truncated last record
	var n int
	for {
		_, err := r.Next()
		if err != nil {
			require.ErrorIs(t, err, io.ErrUnexpectedEOF)
			break
		}
		n++
	}
	assert.Equal(t, len(mustEvents(t, w.Path()))-1, n, "every complete record before the truncated one is read")

	garbage := tfrecord.AppendRecord(nil, []byte{0xff, 0xff, 0xff})
	_, err = summary.NewReader(bytes.NewReader(garbage)).Next()
	require.Error(t, err)
	assert.Contains(t, err.Error(), "not a tensorflow.Event")
}

// Writers in many goroutines interleave whole events: every scalar is read
// back once, none torn.
func TestConcurrentWriters(t *testing.T) {
	w, err := summary.NewWriter(t.TempDir(), summary.WithFlushInterval(time.Millisecond))
	require.NoError(t, err)
	const goroutines, each = 8, 200
	var wg sync.WaitGroup
	for g := range goroutines {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range each {
				assert.NoError(t, w.Scalar(int64(i), fmt.Sprintf("worker%d", g), float64(g*each+i)))
				if i%50 == 0 {
					assert.NoError(t, w.Flush())
				}
			}
		}()
	}
	wg.Wait()
	require.NoError(t, w.Close())
	got, err := summary.ReadScalars(w.Path())
	require.NoError(t, err)
	require.Len(t, got, goroutines*each)
	seen := map[string]int64{}
	for _, s := range got {
		want := seen[s.Tag]
		assert.Equal(t, want, s.Step, "%s steps in order", s.Tag)
		assert.Equal(t, float64(int(s.Tag[len("worker")]-'0')*each+int(s.Step)), s.Value)
		seen[s.Tag]++
	}
	assert.Len(t, seen, goroutines)
}

// Events become visible in the file while the writer is open: at once after
// Flush, and within the flush interval without it.
func TestFlushMakesEventsVisible(t *testing.T) {
	w, err := summary.NewWriter(t.TempDir(), summary.WithFlushInterval(time.Hour))
	require.NoError(t, err)
	defer w.Close()
	got, err := summary.ReadScalars(w.Path())
	require.NoError(t, err)
	assert.Empty(t, got, "the file version is written at once, without scalars")
	require.NoError(t, w.Scalar(1, "loss", 0.5))
	require.NoError(t, w.Flush())
	got, err = summary.ReadScalars(w.Path())
	require.NoError(t, err)
	require.Len(t, got, 1)

	w2, err := summary.NewWriter(t.TempDir(), summary.WithFlushInterval(10*time.Millisecond))
	require.NoError(t, err)
	defer w2.Close()
	require.NoError(t, w2.Scalar(7, "loss", 0.25))
	assert.Eventually(t, func() bool {
		got, err := summary.ReadScalars(w2.Path())
		return err == nil && len(got) == 1 && got[0].Step == 7
	}, 5*time.Second, 10*time.Millisecond)

	w3, err := summary.NewWriter(t.TempDir(), summary.WithFlushInterval(0))
	require.NoError(t, err)
	defer w3.Close()
	require.NoError(t, w3.Scalar(3, "loss", 1))
	got, err = summary.ReadScalars(w3.Path())
	require.NoError(t, err)
	assert.Len(t, got, 1, "an interval of 0 flushes every event")
}

// Two writers started in the same second in one directory get two files;
// TensorBoard reads both as one run.
func TestWritersInOneDirectoryDoNotCollide(t *testing.T) {
	dir := t.TempDir()
	var paths []string
	for i := range 3 {
		w, err := summary.NewWriter(dir, summary.WithFilenameSuffix(".v2"))
		require.NoError(t, err)
		require.NoError(t, w.Scalar(int64(i), "loss", float64(i)))
		require.NoError(t, w.Close())
		paths = append(paths, w.Path())
	}
	files, err := summary.EventFiles(dir)
	require.NoError(t, err)
	assert.ElementsMatch(t, paths, files)
	for i, p := range paths {
		got, err := summary.ReadScalars(p)
		require.NoError(t, err)
		require.Len(t, got, 1, p)
		assert.Equal(t, int64(i), got[0].Step)
	}
}

// WriteEvent writes other summaries untouched, stamping a missing wall time
// on a copy.
func TestWriteEvent(t *testing.T) {
	w, err := summary.NewWriter(t.TempDir())
	require.NoError(t, err)
	e := &eventpb.Event{Step: 9, What: &eventpb.Event_Summary{Summary: &summarypb.Summary{Value: []*summarypb.Summary_Value{
		{Tag: "note", Value: &summarypb.Summary_Value_ObsoleteOldStyleHistogram{ObsoleteOldStyleHistogram: []byte("x")}},
	}}}}
	require.NoError(t, w.WriteEvent(e))
	assert.Zero(t, e.GetWallTime(), "the caller's event is not modified")
	require.NoError(t, w.Close())
	events := mustEvents(t, w.Path())
	require.Len(t, events, 2)
	assert.Equal(t, int64(9), events[1].GetStep())
	assert.NotZero(t, events[1].GetWallTime())
	assert.Equal(t, "note", events[1].GetSummary().GetValue()[0].GetTag())
	got, err := summary.ReadScalars(w.Path())
	require.NoError(t, err)
	assert.Empty(t, got, "a non-scalar value is not read as a scalar")
}

// Graph writes the GraphDef it is given as the event's graph_def, which
// TensorFlow reads back as the graph.
func TestGraph(t *testing.T) {
	w, err := summary.NewWriter(t.TempDir())
	require.NoError(t, err)
	def := smallGraph(t)
	require.NoError(t, w.Graph(def))
	require.NoError(t, w.Close())
	events := mustEvents(t, w.Path())
	require.Len(t, events, 2)
	assert.Equal(t, def, events[1].GetGraphDef())
	g := tf.NewGraph()
	require.NoError(t, g.Import(events[1].GetGraphDef(), ""))
	assert.NotNil(t, g.Operation("y"))
}

// smallGraph is the GraphDef of y = x², nodes "x" and "y".
func smallGraph(t *testing.T) []byte {
	t.Helper()
	g := tf.NewGraph()
	x, err := g.AddOperation(tf.OpSpec{Type: "Placeholder", Name: "x", Attrs: map[string]any{"dtype": tf.Float}})
	require.NoError(t, err)
	_, err = g.AddOperation(tf.OpSpec{Type: "Square", Name: "y", Input: []tf.Input{x.Output(0)}})
	require.NoError(t, err)
	var buf bytes.Buffer
	_, err = g.WriteTo(&buf)
	require.NoError(t, err)
	return buf.Bytes()
}

// A nil writer is what non-chief workers hold: every call is a no-op.
func TestNilWriterDiscards(t *testing.T) {
	var w *summary.Writer
	assert.NoError(t, w.Scalar(1, "loss", 1))
	assert.NoError(t, w.Scalars(1, map[string]float64{"a": 1}))
	assert.NoError(t, w.WriteEvent(&eventpb.Event{}))
	assert.NoError(t, w.Graph(nil))
	assert.NoError(t, w.Flush())
	assert.NoError(t, w.Close())
	assert.Empty(t, w.Path())
}

// Bad input and use after Close are errors that say what is wrong.
func TestErrors(t *testing.T) {
	_, err := summary.NewWriter("")
	assert.ErrorContains(t, err, "logdir is empty")
	_, err = summary.NewWriter(t.TempDir(), summary.WithFilenameSuffix("a/b"))
	assert.ErrorContains(t, err, `suffix "a/b"`)
	file := filepath.Join(t.TempDir(), "file")
	require.NoError(t, os.WriteFile(file, nil, 0o644))
	_, err = summary.NewWriter(filepath.Join(file, "sub"))
	assert.Error(t, err, "a log directory under a regular file")

	w, err := summary.NewWriter(t.TempDir())
	require.NoError(t, err)
	assert.ErrorContains(t, w.Scalar(1, "", 1), "tag is empty")
	assert.ErrorContains(t, w.Scalars(1, map[string]float64{"": 1}), "tag is empty")
	assert.ErrorContains(t, w.WriteEvent(nil), "nil event")
	assert.ErrorContains(t, w.Graph(nil), "empty GraphDef")
	assert.ErrorContains(t, w.Graph([]byte{0xff}), "1 bytes that are not a serialized GraphDef")
	require.NoError(t, w.Close())
	assert.NoError(t, w.Close(), "Close is idempotent")
	assert.ErrorIs(t, w.Scalar(2, "loss", 1), summary.ErrClosed)
	assert.ErrorIs(t, w.Flush(), summary.ErrClosed)

	_, err = summary.EventFiles(t.TempDir())
	assert.ErrorIs(t, err, os.ErrNotExist)
	_, err = summary.ReadScalars(filepath.Join(t.TempDir(), "missing"))
	assert.True(t, errors.Is(err, os.ErrNotExist))
}

// Tensor-form scalars of every dtype TensorFlow writes are read, and only
// those tagged for the scalars plugin.
func TestScalarValueForms(t *testing.T) {
	w, err := summary.NewWriter(t.TempDir(), summary.WithTensorScalars())
	require.NoError(t, err)
	require.NoError(t, w.Scalar(1, "x", 0.75))
	require.NoError(t, w.Close())
	events := mustEvents(t, w.Path())
	v := events[1].GetSummary().GetValue()[0]
	got, ok := summary.ScalarValue(v)
	require.True(t, ok)
	assert.Equal(t, 0.75, got)
	assert.Equal(t, summary.ScalarsPlugin, v.GetMetadata().GetPluginData().GetPluginName())

	other := proto.Clone(v).(*summarypb.Summary_Value)
	other.Metadata.PluginData.PluginName = "histograms"
	_, ok = summary.ScalarValue(other)
	assert.False(t, ok, "a tensor of another plugin is not a scalar")
	_, ok = summary.ScalarValue(&summarypb.Summary_Value{Tag: "empty"})
	assert.False(t, ok)
}

func mustEvents(t *testing.T, path string) []*eventpb.Event {
	t.Helper()
	events, err := summary.ReadEvents(path)
	require.NoError(t, err)
	return events
}
