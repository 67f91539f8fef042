package dataset

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync/atomic"

	tf "github.com/wamuir/graft/tensorflow"
	"go.uber.org/zap"

	"github.com/tfdist/tfdist/dataset/tfrecord"
)

// CorruptPolicy says what a TFRecord source does with a corrupt or truncated
// record.
type CorruptPolicy int

const (
	// FailOnCorrupt ends the pass with an error naming the file and the byte
	// offset of the bad record (the default).
	FailOnCorrupt CorruptPolicy = iota
	// SkipCorrupt skips the bad record, counts it in Stats and logs it at
	// warn level with its file and offset. When the damage is to a record's
	// length, the record boundaries after it cannot be trusted and the rest
	// of that file is skipped (and counted) as one corrupt record.
	SkipCorrupt
)

// String returns the policy's name.
func (p CorruptPolicy) String() string {
	switch p {
	case FailOnCorrupt:
		return "fail"
	case SkipCorrupt:
		return "skip"
	}
	return fmt.Sprintf("CorruptPolicy(%d)", int(p))
}

// RecordOption configures TFRecordFiles and TFRecordFile.
type RecordOption interface{ applyRecord(*recordConfig) }

type recordConfig struct {
	policy      CorruptPolicy
	compression tfrecord.Compression
	maxSize     int64
	log         *zap.Logger
	counter     *RecordCounter
}

// newRecordConfig applies opts to the defaults, for the source named what.
func newRecordConfig(what string, opts []RecordOption) (recordConfig, error) {
	cfg := recordConfig{maxSize: tfrecord.DefaultMaxRecordSize, log: zap.NewNop()}
	for _, o := range opts {
		o.applyRecord(&cfg)
	}
	if cfg.policy != FailOnCorrupt && cfg.policy != SkipCorrupt {
		return cfg, fmt.Errorf("dataset: %s: %w: corrupt policy %v", what, ErrInvalidArgument, cfg.policy)
	}
	if cfg.compression != tfrecord.NoCompression && cfg.compression != tfrecord.GZIP && cfg.compression != tfrecord.ZLIB {
		return cfg, fmt.Errorf("dataset: %s: %w: compression %v, expected none, GZIP or ZLIB", what, ErrInvalidArgument, cfg.compression)
	}
	return cfg, nil
}

type recordOptionFunc func(*recordConfig)

func (f recordOptionFunc) applyRecord(c *recordConfig) { f(c) }

// WithCorruptPolicy sets what happens to corrupt records (default
// FailOnCorrupt).
func WithCorruptPolicy(p CorruptPolicy) RecordOption {
	return recordOptionFunc(func(c *recordConfig) { c.policy = p })
}

// WithCompression reads files compressed with c (tfrecord.GZIP or
// tfrecord.ZLIB), as tf.data.TFRecordDataset(files, compression_type=...)
// does; every file of the source must be. Corrupt records are detected as
// in plain files; damage to the compressed stream itself loses the rest of
// the file (skipped under SkipCorrupt, and counted as one corrupt record
// of no known size).
func WithCompression(c tfrecord.Compression) RecordOption {
	return recordOptionFunc(func(cfg *recordConfig) { cfg.compression = c })
}

// WithMaxRecordSize sets the largest record accepted (default
// tfrecord.DefaultMaxRecordSize); a longer one is corrupt.
func WithMaxRecordSize(n int64) RecordOption {
	return recordOptionFunc(func(c *recordConfig) { c.maxSize = n })
}

// SharedOption is an option that applies to TFRecordFiles, Zip, Distribute
// and DistributeFromFunction alike.
type SharedOption interface {
	RecordOption
	DistributeOption
	ZipOption
}

type loggerOption struct{ l *zap.Logger }

func (o loggerOption) applyRecord(c *recordConfig)   { c.log = o.l }
func (o loggerOption) applyDistribute(c *distConfig) { c.log = o.l }
func (o loggerOption) applyZip(c *zipConfig)         { c.log = o.l }

// WithLogger sets the logger (default zap.NewNop()).
func WithLogger(l *zap.Logger) SharedOption {
	if l == nil {
		l = zap.NewNop()
	}
	return loggerOption{l}
}

// RecordStats counts what the passes over a TFRecord source have read, summed
// over every pass and every copy made by Distribute.
type RecordStats struct {
	// Records is the number of records read successfully.
	Records int64
	// Corrupt is the number of corrupt records skipped under SkipCorrupt
	// (a damaged tail of a file counts as one).
	Corrupt int64
	// SkippedBytes is the number of bytes those corrupt records spanned
	// (decompressed bytes in a compressed file, where the lost rest of a
	// damaged stream counts none).
	SkippedBytes int64
}

type recordStats struct{ records, corrupt, skipped atomic.Int64 }

func (s *recordStats) add(records, corrupt, skipped int64) {
	s.records.Add(records)
	if corrupt != 0 {
		s.corrupt.Add(corrupt)
		s.skipped.Add(skipped)
	}
}

func (s *recordStats) snapshot() RecordStats {
	return RecordStats{Records: s.records.Load(), Corrupt: s.corrupt.Load(), SkippedBytes: s.skipped.Load()}
}

// RecordCounter sums the RecordStats of every TFRecord source given it with
// WithRecordCounter: for example the one-file sources that an Interleave
// function opens, whose own Stats each count one file. It is safe for
// concurrent use; the zero value counts from zero.
type RecordCounter struct{ s recordStats }

// Stats returns the counts so far.
func (c *RecordCounter) Stats() RecordStats { return c.s.snapshot() }

// WithRecordCounter counts what a TFRecord source reads and skips in c as
// well as in its own Stats.
func WithRecordCounter(c *RecordCounter) RecordOption {
	return recordOptionFunc(func(cfg *recordConfig) { cfg.counter = c })
}

// TFRecordDataset is a dataset of the records of TFRecord files, read in
// order: file after file, record after record. Each element holds one record
// as a scalar string tensor named RecordKey. Its files are what Distribute
// divides among workers under FILE sharding.
type TFRecordDataset struct {
	files []string
	cfg   recordConfig
	stats *recordStats
}

// TFRecordFiles returns the dataset of the records of the files that patterns
// name. A pattern is a file, a directory (its regular files, in name order,
// without those whose name starts with a dot) or a filepath.Match glob (its
// matches in name order). Files are read in the order of the patterns, each
// at most once.
//
// It fails when a named file or directory does not exist, or when a pattern
// matches no file; the files themselves are opened when a pass reaches them,
// and one that has vanished by then ends the pass with an error naming it.
func TFRecordFiles(patterns []string, opts ...RecordOption) (*TFRecordDataset, error) {
	cfg, err := newRecordConfig("TFRecordFiles", opts)
	if err != nil {
		return nil, err
	}
	files, err := expandPatterns(patterns)
	if err != nil {
		return nil, fmt.Errorf("dataset: TFRecordFiles: %w", err)
	}
	return &TFRecordDataset{files: files, cfg: cfg, stats: new(recordStats)}, nil
}

// TFRecordFile returns the dataset of the records of the file name, as
// tf.data's TFRecordDataset(name): the name is taken as it is, not expanded
// as a pattern, and the file is opened when a pass starts (a missing file
// fails the pass, naming it). It is what an Interleave function returns for
// each name of a ListFiles, with the options of TFRecordFiles; give every
// file one WithRecordCounter to count them together.
func TFRecordFile(name string, opts ...RecordOption) (*TFRecordDataset, error) {
	cfg, err := newRecordConfig("TFRecordFile", opts)
	if err != nil {
		return nil, err
	}
	if name == "" {
		return nil, fmt.Errorf("dataset: TFRecordFile: %w: empty file name", ErrInvalidArgument)
	}
	return &TFRecordDataset{files: []string{name}, cfg: cfg, stats: new(recordStats)}, nil
}

// Files returns the files the dataset reads, in order.
func (d *TFRecordDataset) Files() []string { return slices.Clone(d.files) }

// Stats returns the counts of records read and skipped so far.
func (d *TFRecordDataset) Stats() RecordStats { return d.stats.snapshot() }

// count adds to the dataset's counts and to its counter's.
func (d *TFRecordDataset) count(records, corrupt, skipped int64) {
	d.stats.add(records, corrupt, skipped)
	if c := d.cfg.counter; c != nil {
		c.s.add(records, corrupt, skipped)
	}
}

// Iterator implements Dataset.
func (d *TFRecordDataset) Iterator(ctx context.Context) (Iterator, error) { return iterate(ctx, d) }
func (d *TFRecordDataset) input() Dataset                                 { return nil }
func (d *TFRecordDataset) withInput(Dataset) node                         { return d }
func (d *TFRecordDataset) open(context.Context) (hostIter, error) {
	return &recordIter{d: d}, nil
}

func (d *TFRecordDataset) fileNames() []string { return d.files }

// shardFiles returns a copy reading files i with i mod n == index.
func (d *TFRecordDataset) shardFiles(n, index int) node {
	c := *d
	c.files = everyNth(d.files, n, index)
	return &c
}

// everyNth returns the files i with i mod n == index.
func everyNth(files []string, n, index int) []string {
	var out []string
	for i, f := range files {
		if i%n == index {
			out = append(out, f)
		}
	}
	return out
}

// FilenameKey is the name of the value of the elements of ListFiles: a file
// name as a scalar string tensor.
const FilenameKey = "filename"

// ListFiles returns a dataset of the names of the files that patterns match
// (files, directories or globs, expanded as TFRecordFiles expands them, each
// file once), one scalar string FilenameKey per element, sorted across all
// the patterns as tf.data's list_files(patterns, shuffle=False) sorts them:
// the input of an Interleave that reads many files at once. Unlike tf.data's
// list_files it does not shuffle unless told to, with ShuffleFiles. Under
// FILE sharding, each worker lists its share of the sorted names (and
// shuffles that).
func ListFiles(patterns []string, opts ...ListOption) (Dataset, error) {
	var cfg listConfig
	for _, o := range opts {
		o(&cfg)
	}
	files, err := expandPatterns(patterns)
	if err != nil {
		return nil, fmt.Errorf("dataset: ListFiles: %w", err)
	}
	slices.Sort(files)
	var ds Dataset = &fileListDS{files: files}
	if cfg.shuffle {
		ds = Shuffle(ds, max(len(files), 1), cfg.seed)
	}
	return ds, nil
}

// ListOption configures ListFiles.
type ListOption func(*listConfig)

type listConfig struct {
	shuffle bool
	seed    uint64
}

// ShuffleFiles shuffles the names of ListFiles, in a new order in each pass,
// as tf.data's list_files(patterns, seed=seed) does: Shuffle over all of
// them, seeded by seed, so the orders are the same in every run and process.
func ShuffleFiles(seed uint64) ListOption {
	return func(c *listConfig) { c.shuffle, c.seed = true, seed }
}

type fileListDS struct{ files []string }

func (d *fileListDS) Iterator(ctx context.Context) (Iterator, error) { return iterate(ctx, d) }
func (d *fileListDS) input() Dataset                                 { return nil }
func (d *fileListDS) withInput(Dataset) node                         { return d }
func (d *fileListDS) fileNames() []string                            { return d.files }
func (d *fileListDS) shardFiles(n, index int) node {
	return &fileListDS{files: everyNth(d.files, n, index)}
}
func (d *fileListDS) open(context.Context) (hostIter, error) {
	return &fileListIter{files: d.files}, nil
}

type fileListIter struct {
	files []string
	i     int
}

func (it *fileListIter) next(context.Context) (hostElem, error) {
	if it.i == len(it.files) {
		return hostElem{}, io.EOF
	}
	f := it.files[it.i]
	it.i++
	return hostElem{cols: []namedColumn{{FilenameKey, column{dtype: tf.String, data: []string{f}}}}, origin: origin{file: f}}, nil
}

func (it *fileListIter) close() error { return nil }

func expandPatterns(patterns []string) ([]string, error) {
	if len(patterns) == 0 {
		return nil, fmt.Errorf("%w: no file patterns", ErrInvalidArgument)
	}
	var files []string
	seen := make(map[string]bool)
	add := func(f string) {
		if !seen[f] {
			seen[f] = true
			files = append(files, f)
		}
	}
	for _, p := range patterns {
		if strings.ContainsAny(p, `*?[`) {
			matches, err := filepath.Glob(p)
			if err != nil {
				return nil, fmt.Errorf("pattern %q: %w", p, err)
			}
			n := 0
			for _, m := range matches { // Glob sorts its matches
				fi, err := os.Stat(m)
				if err != nil {
					return nil, fmt.Errorf("pattern %q: %w", p, err)
				}
				if fi.Mode().IsRegular() {
					add(m)
					n++
				}
			}
			if n == 0 {
				return nil, fmt.Errorf("pattern %q: %w: it matches no regular file", p, ErrNoFiles)
			}
			continue
		}
		fi, err := os.Stat(p)
		if err != nil {
			return nil, fmt.Errorf("file %q: %w", p, err)
		}
		if !fi.IsDir() {
			add(p)
			continue
		}
		entries, err := os.ReadDir(p) // sorted by name
		if err != nil {
			return nil, fmt.Errorf("directory %q: %w", p, err)
		}
		n := 0
		for _, e := range entries {
			if strings.HasPrefix(e.Name(), ".") || !e.Type().IsRegular() {
				continue
			}
			add(filepath.Join(p, e.Name()))
			n++
		}
		if n == 0 {
			return nil, fmt.Errorf("directory %q: %w: it holds no regular file", p, ErrNoFiles)
		}
	}
	return files, nil
}

type recordIter struct {
	d        *TFRecordDataset
	nextFile int // index of the next file to open
	file     string
	f        *os.File
	r        *tfrecord.Reader
	s        sticky
}

func (it *recordIter) next(ctx context.Context) (hostElem, error) {
	rec, o, err := it.nextRecord(ctx)
	if err != nil {
		return hostElem{}, err
	}
	return hostElem{cols: []namedColumn{{RecordKey, column{dtype: tf.String, data: []string{string(rec)}}}}, origin: o}, nil
}

// nextRecord returns the next record, valid until the next call, and where
// it starts.
func (it *recordIter) nextRecord(ctx context.Context) ([]byte, origin, error) {
	if it.s.err != nil {
		return nil, origin{}, it.s.err
	}
	for {
		if err := ctx.Err(); err != nil {
			return nil, origin{}, err
		}
		if it.r == nil {
			if err := it.openNext(); err != nil {
				return nil, origin{}, it.s.fail(ctx, err)
			}
		}
		off := it.r.Offset()
		rec, err := it.r.Next()
		switch {
		case err == nil:
			it.d.count(1, 0, 0)
			return rec, origin{file: it.file, offset: off}, nil
		case err == io.EOF:
			err = it.closeFile()
		default:
			err = it.skip(err)
		}
		if err != nil {
			return nil, origin{}, it.s.fail(ctx, err)
		}
	}
}

// openNext opens the next file, or returns io.EOF after the last.
func (it *recordIter) openNext() error {
	if it.nextFile >= len(it.d.files) {
		return io.EOF
	}
	it.file = it.d.files[it.nextFile]
	it.nextFile++
	f, err := os.Open(it.file)
	if err != nil {
		return fmt.Errorf("dataset: TFRecord file: %w", err)
	}
	it.f = f
	it.r = tfrecord.NewReader(f, tfrecord.WithMaxRecordSize(it.d.cfg.maxSize), tfrecord.WithCompression(it.d.cfg.compression))
	return nil
}

// skip deals with a record that could not be read: under SkipCorrupt a
// corrupt one is counted, logged and skipped (with the rest of its file when
// the record boundaries are lost); any other error is returned, naming the
// file.
func (it *recordIter) skip(err error) error {
	var ce *tfrecord.CorruptError
	if !errors.As(err, &ce) || it.d.cfg.policy == FailOnCorrupt {
		return fmt.Errorf("dataset: TFRecord file %s: %w", it.file, err)
	}
	skipped := it.r.Offset() - ce.Offset
	if !ce.Recoverable {
		skipped = 0 // the lost rest of a compressed file has no known size
		if fi, err := it.f.Stat(); err == nil && it.d.cfg.compression == tfrecord.NoCompression {
			skipped = fi.Size() - ce.Offset
		}
	}
	it.d.count(0, 1, skipped)
	it.d.cfg.log.Warn("skipping corrupt TFRecord record",
		zap.String("file", it.file), zap.Int64("offset", ce.Offset),
		zap.Int64("bytes_skipped", skipped), zap.Bool("rest_of_file", !ce.Recoverable),
		zap.String("reason", ce.Reason))
	if !ce.Recoverable {
		return it.closeFile()
	}
	return nil
}

func (it *recordIter) closeFile() error {
	if it.f == nil {
		return nil
	}
	_ = it.r.Close() // its buffer goes to the next file's reader
	err := it.f.Close()
	it.f, it.r = nil, nil
	if err != nil {
		return fmt.Errorf("dataset: close %s: %w", it.file, err)
	}
	return nil
}

func (it *recordIter) close() error { return it.closeFile() }
