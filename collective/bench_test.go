package collective

import (
	"context"
	"fmt"
	"io"
	"net"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

var benchSizes = []struct {
	name  string
	bytes int
}{{"4KiB", 4 << 10}, {"1MiB", 1 << 20}, {"16MiB", 16 << 20}, {"64MiB", 64 << 20}}

// BenchmarkAllReduce measures a float32 sum between members in this
// process over loopback. MB/s is the buffer size per operation; busMB/s is
// the bus bandwidth, bytes×2(n−1)/n per operation.
func BenchmarkAllReduce(b *testing.B) {
	for _, n := range []int{2, 3} {
		for _, s := range benchSizes {
			b.Run(fmt.Sprintf("members=%d/size=%s", n, s.name), func(b *testing.B) {
				benchAllReduce(b, n, s.bytes, nil)
			})
		}
	}
}

// BenchmarkAllReduceTLS is BenchmarkAllReduce over mutual TLS, and the
// same in plaintext, measured in turn in one run: compare the two sizes'
// busMB/s.
func BenchmarkAllReduceTLS(b *testing.B) {
	for _, n := range []int{2, 3} {
		for _, s := range benchSizes[2:] {
			for _, secure := range []bool{false, true} {
				name := map[bool]string{false: "plaintext", true: "tls"}[secure]
				b.Run(fmt.Sprintf("members=%d/size=%s/%s", n, s.name, name), func(b *testing.B) {
					var each func(int) []Option
					if secure {
						each = withCredentials(jobCredentials(b, newAuthority(b), n))
					}
					benchAllReduce(b, n, s.bytes, each)
				})
			}
		}
	}
}

func benchAllReduce(b *testing.B, n, size int, each func(int) []Option) {
	lns, members := listeners(b, n)
	gs, err := formGroups(lns, members, each, WithTimeout(time.Minute))
	require.NoError(b, err)
	b.Cleanup(func() { closeAll(gs) })
	bufs := make([][]byte, n)
	for i := range bufs {
		bufs[i] = make([]byte, size)
	}
	ctx := context.Background()
	b.SetBytes(int64(size))
	b.ResetTimer()
	for range b.N {
		requireAllOK(b, onAll(gs, func(i int, g *Group) error {
			return g.AllReduce(ctx, "bench", Sum, Float32, bufs[i])
		}))
	}
	perOp := b.Elapsed().Seconds() / float64(b.N)
	b.ReportMetric(float64(size)*2*float64(n-1)/float64(n)/perOp/1e6, "busMB/s")
}

// BenchmarkTCPCopy is the reference: a one-way copy over one loopback TCP
// connection.
func BenchmarkTCPCopy(b *testing.B) {
	for _, s := range benchSizes {
		b.Run("size="+s.name, func(b *testing.B) { benchTCPCopy(b, s.bytes) })
	}
}

func benchTCPCopy(b *testing.B, size int) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(b, err)
	defer func() { _ = ln.Close() }()
	accepted := make(chan net.Conn, 1)
	go func() {
		c, err := ln.Accept()
		if err == nil {
			accepted <- c
		}
		close(accepted)
	}()
	w, err := net.Dial("tcp", ln.Addr().String())
	require.NoError(b, err)
	defer func() { _ = w.Close() }()
	r := <-accepted
	require.NotNil(b, r)
	defer func() { _ = r.Close() }()
	src, dst := make([]byte, size), make([]byte, size)
	b.SetBytes(int64(size))
	b.ResetTimer()
	for range b.N {
		done := make(chan error, 1)
		go func() {
			_, err := w.Write(src)
			done <- err
		}()
		_, err := io.ReadFull(r, dst)
		require.NoError(b, err)
		require.NoError(b, <-done)
	}
}
