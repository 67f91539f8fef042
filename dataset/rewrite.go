package dataset

import "fmt"

// pipeline returns the stages of ds from the outermost to its source (or to
// the first dataset not built by this package).
func pipeline(ds Dataset) []Dataset {
	chain := []Dataset{ds}
	for {
		n, ok := ds.(node)
		if !ok || n.input() == nil {
			return chain
		}
		ds = n.input()
		chain = append(chain, ds)
	}
}

// rebuild copies a pipeline from its source up, giving every stage fresh
// per-pass state; replace, when set, may substitute each stage as it is
// rebuilt (i indexes chain).
func rebuild(chain []Dataset, replace func(i int, d Dataset) Dataset) Dataset {
	last := len(chain) - 1
	cur := chain[last]
	if m, ok := cur.(multi); ok {
		ins := m.inputs()
		for j, in := range ins {
			ins[j] = rebuild(pipeline(in), nil)
		}
		cur = m.withInputs(ins)
	}
	if replace != nil {
		cur = replace(last, cur)
	}
	for i := last - 1; i >= 0; i-- {
		var d Dataset = chain[i].(node).withInput(cur)
		if replace != nil {
			d = replace(i, d)
		}
		cur = d
	}
	return cur
}

// batcher is a stage that makes batches of a size FILE sharding can
// change: Batched, PaddedBatch, Rebatch.
type batcher interface {
	node
	batchSize() int
	resized(n int) node
}

// findBatch returns the index in chain of the stage that makes the global
// batches (Batched, PaddedBatch or Rebatch), looking through the stages
// that pass batches along unchanged; -1 when there is none.
func findBatch(chain []Dataset) int {
	for i, d := range chain {
		switch d.(type) {
		case batcher:
			return i
		case *prefetchDS, *takeDS, *skipDS, *repeatDS, *cacheDS, *shuffleDS, *filterDS, *mapDS, *parseDS, *shardDS:
			continue
		}
		return -1
	}
	return -1
}

// findSample reports whether chain's global batches are PoissonSample's,
// looking through the stages that pass batches along unchanged.
func findSample(chain []Dataset) bool {
	for _, d := range chain {
		switch d.(type) {
		case *poissonDS:
			return true
		case *prefetchDS, *takeDS, *skipDS, *repeatDS, *cacheDS:
			continue
		}
		return false
	}
	return false
}

// fileList is a source of files that FILE sharding can divide: the
// TFRecordFiles source, or the ListFiles below an Interleave.
type fileList interface {
	node
	fileNames() []string
	shardFiles(n, index int) node
}

// fileSource returns the file source at the bottom of chain.
func fileSource(chain []Dataset) (fileList, error) {
	if m, ok := chain[len(chain)-1].(multi); ok {
		return nil, fmt.Errorf("%w: the dataset reads several inputs through %s, which FILE sharding does not divide (DATA sharding does)", ErrNoFileSource, m.opName())
	}
	src, ok := chain[len(chain)-1].(fileList)
	if !ok {
		return nil, fmt.Errorf("%w: the dataset does not read files (its source is %T)", ErrNoFileSource, chain[len(chain)-1])
	}
	return src, nil
}

// shardByFile rewrites a pipeline of global batches into worker
// ictx.InputPipelineID's pipeline under FILE sharding: its files only, and
// batches of the per-worker size.
func shardByFile(chain []Dataset, bi int, ictx InputContext) (Dataset, error) {
	W, w := ictx.NumInputPipelines, ictx.InputPipelineID
	src, err := fileSource(chain)
	if err != nil {
		return nil, err
	}
	if bi < 0 {
		return nil, fmt.Errorf("%w: no Batched stage found to resize to the per-worker batch", ErrNoFileSource)
	}
	if len(src.fileNames()) < W {
		return nil, fmt.Errorf("%w: %d files for %d workers: every worker needs at least one whole file", ErrTooFewFiles, len(src.fileNames()), W)
	}
	size := chain[bi].(batcher).batchSize()
	if size%W != 0 {
		return nil, fmt.Errorf("%w: global batch size %d by %d workers", ErrNotDivisible, size, W)
	}
	last := len(chain) - 1
	return rebuild(chain, func(i int, d Dataset) Dataset {
		switch i {
		case last:
			return src.shardFiles(W, w)
		case bi:
			return d.(batcher).resized(size / W)
		}
		return d
	}), nil
}

// ShardFiles returns ds reading only the files i with i mod n == index of its
// file source (a TFRecordFiles, or the ListFiles below an Interleave): FILE
// sharding of one input pipeline among n, for use in a DistributeFromFunction
// dataset function. Unlike Distribute under FILE, it does not change any
// batch size. It fails with ErrNoFileSource when ds has no such source, and
// with ErrTooFewFiles when it reads fewer than n files.
func ShardFiles(ds Dataset, n, index int) (Dataset, error) {
	if n < 1 || index < 0 || index >= n {
		return nil, fmt.Errorf("dataset: ShardFiles: %w: index %d of %d shards, expected 0 <= index < shards", ErrInvalidArgument, index, n)
	}
	if err := Err(ds); err != nil {
		return nil, err
	}
	if ds == nil {
		return nil, fmt.Errorf("dataset: ShardFiles: %w: nil Dataset", ErrInvalidArgument)
	}
	chain := pipeline(ds)
	src, err := fileSource(chain)
	if err != nil {
		return nil, fmt.Errorf("dataset: ShardFiles: %w", err)
	}
	if len(src.fileNames()) < n {
		return nil, fmt.Errorf("dataset: ShardFiles: %w: %d files for %d shards", ErrTooFewFiles, len(src.fileNames()), n)
	}
	last := len(chain) - 1
	return rebuild(chain, func(i int, d Dataset) Dataset {
		if i == last {
			return src.shardFiles(n, index)
		}
		return d
	}), nil
}
