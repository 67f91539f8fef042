// Package dataset builds input pipelines that feed TensorFlow steps from Go,
// and divides them among the workers and replicas of a distributed job, as
// tf.data and tf.distribute do in Python.
//
// # Pipelines
//
// A [Dataset] is a re-iterable source of elements; an [Element] maps names to
// tensors. Pipelines start from a source and chain transformations, each a
// function that takes and returns a Dataset:
//
//	src, err := dataset.TFRecordFiles([]string{"data/train-*.tfrecord"})
//	parser, err := dataset.NewExampleParser(dataset.FeatureSpec{
//		"x": {Type: tf.Float, Shape: []int64{64}},
//		"y": {Type: tf.Int32},
//	})
//	var ds dataset.Dataset = src
//	ds = dataset.Shuffle(ds, 10_000, 42)
//	ds = dataset.ParseExamples(ds, parser, dataset.WithParallelism(4))
//	ds = dataset.Batched(ds, 256, true) // the GLOBAL batch
//	ds = dataset.Prefetch(ds, 2)
//
// Sources: [FromSlices] (Go slices or tensors, sliced along their first
// dimension), [FromTensors] (one element), [Range], [TFRecordFiles] (files,
// directories or globs of TFRecord files, plain or GZIP or ZLIB compressed
// ([WithCompression]), their framing and checksums verified by package
// [github.com/tfdist/tfdist/dataset/tfrecord]),
// [TFRecordFile] (one file, by its name), [ListFiles] (the names of files,
// sorted or shuffled by [ShuffleFiles], for an [Interleave]), and any
// Dataset implemented elsewhere. Transformations: [Map], [Filter], [Shuffle],
// [Repeat], [Batched], [PaddedBatch], [Unbatch], [Rebatch], [Window],
// [Take], [Skip], [Shard], [ShardFiles], [Prefetch], [Cache], [Enumerate],
// [FlatMap], [Interleave], [PoissonSample] (batches that hold each example
// independently with a given probability, as DP-SGD's accounting assumes)
// and [ParseExamples], which parses tf.Example
// records by a [FeatureSpec] of fixed-length features with optional
// defaults, as tf.io.FixedLenFeature does, and of variable-length ones
// ([Feature].VarLen, tf.io.VarLenFeature), padded, beside their lengths. [Concatenate] and [Zip] combine
// datasets. [EncodeExample] writes tf.Examples. Each follows the tf.data
// operation of the same (snake_case) name; docs/from-tensorflow.md in the
// repository maps them.
//
// Many files are read at once with [Interleave], as tf.data's
// list_files(...).interleave(lambda f: TFRecordDataset(f).map(parse),
// cycle_length=4, num_parallel_calls=4) reads them: four files at a time,
// each read and parsed on a goroutine of its own, the next ones opened
// ahead, and the records still in the sequential order (unless
// [Deterministic](false)):
//
//	var counts dataset.RecordCounter // every file's records, summed
//	files, err := dataset.ListFiles([]string{"data/train-*.tfrecord"}, dataset.ShuffleFiles(42))
//	read := func(e dataset.Element) (dataset.Dataset, error) {
//		src, err := dataset.TFRecordFile(e[dataset.FilenameKey].Value().(string),
//			dataset.WithCorruptPolicy(dataset.SkipCorrupt), dataset.WithRecordCounter(&counts))
//		return dataset.ParseExamples(src, parser), err
//	}
//	ds := dataset.Interleave(files, read, 4, 1, dataset.WithParallelReads(4))
//	ds = dataset.Prefetch(dataset.Batched(ds, 256, true), 2)
//
// Under FILE sharding, Distribute gives each worker its share of the files
// that the ListFiles lists.
//
// Values stay in Go memory between stages, as flat row-major slices, and
// become tensors only when an element leaves the pipeline: parsing, batching
// and splitting copy Go memory, and each value is copied into TensorFlow's
// memory once. Transformations given invalid arguments return a dataset whose
// Iterator fails; [Err] reports such mistakes early.
//
// Every pass is deterministic: [Shuffle] draws from its own documented
// generator, seeded by the seed and the pass number, so every run and every
// process sees the same orders; parallel [Map], [ParseExamples] and
// [Interleave] keep the sequential order. Every blocking call takes a context
// and honours it; the context given to Iterator bounds the pass's goroutines,
// and Close ends them.
//
// # Distribution
//
// [Distribute] takes a dataset batched by the global batch size and an
// [InputContext] (workers, this worker's index, replicas in sync), and yields
// at each step a [Batch]: this worker's share of global batch k, split into
// one element per local replica along the first dimension.
//
//	ictx := dataset.InputContext{NumInputPipelines: 2, InputPipelineID: worker, NumReplicasInSync: 4}
//	dist, err := dataset.Distribute(ds, ictx, 2) // 2 replicas on this worker
//	for batch, err := range dist.All(ctx) {
//		// feed batch.Replicas[i] to replica i; normalise by batch.GlobalCount
//	}
//
// The [ShardPolicy] says how workers divide the data: FILE gives each worker
// whole files (those of the TFRecordFiles source, or of the ListFiles below
// an Interleave) and resizes the batching stage (Batched, PaddedBatch or
// Rebatch) to the per-worker batch; DATA has every worker read
// everything and keep example i when i mod workers is its index, so that the
// union of all replicas' batches at step k is exactly the single-pipeline
// global batch k; OFF gives every worker all the data; AUTO picks FILE when
// the dataset reads enough files and DATA otherwise.
//
// The batch arithmetic every strategy relies on: the global batch is what one
// step consumes across all replicas; each replica of a full step gets global
// / NumReplicasInSync examples ([InputContext.PerReplicaBatchSize], which
// fails with [ErrNotDivisible] when that does not divide). A partial final
// batch (Batched without dropRemainder) is split as evenly as possible, the
// replicas' counts differing by at most one and some possibly zero (their
// tensors then have a leading dimension of 0). [Batch.Counts] reports each
// replica's share and [Batch.GlobalCount] the examples in the whole step.
// The strategies sum their per-example losses over all replicas and divide by
// GlobalCount, fed to the step graph on every run, so that a partial step
// weighs each example exactly as one device would; with DATA sharding the
// gradients of N replicas then equal those of one device on the global batch,
// up to float summation order.
//
// [DistributeFromFunction] calls the caller's function once per worker with
// its InputContext; the function shards and batches by the per-replica batch
// itself, and each step deals the next batches to the local replicas.
//
// Prefetching ([WithPrefetch], one batch by default) prepares the next steps
// on a goroutine: read, split, turned into tensors, and staged toward the
// devices by an optional [StageFunc] (for example TensorFlow's Stage kernel
// into a staging area on each replica's device), while the current step runs.
//
// # Errors
//
// Bad input fails with an error that names the file and byte offset, the
// feature, the value and what was expected, matched by the sentinel errors
// of this package (and [tfrecord.ErrCorrupt]) with errors.Is. Corrupt
// TFRecord records end the pass by default, or are skipped, counted
// ([TFRecordDataset.Stats]) and logged under [SkipCorrupt]. Nothing is
// dropped silently, nothing panics (a panic in a caller's Map function
// becomes an error) and nothing waits without a context.
//
// # Performance
//
// A parallel Map or ParseExamples ([WithParallelism]) pays where the
// function costs more than reading the stream it maps; parallel reads
// ([WithParallelReads]) pay where records cost more to parse than to hand
// from one goroutine to another, and more in no fixed order
// ([Deterministic](false)). The package's benchmarks (go test -bench .
// ./dataset) measure both; docs/benchmarks.md in the repository gives
// their figures.
package dataset
