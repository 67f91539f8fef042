package summary

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	graphpb "github.com/wamuir/graft/tensorflow/core/framework/graph_go_proto"
	summarypb "github.com/wamuir/graft/tensorflow/core/framework/summary_go_proto"
	tensorpb "github.com/wamuir/graft/tensorflow/core/framework/tensor_go_proto"
	shapepb "github.com/wamuir/graft/tensorflow/core/framework/tensor_shape_go_proto"
	typespb "github.com/wamuir/graft/tensorflow/core/framework/types_go_proto"
	eventpb "github.com/wamuir/graft/tensorflow/core/util/event_go_proto"
	"google.golang.org/protobuf/proto"

	"github.com/tfdist/tfdist/dataset/tfrecord"
)

// FileVersion is the file_version of the first event of every event file,
// the version TensorBoard expects.
const FileVersion = "brain.Event:2"

// FilePrefix starts the name of every event file; TensorBoard looks for
// files whose names contain "tfevents".
const FilePrefix = "events.out.tfevents."

// ScalarsPlugin is the TensorBoard plugin that displays scalars: the
// plugin_name of the metadata of a scalar written in tensor form.
const ScalarsPlugin = "scalars"

// DefaultFlushInterval is how often a [Writer] flushes buffered events to its
// file unless told otherwise. TensorBoard polls its log directory every few
// seconds.
const DefaultFlushInterval = 5 * time.Second

// ErrClosed is returned by the methods of a [Writer] after Close.
var ErrClosed = errors.New("summary: writer is closed")

// Option configures a [Writer].
type Option func(*config)

type config struct {
	suffix string
	flush  time.Duration
	tensor bool
	now    func() time.Time
}

// WithFilenameSuffix appends suffix to the event file's name, as the
// filename_suffix of tf.summary.create_file_writer does (".v2", say). It must
// not contain a path separator.
func WithFilenameSuffix(suffix string) Option {
	return func(c *config) { c.suffix = suffix }
}

// WithFlushInterval sets how often a goroutine of the writer flushes
// buffered events to the file (default [DefaultFlushInterval]); Close stops
// it. An interval of 0 or less flushes after every event instead, without a
// goroutine.
func WithFlushInterval(d time.Duration) Option {
	return func(c *config) { c.flush = d }
}

// WithTensorScalars writes scalars as TensorFlow 2's tf.summary.scalar does:
// a float32 scalar tensor whose metadata names the "scalars" plugin, rather
// than the legacy simple_value that is the default. TensorBoard reads both.
func WithTensorScalars() Option {
	return func(c *config) { c.tensor = true }
}

// Writer appends events to one TensorBoard event file. It is safe for
// concurrent use. A nil *Writer discards every event and returns nil from
// every method, so a program can hand one to processes that must not write
// (the non-chief workers of a multi-worker job).
type Writer struct {
	path   string
	tensor bool
	now    func() time.Time

	mu     sync.Mutex
	f      *os.File
	buf    *bufio.Writer
	rec    *tfrecord.Writer
	dirty  bool  // events buffered since the last flush
	err    error // sticky: the first write or flush error
	closed bool

	stop chan struct{} // closed by Close to stop the flusher
	done chan struct{} // closed when the flusher has returned
}

// NewWriter creates logdir if needed and a new event file in it, named
// events.out.tfevents.<unix seconds>.<hostname><suffix>, and writes its first
// event (the file version). If a file of that name exists already (two
// writers started within one second), ".1", ".2", … is appended.
func NewWriter(logdir string, opts ...Option) (*Writer, error) {
	cfg := config{flush: DefaultFlushInterval, now: time.Now}
	for _, o := range opts {
		o(&cfg)
	}
	if logdir == "" {
		return nil, errors.New("summary: NewWriter: logdir is empty, expected a directory")
	}
	if strings.ContainsRune(cfg.suffix, '/') || strings.ContainsRune(cfg.suffix, filepath.Separator) {
		return nil, fmt.Errorf("summary: NewWriter: filename suffix %q contains a path separator", cfg.suffix)
	}
	if err := os.MkdirAll(logdir, 0o755); err != nil {
		return nil, fmt.Errorf("summary: NewWriter: %w", err)
	}
	host, err := os.Hostname()
	if err != nil || host == "" {
		host = "localhost"
	}
	start := cfg.now()
	base := fmt.Sprintf("%s%010d.%s%s", FilePrefix, start.Unix(), host, cfg.suffix)
	var f *os.File
	for i := 0; ; i++ {
		name := base
		if i > 0 {
			name = fmt.Sprintf("%s.%d", base, i)
		}
		f, err = os.OpenFile(filepath.Join(logdir, name), os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o644)
		if err == nil {
			break
		}
		if !errors.Is(err, os.ErrExist) || i >= 1000 {
			return nil, fmt.Errorf("summary: NewWriter: %w", err)
		}
	}
	w := &Writer{path: f.Name(), tensor: cfg.tensor, now: cfg.now, f: f}
	w.buf = bufio.NewWriterSize(f, 64<<10)
	w.rec = tfrecord.NewWriter(w.buf)
	first := &eventpb.Event{WallTime: wallTime(start), What: &eventpb.Event_FileVersion{FileVersion: FileVersion}}
	err = w.write(first)
	if err == nil {
		err = w.flushLocked()
	}
	if err != nil {
		f.Close()
		os.Remove(w.path)
		return nil, err
	}
	if cfg.flush > 0 {
		w.stop, w.done = make(chan struct{}), make(chan struct{})
		go w.flusher(cfg.flush)
	}
	return w, nil
}

// Path returns the event file's path ("" for a nil Writer).
func (w *Writer) Path() string {
	if w == nil {
		return ""
	}
	return w.path
}

// Scalar writes one scalar value at step under tag.
func (w *Writer) Scalar(step int64, tag string, value float64) error {
	if w == nil {
		return nil
	}
	if tag == "" {
		return errors.New("summary: Scalar: tag is empty")
	}
	return w.WriteEvent(&eventpb.Event{Step: step, What: &eventpb.Event_Summary{
		Summary: &summarypb.Summary{Value: []*summarypb.Summary_Value{w.scalarValue(tag, value)}},
	}})
}

// Scalars writes several scalar values at step as one event, in tag order.
// An empty map writes nothing.
func (w *Writer) Scalars(step int64, values map[string]float64) error {
	if w == nil || len(values) == 0 {
		return nil
	}
	tags := make([]string, 0, len(values))
	for tag := range values {
		if tag == "" {
			return errors.New("summary: Scalars: a tag is empty")
		}
		tags = append(tags, tag)
	}
	slices.Sort(tags)
	s := &summarypb.Summary{Value: make([]*summarypb.Summary_Value, len(tags))}
	for i, tag := range tags {
		s.Value[i] = w.scalarValue(tag, values[tag])
	}
	return w.WriteEvent(&eventpb.Event{Step: step, What: &eventpb.Event_Summary{Summary: s}})
}

func (w *Writer) scalarValue(tag string, value float64) *summarypb.Summary_Value {
	if !w.tensor {
		return &summarypb.Summary_Value{Tag: tag, Value: &summarypb.Summary_Value_SimpleValue{SimpleValue: float32(value)}}
	}
	return &summarypb.Summary_Value{
		Tag: tag,
		Metadata: &summarypb.SummaryMetadata{
			PluginData: &summarypb.SummaryMetadata_PluginData{PluginName: ScalarsPlugin},
			DataClass:  summarypb.DataClass_DATA_CLASS_SCALAR,
		},
		Value: &summarypb.Summary_Value_Tensor{Tensor: &tensorpb.TensorProto{
			Dtype:         typespb.DataType_DT_FLOAT,
			TensorShape:   &shapepb.TensorShapeProto{},
			TensorContent: binary.LittleEndian.AppendUint32(nil, math.Float32bits(float32(value))),
		}},
	}
}

// Graph writes def, a serialized GraphDef, as the graph TensorBoard's
// Graphs tab shows for this run.
func (w *Writer) Graph(def []byte) error {
	if w == nil {
		return nil
	}
	if len(def) == 0 {
		return errors.New("summary: Graph: empty GraphDef, expected a serialized one")
	}
	if err := proto.Unmarshal(def, &graphpb.GraphDef{}); err != nil {
		return fmt.Errorf("summary: Graph: %d bytes that are not a serialized GraphDef: %w", len(def), err)
	}
	return w.WriteEvent(&eventpb.Event{What: &eventpb.Event_GraphDef{GraphDef: def}})
}

// WriteEvent writes e as it is, except that a zero WallTime is replaced by
// the current time (in a copy: e is not modified). It is the way to write
// summaries that Scalar does not cover, such as histograms or text.
func (w *Writer) WriteEvent(e *eventpb.Event) error {
	if w == nil {
		return nil
	}
	if e == nil {
		return errors.New("summary: WriteEvent: nil event")
	}
	if e.WallTime == 0 {
		e = proto.Clone(e).(*eventpb.Event)
		e.WallTime = wallTime(w.now())
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.closed {
		return ErrClosed
	}
	if err := w.write(e); err != nil {
		return err
	}
	if w.stop == nil { // no flusher: flush after every event
		return w.flushLocked()
	}
	return nil
}

// write appends one event record; w.mu is held (or w is not yet shared).
func (w *Writer) write(e *eventpb.Event) error {
	if w.err != nil {
		return w.err
	}
	data, err := proto.MarshalOptions{Deterministic: true}.Marshal(e)
	if err != nil {
		return fmt.Errorf("summary: marshal event at step %d: %w", e.GetStep(), err)
	}
	if err := w.rec.Write(data); err != nil {
		w.err = fmt.Errorf("summary: write %s: %w", w.path, err)
		return w.err
	}
	w.dirty = true
	return nil
}

// Flush writes the buffered events to the file.
func (w *Writer) Flush() error {
	if w == nil {
		return nil
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.closed {
		return ErrClosed
	}
	return w.flushLocked()
}

func (w *Writer) flushLocked() error {
	if w.err != nil {
		return w.err
	}
	if !w.dirty {
		return nil
	}
	if err := w.buf.Flush(); err != nil {
		w.err = fmt.Errorf("summary: flush %s: %w", w.path, err)
		return w.err
	}
	w.dirty = false
	return nil
}

func (w *Writer) flusher(every time.Duration) {
	defer close(w.done)
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-w.stop:
			return
		case <-t.C:
			w.mu.Lock()
			if !w.closed {
				_ = w.flushLocked() // sticky: the next call reports it
			}
			w.mu.Unlock()
		}
	}
}

// Close flushes the buffered events, syncs the file to stable storage and
// closes it. It returns the first error the writer met, if any. Closing
// again returns nil.
func (w *Writer) Close() error {
	if w == nil {
		return nil
	}
	w.mu.Lock()
	if w.closed {
		w.mu.Unlock()
		return nil
	}
	w.closed = true
	w.mu.Unlock()
	if w.stop != nil {
		close(w.stop)
		<-w.done
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	err := w.flushLocked()
	if err == nil {
		if serr := w.f.Sync(); serr != nil {
			err = fmt.Errorf("summary: sync %s: %w", w.path, serr)
		}
	}
	if cerr := w.f.Close(); cerr != nil && err == nil {
		err = fmt.Errorf("summary: close %s: %w", w.path, cerr)
	}
	return err
}

// wallTime is t in seconds since the Unix epoch, as Event.wall_time holds it.
func wallTime(t time.Time) float64 {
	return float64(t.UnixNano()) / 1e9
}
