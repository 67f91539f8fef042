package dataset_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"runtime"
	"runtime/debug"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	tf "github.com/wamuir/graft/tensorflow"

	"github.com/tfdist/tfdist/dataset"
)

func TestFromSlicesYieldsRows(t *testing.T) {
	x, err := tf.NewTensor([][]int32{{1, 2}, {3, 4}, {5, 6}})
	require.NoError(t, err)
	ds, err := dataset.FromSlices(map[string]any{
		"f": [][2]float32{{0, 0.5}, {1, 1.5}, {2, 2.5}},
		"s": []string{"a", "b", "c"},
		"t": x,
	})
	require.NoError(t, err)
	elems, err := dataset.Collect(testCtx(t), ds)
	require.NoError(t, err)
	require.Len(t, elems, 3)
	for i, e := range elems {
		assert.Equal(t, []float32{float32(i), float32(i) + 0.5}, e["f"].Value())
		assert.Equal(t, []int64{2}, e["f"].Shape())
		assert.Equal(t, string(rune('a'+i)), e["s"].Value())
		assert.Equal(t, []int32{int32(2*i + 1), int32(2*i + 2)}, e["t"].Value())
	}
	// A dataset is re-iterable: a second pass yields the same rows.
	again, err := dataset.Collect(testCtx(t), ds)
	require.NoError(t, err)
	assert.Equal(t, elems[2]["s"].Value(), again[2]["s"].Value())
}

func TestFromSlicesRejectsBadInput(t *testing.T) {
	for _, tc := range []struct {
		name string
		m    map[string]any
		want []string
		is   error
	}{
		{"lengths", map[string]any{"a": []int64{1, 2, 3}, "b": []int64{1, 2}}, []string{`"b"`, "2 rows", "expected 3", `"a"`}, dataset.ErrShape},
		{"scalar", map[string]any{"a": int64(1)}, []string{`"a"`, "scalar"}, dataset.ErrShape},
		{"ragged", map[string]any{"a": [][]float32{{1, 2}, {3}}}, []string{`"a"`, "length 1", "expected 2"}, dataset.ErrShape},
		{"type", map[string]any{"a": []complex64{1}}, []string{`"a"`, "complex64"}, dataset.ErrUnsupportedType},
		{"empty", map[string]any{}, []string{"no values"}, dataset.ErrInvalidArgument},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := dataset.FromSlices(tc.m)
			require.ErrorIs(t, err, tc.is)
			for _, s := range tc.want {
				assert.Contains(t, err.Error(), s)
			}
		})
	}
}

func TestFromTensorsYieldsOneElement(t *testing.T) {
	x, err := tf.NewTensor([]float32{1, 2})
	require.NoError(t, err)
	ds, err := dataset.FromTensors(dataset.Element{"x": x})
	require.NoError(t, err)
	for range 2 {
		elems, err := dataset.Collect(testCtx(t), ds)
		require.NoError(t, err)
		require.Len(t, elems, 1)
		assert.Equal(t, []float32{1, 2}, elems[0]["x"].Value())
	}
	_, err = dataset.FromTensors(dataset.Element{"x": nil})
	assert.ErrorIs(t, err, dataset.ErrInvalidArgument)
}

func TestMapKeepsOrderInParallel(t *testing.T) {
	double := func(e dataset.Element) (dataset.Element, error) {
		v := e["id"].Value().(int64)
		time.Sleep(time.Duration(v%3) * 100 * time.Microsecond) // finish out of order
		y, err := tf.NewTensor(2 * v)
		return dataset.Element{"y": y}, err
	}
	want := make([]int64, 200)
	for i := range want {
		want[i] = 2 * int64(i)
	}
	for _, p := range []int{1, 4} {
		got := collectInts(t, dataset.Map(dataset.Range("id", 0, 200), double, dataset.WithParallelism(p)), "y")
		assert.Equal(t, want, got, "parallelism %d", p)
	}
}

func TestMapErrorsAndPanicsEndThePass(t *testing.T) {
	boom := errors.New("boom")
	for _, p := range []int{1, 3} {
		fail := dataset.Map(dataset.Range("id", 0, 10), func(e dataset.Element) (dataset.Element, error) {
			if e["id"].Value().(int64) == 5 {
				return nil, boom
			}
			return e, nil
		}, dataset.WithParallelism(p))
		elems, err := dataset.Collect(testCtx(t), fail)
		require.ErrorIs(t, err, boom, "parallelism %d", p)
		assert.Contains(t, err.Error(), "element 5")
		assert.Len(t, elems, 5, "the elements before the failure arrive, in order")

		panics := dataset.Map(dataset.Range("id", 0, 10), func(e dataset.Element) (dataset.Element, error) {
			if e["id"].Value().(int64) == 7 {
				panic("bad map function")
			}
			return e, nil
		}, dataset.WithParallelism(p))
		_, err = dataset.Collect(testCtx(t), panics)
		require.Error(t, err)
		assert.Contains(t, err.Error(), "panicked: bad map function")
	}
}

func TestFilterKeepsMatchingElements(t *testing.T) {
	even := dataset.Filter(dataset.Range("id", 0, 10), func(e dataset.Element) (bool, error) {
		return e["id"].Value().(int64)%2 == 0, nil
	})
	assert.Equal(t, []int64{0, 2, 4, 6, 8}, collectInts(t, even, "id"))
}

func TestShuffleIsAReproduciblePermutation(t *testing.T) {
	shuffled := func(seed uint64, buffer int, opts ...dataset.ShuffleOption) dataset.Dataset {
		return dataset.Shuffle(dataset.Range("id", 0, 100), buffer, seed, opts...)
	}
	ds := shuffled(7, 100)
	first := collectInts(t, ds, "id")
	assert.ElementsMatch(t, seq(0, 100), first)
	assert.NotEqual(t, seq(0, 100), first)

	second := collectInts(t, ds, "id")
	assert.ElementsMatch(t, seq(0, 100), second)
	assert.NotEqual(t, first, second, "each pass reshuffles")

	// A separately built dataset with the same seed gives the same sequence
	// of orders; another seed gives another.
	same := shuffled(7, 100)
	assert.Equal(t, first, collectInts(t, same, "id"))
	assert.Equal(t, second, collectInts(t, same, "id"))
	assert.NotEqual(t, first, collectInts(t, shuffled(8, 100), "id"))

	fixed := shuffled(7, 100, dataset.WithReshuffleEachIteration(false))
	assert.Equal(t, first, collectInts(t, fixed, "id"))
	assert.Equal(t, first, collectInts(t, fixed, "id"))

	assert.Equal(t, seq(0, 100), collectInts(t, shuffled(7, 1), "id"), "a buffer of one keeps the order")

	// A small buffer only moves an element so far ahead.
	local := collectInts(t, shuffled(3, 10), "id")
	for pos, v := range local {
		assert.LessOrEqual(t, v, int64(pos+9), "element %d cannot come out before %d others were read", v, v-9)
	}
}

// The order of a seeded shuffle is part of the package's contract (workers
// that shard by DATA, and reruns of an experiment, depend on it), so it is
// pinned here: a change of generator shows up as a failure.
func TestShuffleOrderIsPinned(t *testing.T) {
	got := collectInts(t, dataset.Shuffle(dataset.Range("id", 0, 20), 5, 42), "id")
	assert.Equal(t, []int64{4, 3, 0, 2, 8, 7, 9, 1, 5, 6, 12, 11, 14, 15, 16, 19, 17, 13, 10, 18}, got)
}

func TestRepeat(t *testing.T) {
	got := collectInts(t, dataset.Repeat(dataset.Range("id", 0, 3), 3), "id")
	assert.Equal(t, []int64{0, 1, 2, 0, 1, 2, 0, 1, 2}, got)

	// Repeating an empty dataset forever ends instead of spinning.
	assert.Empty(t, collectInts(t, dataset.Repeat(dataset.Range("id", 0, 0), -1), "id"))

	forever := dataset.Take(dataset.Repeat(dataset.Range("id", 0, 2), -1), 5)
	assert.Equal(t, []int64{0, 1, 0, 1, 0}, collectInts(t, forever, "id"))

	// Each repetition is a new pass: after Shuffle, a new order.
	reps := collectInts(t, dataset.Repeat(dataset.Shuffle(dataset.Range("id", 0, 50), 50, 1), 2), "id")
	assert.ElementsMatch(t, reps[:50], reps[50:])
	assert.NotEqual(t, reps[:50], reps[50:])
}

func TestBatched(t *testing.T) {
	ds := idDataset(t, 10)
	elems, err := dataset.Collect(testCtx(t), dataset.Batched(ds, 4, false))
	require.NoError(t, err)
	require.Len(t, elems, 3)
	assert.Equal(t, []int64{4}, elems[0]["id"].Shape())
	assert.Equal(t, []int64{4, 3}, elems[0]["x"].Shape())
	assert.Equal(t, []int64{2, 3}, elems[2]["x"].Shape(), "the remainder is kept")
	assert.Equal(t, [][]float32{{8, 16, 24}, {9, 18, 27}}, elems[2]["x"].Value())

	dropped, err := dataset.Collect(testCtx(t), dataset.Batched(ds, 4, true))
	require.NoError(t, err)
	assert.Len(t, dropped, 2)

	// Batches of batches.
	nested, err := dataset.Collect(testCtx(t), dataset.Batched(dataset.Batched(ds, 2, true), 5, false))
	require.NoError(t, err)
	require.Len(t, nested, 1)
	assert.Equal(t, []int64{5, 2, 3}, nested[0]["x"].Shape())

	assert.ErrorIs(t, dataset.Err(dataset.Batched(ds, 0, false)), dataset.ErrInvalidArgument)
	_, err = dataset.Batched(ds, 0, false).Iterator(testCtx(t))
	assert.ErrorContains(t, err, "size 0")
}

func TestBatchedRejectsMismatchedShapes(t *testing.T) {
	reshape := dataset.Map(dataset.Range("id", 0, 4), func(e dataset.Element) (dataset.Element, error) {
		n := int(e["id"].Value().(int64))
		v, err := tf.NewTensor(make([]float32, 1+n/2)) // shape changes at element 2
		return dataset.Element{"v": v}, err
	})
	_, err := dataset.Collect(testCtx(t), dataset.Batched(reshape, 4, false))
	require.ErrorIs(t, err, dataset.ErrShape)
	assert.Contains(t, err.Error(), `feature "v" of element 2 is float32[2], expected float32[1]`)
}

func TestTakeSkipShard(t *testing.T) {
	r := dataset.Range("id", 0, 10)
	assert.Equal(t, []int64{0, 1, 2}, collectInts(t, dataset.Take(r, 3), "id"))
	assert.Equal(t, seq(0, 10), collectInts(t, dataset.Take(r, -1), "id"))
	assert.Equal(t, []int64{7, 8, 9}, collectInts(t, dataset.Skip(r, 7), "id"))
	assert.Empty(t, collectInts(t, dataset.Skip(r, -1), "id"))
	assert.Empty(t, collectInts(t, dataset.Skip(r, 20), "id"))

	var union []int64
	for i := range 3 {
		shard := collectInts(t, dataset.Shard(r, 3, i), "id")
		for _, v := range shard {
			assert.Equal(t, int64(i), v%3)
		}
		union = append(union, shard...)
	}
	assert.ElementsMatch(t, seq(0, 10), union)
	assert.ErrorIs(t, dataset.Err(dataset.Shard(r, 3, 3)), dataset.ErrInvalidArgument)
}

func TestPrefetchReadsAheadWithinItsBound(t *testing.T) {
	src := &countingDataset{n: 100}
	it, err := dataset.Prefetch(src, 3).Iterator(testCtx(t))
	require.NoError(t, err)
	defer it.Close()
	_, err = it.Next(testCtx(t))
	require.NoError(t, err)
	// The goroutine fills the buffer (3) and holds one more in hand ...
	require.Eventually(t, func() bool { return src.pulls.Load() == 5 }, 5*time.Second, time.Millisecond)
	// ... and goes no further while the consumer waits.
	time.Sleep(20 * time.Millisecond)
	assert.EqualValues(t, 5, src.pulls.Load())
	for i := 1; i < 100; i++ {
		e, err := it.Next(testCtx(t))
		require.NoError(t, err)
		require.Equal(t, int64(i), e["id"].Value())
	}
	_, err = it.Next(testCtx(t))
	assert.Equal(t, io.EOF, err)
}

func TestCacheReadsTheSourceOnce(t *testing.T) {
	src := &countingDataset{n: 20}
	cached := dataset.Cache(src)

	// A first pass closed early caches nothing.
	it, err := cached.Iterator(testCtx(t))
	require.NoError(t, err)
	_, err = it.Next(testCtx(t))
	require.NoError(t, err)
	require.NoError(t, it.Close())
	assert.EqualValues(t, 1, src.pulls.Load())

	first := collectInts(t, cached, "id")
	second := collectInts(t, cached, "id")
	assert.Equal(t, seq(0, 20), first)
	assert.Equal(t, first, second)
	assert.EqualValues(t, 21, src.pulls.Load(), "the second complete pass replays the cache")
}

func TestForeignDatasetsPlugIn(t *testing.T) {
	src := &countingDataset{n: 7}
	elems, err := dataset.Collect(testCtx(t), dataset.Batched(src, 3, false))
	require.NoError(t, err)
	require.Len(t, elems, 3)
	assert.Equal(t, []int64{6}, elems[2]["id"].Value())
	assert.EqualValues(t, 1, src.closes.Load(), "the foreign iterator is closed")
}

func TestAllClosesThePassOnBreak(t *testing.T) {
	src := &countingDataset{n: 100}
	n := 0
	for e, err := range dataset.All(testCtx(t), dataset.Prefetch(src, 2)) {
		require.NoError(t, err)
		require.NotNil(t, e)
		if n++; n == 3 {
			break
		}
	}
	assert.EqualValues(t, 1, src.closes.Load())
}

// goroutines waits for the goroutine count to fall back to at most n.
func requireGoroutinesAtMost(t *testing.T, n int) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for runtime.NumGoroutine() > n && time.Now().Before(deadline) {
		time.Sleep(time.Millisecond)
	}
	if got := runtime.NumGoroutine(); got > n {
		buf := make([]byte, 1<<16)
		t.Fatalf("goroutines leaked: %d, expected at most %d:\n%s", got, n, buf[:runtime.Stack(buf, true)])
	}
}

// A pipeline whose source blocks forever never hangs its consumer: every
// wait honours the caller's context, and Close ends every goroutine.
func TestBlockedPipelinesHonourContext(t *testing.T) {
	stages := map[string]func(dataset.Dataset) dataset.Dataset{
		"synchronous": func(d dataset.Dataset) dataset.Dataset {
			return dataset.Batched(dataset.Take(dataset.Shuffle(d, 10, 1), 5), 2, false)
		},
		"prefetch": func(d dataset.Dataset) dataset.Dataset { return dataset.Prefetch(d, 2) },
		"parallel map": func(d dataset.Dataset) dataset.Dataset {
			return dataset.Map(d, func(e dataset.Element) (dataset.Element, error) { return e, nil }, dataset.WithParallelism(3))
		},
		"batch+shuffle": func(d dataset.Dataset) dataset.Dataset {
			return dataset.Batched(dataset.Shuffle(dataset.Prefetch(d, 1), 10, 1), 4, false)
		},
		"parallel interleave": func(d dataset.Dataset) dataset.Dataset {
			return dataset.Interleave(dataset.Range("i", 0, 3), func(dataset.Element) (dataset.Dataset, error) { return d, nil },
				2, 1, dataset.WithParallelReads(2))
		},
		"reshaping": func(d dataset.Dataset) dataset.Dataset {
			rows := dataset.Unbatch(dataset.Rebatch(dataset.Batched(d, 1, false), 2, false))
			windows := dataset.Window(dataset.PaddedBatch(rows, 2, false), 2, 1, 1, false)
			return dataset.Enumerate(dataset.Zip([]dataset.Dataset{dataset.Concatenate(windows, windows)}), 0)
		},
	}
	for name, stage := range stages {
		t.Run(name, func(t *testing.T) {
			before := runtime.NumGoroutine()
			life, endLife := context.WithCancel(testCtx(t))
			it, err := stage(&countingDataset{n: 1, block: true}).Iterator(life)
			require.NoError(t, err)

			ctx, cancel := context.WithTimeout(testCtx(t), 30*time.Millisecond)
			defer cancel()
			start := time.Now()
			var nerr error
			got := -1
			for nerr == nil {
				_, nerr = it.Next(ctx)
				got++
			}
			assert.ErrorIs(t, nerr, context.DeadlineExceeded)
			if want, ok := map[string]int{"prefetch": 1, "parallel map": 1, "parallel interleave": 2}[name]; ok {
				assert.Equal(t, want, got, "the elements before the stall are passed on, not held back")
			}
			assert.Less(t, time.Since(start), 15*time.Second, "the 30 ms deadline ends the wait, long before the test's 30 s")

			// The caller's timeout does not end the pass: with a live
			// context the wait resumes (and is still honoured).
			ctx2, cancel2 := context.WithTimeout(testCtx(t), 10*time.Millisecond)
			defer cancel2()
			_, err = it.Next(ctx2)
			assert.ErrorIs(t, err, context.DeadlineExceeded)

			if name == "synchronous" || name == "reshaping" { // no goroutine: nothing waits on the pass's context
				endLife()
				require.NoError(t, it.Close())
				return
			}
			// Ending the pass's own context ends waits that use another.
			endLife()
			done := make(chan error, 1)
			go func() { _, err := it.Next(testCtx(t)); done <- err }()
			select {
			case err := <-done:
				assert.ErrorIs(t, err, context.Canceled)
			case <-time.After(5 * time.Second):
				t.Fatal("Next did not return after the pass's context ended")
			}
			require.NoError(t, it.Close())
			requireGoroutinesAtMost(t, before)
		})
	}
}

func TestInvalidArgumentsSurfaceAsErrors(t *testing.T) {
	r := dataset.Range("id", 0, 3)
	for name, ds := range map[string]dataset.Dataset{
		"shuffle buffer": dataset.Shuffle(r, 0, 1),
		"batch size":     dataset.Batched(r, -1, true),
		"shard":          dataset.Shard(r, 0, 0),
		"nil map":        dataset.Map(r, nil),
		"nil input":      dataset.Take(nil, 1),
		"nested":         dataset.Prefetch(dataset.Batched(dataset.Shuffle(r, -5, 1), 2, true), 1),
	} {
		err := dataset.Err(ds)
		assert.ErrorIs(t, err, dataset.ErrInvalidArgument, name)
		_, ierr := ds.Iterator(testCtx(t))
		assert.Equal(t, err, ierr, name)
	}
	assert.NoError(t, dataset.Err(r))
}

func ExampleBatched() {
	ds, _ := dataset.FromSlices(map[string]any{
		"x": [][2]float32{{0, 0}, {1, 1}, {2, 2}, {3, 3}, {4, 4}},
		"y": []int32{0, 1, 0, 1, 0},
	})
	ds = dataset.Batched(dataset.Shuffle(ds, 5, 42), 2, false)
	for e, err := range dataset.All(context.Background(), ds) {
		if err != nil {
			fmt.Println(err)
			return
		}
		fmt.Println(e["x"].Shape(), e["y"].Value())
	}
	// Output:
	// [2 2] [0 0]
	// [2 2] [1 0]
	// [1 2] [1]
}

// TestCallbacksReadElementsSafely: the caller's functions may read their
// element's tensors with Tensor.Value, which reads a tensor's C memory after
// its last use of the tensor; the element stays alive until the function
// returns, so that no finalizer frees that memory under it. With the
// collector running constantly, reading a freed string tensor returned
// garbage or crashed within a pass before the elements were kept alive.
func TestCallbacksReadElementsSafely(t *testing.T) {
	defer debug.SetGCPercent(debug.SetGCPercent(1))
	stop := make(chan struct{})
	defer close(stop)
	go func() { // allocates, so that collections (and finalizers) run all the time
		var sink []byte
		for {
			select {
			case <-stop:
				runtime.KeepAlive(sink)
				return
			default:
				sink = make([]byte, 1<<14)
			}
		}
	}()
	const prefix = "/a/directory/with/a/name/long/enough/to/be/allocated/"
	names := make([]string, 5000)
	for i := range names {
		names[i] = fmt.Sprintf("%s%06d", prefix, i)
	}
	src, err := dataset.FromSlices(map[string]any{"s": names})
	require.NoError(t, err)
	var bad atomic.Int64
	check := func(e dataset.Element) {
		if s := e["s"].Value().(string); len(s) != len(prefix)+6 || s[:len(prefix)] != prefix {
			bad.Add(1)
		}
	}
	ds := dataset.Filter(src, func(e dataset.Element) (bool, error) { check(e); return true, nil })
	ds = dataset.Map(ds, func(e dataset.Element) (dataset.Element, error) { check(e); return e, nil }, dataset.WithParallelism(2))
	ds = dataset.Interleave(ds, func(e dataset.Element) (dataset.Dataset, error) {
		check(e)
		return dataset.Range("x", 0, 0), nil
	}, 2, 1, dataset.WithParallelReads(2))
	for start := time.Now(); time.Since(start) < time.Second; {
		_, err := dataset.Collect(testCtx(t), ds)
		require.NoError(t, err)
		require.Zero(t, bad.Load(), "tensors read after they were freed")
	}
}

// TestLargeRowsKeepTheirValuesThroughReshaping batches rows large enough to
// be kept as pieces of their batch, then reshapes and distributes them:
// every row must come out with its own values, in order.
func TestLargeRowsKeepTheirValuesThroughReshaping(t *testing.T) {
	const n, features = 24, 100
	x := make([][]float32, n)
	for i := range x {
		x[i] = make([]float32, features)
		for j := range x[i] {
			x[i][j] = float32(i*features + j)
		}
	}
	src, err := dataset.FromSlices(map[string]any{"x": x})
	require.NoError(t, err)
	rows := func(elems []dataset.Element) [][]float32 {
		var out [][]float32
		for _, e := range elems {
			out = append(out, e["x"].Value().([][]float32)...)
		}
		return out
	}
	for name, ds := range map[string]dataset.Dataset{
		"batched":          dataset.Batched(src, 4, false),
		"rebatched":        dataset.Rebatch(dataset.Batched(src, 4, false), 5, false),
		"unbatched":        dataset.Batched(dataset.Unbatch(dataset.Batched(src, 4, false)), 3, false),
		"batches of pairs": dataset.Unbatch(dataset.Batched(dataset.Batched(src, 2, false), 3, false)),
		"windows":          dataset.Window(src, 3, 3, 1, false),
		"padded":           dataset.PaddedBatch(src, 5, false),
		"cached":           dataset.Cache(dataset.Batched(src, 7, false)),
	} {
		t.Run(name, func(t *testing.T) {
			for pass := range 2 { // a second pass reads a Cache's copy
				elems, err := dataset.Collect(testCtx(t), ds)
				require.NoError(t, err)
				require.Equal(t, x, rows(elems), "pass %d", pass)
			}
		})
	}
	t.Run("distributed", func(t *testing.T) {
		d, err := dataset.Distribute(dataset.Batched(src, 9, false), dataset.InputContext{NumInputPipelines: 1, NumReplicasInSync: 3}, 3)
		require.NoError(t, err)
		it, err := d.Iterator(testCtx(t))
		require.NoError(t, err)
		defer it.Close()
		var got []dataset.Element
		for {
			b, err := it.Next(testCtx(t))
			if errors.Is(err, io.EOF) {
				break
			}
			require.NoError(t, err)
			got = append(got, b.Replicas...)
		}
		require.Equal(t, x, rows(got))
	})
}
