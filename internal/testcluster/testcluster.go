// Package testcluster runs clusters of multi-worker strategies inside one
// test process, each worker on its own loopback port, for the tests of the
// packages that build on them.
package testcluster

import (
	"context"
	"fmt"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/tfdist/tfdist/cluster"
	"github.com/tfdist/tfdist/internal/freeport"
	"github.com/tfdist/tfdist/multiworker"
)

// LoopbackSpec returns a cluster of workers on free loopback ports.
func LoopbackSpec(t testing.TB, workers int) cluster.ClusterSpec {
	t.Helper()
	ports, err := freeport.Loopback(workers)
	require.NoError(t, err)
	addrs := make([]string, workers)
	for i, p := range ports {
		addrs[i] = fmt.Sprintf("127.0.0.1:%d", p)
	}
	spec, err := cluster.NewClusterSpec(map[cluster.TaskType][]string{cluster.Worker: addrs})
	require.NoError(t, err)
	return spec
}

// OnWorkers starts a multiworker strategy for each worker of spec, in this
// process, runs fn on each at once, closes them, and returns each worker's
// error.
func OnWorkers(spec cluster.ClusterSpec, opts []multiworker.Option, fn func(w int, s *multiworker.Strategy) error) []error {
	return OnWorkersWith(spec, func(int) []multiworker.Option { return opts }, fn)
}

// OnWorkersWith is OnWorkers with each worker w's options opts(w).
func OnWorkersWith(spec cluster.ClusterSpec, opts func(w int) []multiworker.Option, fn func(w int, s *multiworker.Strategy) error) []error {
	n := spec.WorkerCount()
	var wg sync.WaitGroup
	errs := make([]error, n)
	for w := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r, err := cluster.NewSimpleResolver(spec, cluster.Task{Type: cluster.Worker, Index: w})
			if err != nil {
				errs[w] = err
				return
			}
			s, err := multiworker.New(context.Background(), append([]multiworker.Option{multiworker.WithResolver(r)}, opts(w)...)...)
			if err != nil {
				errs[w] = err
				return
			}
			defer s.Close()
			errs[w] = fn(w, s)
		}()
	}
	wg.Wait()
	return errs
}
