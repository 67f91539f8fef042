package checkpoint

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"os"
	"slices"
	"sort"

	"github.com/tfdist/tfdist/internal/graphutil"
	"github.com/tfdist/tfdist/strategy"
	tf "github.com/wamuir/graft/tensorflow"
	tspb "github.com/wamuir/graft/tensorflow/core/framework/tensor_slice_go_proto"
	pb "github.com/wamuir/graft/tensorflow/core/protobuf/for_core_protos_go_proto"
	"google.golang.org/protobuf/proto"
)

// This file reads the index of a checkpoint: <prefix>.index, a table in
// TensorFlow's SSTable format (tsl/lib/io/table) mapping each tensor name to
// a BundleEntryProto (dtype, shape and where its bytes lie in the data
// files), with a BundleHeaderProto under the empty key. Only the index is
// read in Go — to list a checkpoint and to check it against a model before
// restoring; tensor data is always read by TensorFlow's RestoreV2 kernel.

// Entry describes one tensor of a checkpoint.
type Entry struct {
	// Name is the tensor's key: a variable's name, or MetadataPrefix+key
	// for metadata.
	Name string
	// DType is the tensor's element type.
	DType tf.DataType
	// Shape is the tensor's shape.
	Shape []int64

	slices [][]extent // the slices the tensor was saved as; nil if saved whole
}

// extent is the range [start, end) of one dimension that a slice holds.
type extent struct{ start, end int64 }

// String returns the name, type and shape.
func (e Entry) String() string {
	return fmt.Sprintf("%s:%s%v", e.Name, graphutil.DTypeName(e.DType), e.Shape)
}

// fits reports whether the tensor can restore v: the same dtype and
// shape, but for the first dimension where v takes any number of rows.
func (e Entry) fits(v strategy.Saveable) bool {
	if e.DType != v.DType || len(e.Shape) != len(v.Shape) {
		return false
	}
	if v.AnyRows && len(v.Shape) > 0 {
		return slices.Equal(e.Shape[1:], v.Shape[1:])
	}
	return slices.Equal(e.Shape, v.Shape)
}

// index is what a checkpoint's index file holds.
type index struct {
	numShards int
	entries   map[string]Entry
}

// List returns the tensors of the checkpoint at prefix, sorted by name, as
// tf.train.list_variables does. Metadata tensors are included, under
// MetadataPrefix.
func List(prefix string) ([]Entry, error) {
	ix, err := readIndex(prefix)
	if err != nil {
		return nil, err
	}
	out := make([]Entry, 0, len(ix.entries))
	for _, e := range ix.entries {
		out = append(out, e)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out, nil
}

// IndexFile returns the name of the index file of the checkpoint at prefix.
func IndexFile(prefix string) string { return prefix + ".index" }

// DataFile returns the name of data file shard of numShards of the
// checkpoint at prefix, e.g. <prefix>.data-00000-of-00001.
func DataFile(prefix string, shard, numShards int) string {
	return fmt.Sprintf("%s.data-%05d-of-%05d", prefix, shard, numShards)
}

// ErrCorrupt is wrapped by errors about an index file that cannot be parsed.
var ErrCorrupt = errors.New("corrupt checkpoint index")

func readIndex(prefix string) (*index, error) {
	name := IndexFile(prefix)
	b, err := os.ReadFile(name)
	if err != nil {
		return nil, fmt.Errorf("checkpoint: read index: %w", err)
	}
	ix, err := parseIndex(b)
	if err != nil {
		return nil, fmt.Errorf("checkpoint: %s: %w", name, err)
	}
	return ix, nil
}

const (
	footerLen         = 48 // two block handles padded to 20 bytes each, then the magic
	blockTrailerLen   = 5  // compression type, masked crc32c
	tableMagic        = 0xdb4775248b80fb57
	crcMaskDelta      = 0xa282ead8
	compressionNone   = 0
	compressionSnappy = 1
)

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

func unmaskCRC(m uint32) uint32 {
	rot := m - crcMaskDelta
	return rot>>17 | rot<<15
}

func corrupt(format string, args ...any) error {
	return fmt.Errorf("%w: %s", ErrCorrupt, fmt.Sprintf(format, args...))
}

// parseIndex decodes an index file. It never panics on bad input.
func parseIndex(b []byte) (*index, error) {
	if len(b) < footerLen {
		return nil, corrupt("%d bytes, shorter than the %d-byte table footer", len(b), footerLen)
	}
	footer := b[len(b)-footerLen:]
	if m := binary.LittleEndian.Uint64(footer[40:]); m != tableMagic {
		return nil, corrupt("bad table magic %#x (is it a checkpoint index?)", m)
	}
	_, _, n, err := blockHandle(footer) // the metaindex, empty in TensorFlow's bundles
	if err != nil {
		return nil, err
	}
	ixBlock, err := readBlock(b, footer[n:])
	if err != nil {
		return nil, fmt.Errorf("index block: %w", err)
	}
	ix := &index{entries: map[string]Entry{}}
	sawHeader := false
	err = blockEntries(ixBlock, func(_ []byte, handle []byte) error {
		data, err := readBlock(b, handle)
		if err != nil {
			return fmt.Errorf("data block: %w", err)
		}
		return blockEntries(data, func(key, value []byte) error {
			if len(key) == 0 {
				var h pb.BundleHeaderProto
				if err := proto.Unmarshal(value, &h); err != nil {
					return corrupt("header: %v", err)
				}
				ix.numShards = int(h.GetNumShards())
				sawHeader = true
				return nil
			}
			if key[0] == 0 {
				return nil // the entry of one slice of a partitioned tensor
			}
			var e pb.BundleEntryProto
			if err := proto.Unmarshal(value, &e); err != nil {
				return corrupt("entry %q: %v", key, err)
			}
			shape := []int64{}
			for _, d := range e.GetShape().GetDim() {
				shape = append(shape, d.GetSize())
			}
			name := string(key)
			sl, err := entrySlices(name, shape, e.GetSlices())
			if err != nil {
				return err
			}
			ix.entries[name] = Entry{Name: name, DType: tf.DataType(e.GetDtype()), Shape: shape, slices: sl}
			return nil
		})
	})
	if err != nil {
		return nil, err
	}
	if !sawHeader {
		return nil, corrupt("no bundle header")
	}
	if ix.numShards < 1 {
		return nil, corrupt("header says %d data shards", ix.numShards)
	}
	return ix, nil
}

// entrySlices returns the extents of the slices of the tensor name of
// shape, as its entry lists them; an extent without a length (or with
// length -1) spans its whole dimension.
func entrySlices(name string, shape []int64, pbs []*tspb.TensorSliceProto) ([][]extent, error) {
	var out [][]extent
	for i, p := range pbs {
		if len(p.GetExtent()) != len(shape) {
			return nil, corrupt("entry %q: slice %d has %d extents for %d dimensions", name, i, len(p.GetExtent()), len(shape))
		}
		ext := make([]extent, len(shape))
		for d, e := range p.GetExtent() {
			ext[d] = extent{0, shape[d]}
			if e.GetHasLength() != nil && e.GetLength() != -1 {
				ext[d] = extent{e.GetStart(), e.GetStart() + e.GetLength()}
			}
			if x := ext[d]; x.start < 0 || x.end < x.start || x.end > shape[d] {
				return nil, corrupt("entry %q: slice %d: extent [%d, %d) of dimension %d of size %d", name, i, x.start, x.end, d, shape[d])
			}
		}
		out = append(out, ext)
	}
	return out, nil
}

// blockHandle decodes a BlockHandle (varint64 offset, varint64 size).
func blockHandle(b []byte) (off, size uint64, n int, err error) {
	off, n1 := binary.Uvarint(b)
	if n1 <= 0 {
		return 0, 0, 0, corrupt("bad block handle")
	}
	size, n2 := binary.Uvarint(b[n1:])
	if n2 <= 0 {
		return 0, 0, 0, corrupt("bad block handle")
	}
	return off, size, n1 + n2, nil
}

// readBlock returns the contents of the block handle points at, after
// checking its checksum.
func readBlock(file, handle []byte) ([]byte, error) {
	off, size, _, err := blockHandle(handle)
	if err != nil {
		return nil, err
	}
	if off > uint64(len(file)) || size > uint64(len(file))-off || uint64(len(file))-off-size < blockTrailerLen {
		return nil, corrupt("block [%d, +%d) beyond the end of the file (%d bytes)", off, size, len(file))
	}
	body := file[off : off+size+1] // contents and compression type
	want := unmaskCRC(binary.LittleEndian.Uint32(file[off+size+1:]))
	if got := crc32.Checksum(body, castagnoli); got != want {
		return nil, corrupt("block at %d: checksum %#08x, expected %#08x", off, got, want)
	}
	switch body[size] {
	case compressionNone:
		return body[:size], nil
	case compressionSnappy:
		return nil, corrupt("block at %d is snappy-compressed, which TensorFlow's checkpoint writer never does", off)
	default:
		return nil, corrupt("block at %d: unknown compression %d", off, body[size])
	}
}

// blockEntries calls fn with each key and value of a block, in order. Keys
// are prefix-compressed against the previous key.
func blockEntries(block []byte, fn func(key, value []byte) error) error {
	if len(block) < 4 {
		return corrupt("block of %d bytes", len(block))
	}
	restarts := uint64(binary.LittleEndian.Uint32(block[len(block)-4:]))
	if (restarts+1)*4 > uint64(len(block)) {
		return corrupt("block claims %d restart points in %d bytes", restarts, len(block))
	}
	end := len(block) - int(restarts+1)*4
	var key []byte
	for p := 0; p < end; {
		var v [3]uint64
		for i := range v {
			x, n := binary.Uvarint(block[p:end])
			if n <= 0 {
				return corrupt("bad entry header at %d", p)
			}
			v[i] = x
			p += n
		}
		shared, unshared, vlen := v[0], v[1], v[2]
		if shared > uint64(len(key)) || unshared > uint64(end-p) || vlen > uint64(end-p)-unshared {
			return corrupt("entry at %d overruns its block", p)
		}
		key = append(key[:shared], block[p:p+int(unshared)]...)
		p += int(unshared)
		if err := fn(append([]byte(nil), key...), block[p:p+int(vlen)]); err != nil {
			return err
		}
		p += int(vlen)
	}
	return nil
}
