package collective

import (
	"context"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

var benchSizes = []struct {
	name  string
	bytes int
}{{"4KiB", 4 << 10}, {"1MiB", 1 << 20}, {"16MiB", 16 << 20}, {"64MiB", 64 << 20}}

// BenchmarkAllReduce measures a float32 sum between members in this
// process, over loopback TCP and over shared memory: AllReduceTo of random
// values, so every operation reduces the same inputs. MB/s is the buffer
// size per operation; busMB/s is the bus bandwidth, bytes×2(n−1)/n per
// operation.
func BenchmarkAllReduce(b *testing.B) {
	for _, n := range []int{2, 3} {
		for _, s := range benchSizes {
			for _, tr := range transports {
				b.Run(fmt.Sprintf("members=%d/size=%s/transport=%s", n, s.name, tr.name), func(b *testing.B) {
					benchAllReduce(b, n, s.bytes, func(int) []Option { return tr.opts })
				})
			}
		}
	}
}

// BenchmarkAllGather gathers every member's float32 buffer on every
// member in this process: over loopback TCP, over shared memory with the
// chunks copied through the segment (shm-bytes) and over shared memory
// with each chunk read from its sender's buffer (shm), compare the last
// two's ns/op. MB/s counts the bytes each member receives per operation.
func BenchmarkAllGather(b *testing.B) {
	gathers := append(transports[:len(transports):len(transports)], struct {
		name string
		opts []Option
	}{"shm-bytes", []Option{func(c *config) { c.remoteMin = 0 }}})
	for _, n := range []int{3, 5} {
		for _, size := range []int{1 << 20, 16 << 20} {
			for _, tr := range gathers {
				b.Run(fmt.Sprintf("members=%d/size=%dMiB/transport=%s", n, size>>20, tr.name), func(b *testing.B) {
					gs := newGroups(b, n, tr.opts...)
					rng := rand.New(rand.NewPCG(1, 2))
					ins := make([][]byte, n)
					for i := range ins {
						ins[i] = randomBuffer(rng, Float32, size/4)
					}
					b.SetBytes(int64(size * (n - 1)))
					b.ResetTimer()
					for range b.N {
						requireAllOK(b, onAll(gs, func(i int, g *Group) error {
							_, err := g.AllGather(context.Background(), "g", Float32, ins[i])
							return err
						}))
					}
				})
			}
		}
	}
}

// transports are the ways members in one process can be connected.
var transports = []struct {
	name string
	opts []Option
}{{"tcp", []Option{WithSharedMemory(false)}}, {"shm", nil}}

// BenchmarkAllReduceCompressed is BenchmarkAllReduce sent plain, compressed
// to float16 and compressed to bfloat16, measured in turn in one run:
// compare the three's ns/op (busMB/s counts float32 bytes for all three).
// It runs over shared memory (with results in the members' own memory, and
// in their arenas, where calls push and compressed ones move float32),
// over loopback TCP and over connections paced to 10 and 1 Gb/s each way.
// Members in one process share its processors, which converting loads,
// where members on a real network would each have their own.
func BenchmarkAllReduceCompressed(b *testing.B) {
	links := []struct {
		name   string
		each   func(int) []Option
		pushed bool
	}{{"shm", func(int) []Option { return nil }, false}, {"shm-pushed", func(int) []Option { return nil }, true},
		{"loopback", func(int) []Option { return transports[0].opts }, false},
		{"10Gbps", paced(10e9 / 8), false}, {"1Gbps", paced(1e9 / 8), false}}
	for _, link := range links {
		for _, n := range []int{2, 3} {
			for _, s := range benchSizes[2:] {
				for _, wire := range []DType{0, Float16, BFloat16} {
					var opts []CallOption
					name := "plain"
					if wire != 0 {
						opts, name = []CallOption{Compress(wire)}, wire.String()
					}
					b.Run(fmt.Sprintf("link=%s/members=%d/size=%s/%s", link.name, n, s.name, name), func(b *testing.B) {
						benchAllReduceInto(b, n, s.bytes, link.each, link.pushed, opts...)
					})
				}
			}
		}
	}
}

// paced makes every connection a member accepts carry at most rate bytes a
// second each way. Every connection has an accepting end, so all are paced.
func paced(rate float64) func(int) []Option {
	return func(int) []Option {
		return []Option{WithSharedMemory(false), func(c *config) { c.listener = pacedListener{c.listener, rate} }}
	}
}

type pacedListener struct {
	net.Listener
	rate float64
}

func (l pacedListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	return &pacedConn{Conn: c, rate: l.rate}, nil
}

// pacedConn delays each read until its bytes would have crossed a link of
// rate bytes a second, and each write until no more than a socket buffer's
// worth of what it wrote is still crossing. One goroutine reads and writers
// hold the group's write lock, so each side's schedule has one user at a
// time.
type pacedConn struct {
	net.Conn
	rate         float64
	rnext, wnext time.Time // when the bytes read or written so far will have crossed
}

// pacedBuffer is the bytes a paced writer may have in flight.
const pacedBuffer = 4 << 20

func (c *pacedConn) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	time.Sleep(time.Until(c.pace(&c.rnext, n)))
	return n, err
}

func (c *pacedConn) Write(p []byte) (int, error) {
	n, err := c.Conn.Write(p)
	time.Sleep(time.Until(c.pace(&c.wnext, n)) - c.duration(pacedBuffer))
	return n, err
}

// pace schedules n more bytes after next and returns when they will have
// crossed.
func (c *pacedConn) pace(next *time.Time, n int) time.Time {
	*next = later(*next, time.Now()).Add(c.duration(n))
	return *next
}

// duration returns how long n bytes take to cross.
func (c *pacedConn) duration(n int) time.Duration {
	return time.Duration(float64(n) / c.rate * float64(time.Second))
}

func (c *pacedConn) CloseWrite() error { return c.Conn.(*net.TCPConn).CloseWrite() }

// BenchmarkAllReduceTLS is BenchmarkAllReduce over mutual TLS, and the
// same in plaintext, measured in turn in one run: compare the two sizes'
// busMB/s. Both sides run over loopback TCP (WithSharedMemory(false), and
// the benchmark fails if any connection moved to shared memory): members on
// one host otherwise move their frames to shared memory once the connection
// is set up, where TLS would carry only the handshake.
func BenchmarkAllReduceTLS(b *testing.B) {
	for _, n := range []int{2, 3} {
		for _, s := range benchSizes[2:] {
			for _, secure := range []bool{false, true} {
				name := map[bool]string{false: "plaintext", true: "tls"}[secure]
				b.Run(fmt.Sprintf("members=%d/size=%s/%s", n, s.name, name), func(b *testing.B) {
					each := func(int) []Option { return []Option{WithSharedMemory(false)} }
					if secure {
						configs := withConfigs(jobConfigs(b, newAuthority(b), n))
						each = func(i int) []Option { return append(configs(i), WithSharedMemory(false)) }
					}
					gs := benchGroups(b, n, each)
					requireTCP(b, gs)
					benchAllReduceOn(b, gs, s.bytes, false)
				})
			}
		}
	}
}

// requireTCP fails b unless every member of gs reaches every peer over TCP:
// no connection moved to shared memory.
func requireTCP(b testing.TB, gs []*Group) {
	for _, g := range gs {
		for _, p := range g.peers {
			// Not require.Nil, which would print the connection's mapped segment.
			if g.conns[p].viewer != nil {
				b.Fatalf("member %d reaches member %d over shared memory", g.rank, p)
			}
		}
	}
}

// benchInput returns random float32 values of moderate magnitude, the same
// for every caller, which must not modify them.
var benchInput = sync.OnceValue(func() []byte {
	return randomBuffer(rand.New(rand.NewPCG(1, 1)), Float32, benchSizes[len(benchSizes)-1].bytes/4)
})

func benchAllReduce(b *testing.B, n, size int, each func(int) []Option, opts ...CallOption) {
	benchAllReduceInto(b, n, size, each, false, opts...)
}

// benchAllReduceInto is benchAllReduce with the results in the members'
// arenas when pushed (see Group.outputBuffer).
func benchAllReduceInto(b *testing.B, n, size int, each func(int) []Option, pushed bool, opts ...CallOption) {
	benchAllReduceOn(b, benchGroups(b, n, each), size, pushed, opts...)
}

// benchGroups forms a group of n members in this process, member i with
// each(i), closed when b ends.
func benchGroups(b *testing.B, n int, each func(int) []Option) []*Group {
	lns, members := listeners(b, n)
	gs, err := formGroups(lns, members, each, WithTimeout(time.Minute))
	require.NoError(b, err)
	b.Cleanup(func() { closeAll(gs) })
	return gs
}

// benchAllReduceOn times AllReduceTo of size bytes between the members of
// gs, with the results in their arenas when pushed.
func benchAllReduceOn(b *testing.B, gs []*Group, size int, pushed bool, opts ...CallOption) {
	n := len(gs)
	src := benchInput()[:size]
	dsts := make([][]byte, n)
	for i := range dsts {
		dsts[i] = make([]byte, size)
		if !pushed {
			continue
		}
		buf := gs[i].outputBuffer(size)
		require.NotNil(b, buf, "member %d has no arena", i)
		b.Cleanup(buf.Release)
		dsts[i] = buf.Bytes()
	}
	ctx := context.Background()
	b.SetBytes(int64(size))
	b.ResetTimer()
	for range b.N {
		requireAllOK(b, onAll(gs, func(i int, g *Group) error {
			return g.AllReduceTo(ctx, "bench", Sum, Float32, dsts[i], src, opts...)
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

// BenchmarkReduceScatter measures, between 3 members in this process over
// loopback TCP and over shared memory, at 1 and 16 MiB of float32, the
// all-reduce, the reduce-scatter, and the reduce-scatter followed by the
// all-gather of the blocks into the whole buffer (AllGatherBlocks), which
// together make the all-reduce's result
// (sharded training's exchange): compare their ns/op in one run.
func BenchmarkReduceScatter(b *testing.B) {
	const n = 3
	for _, size := range []int{1 << 20, 16 << 20} {
		for _, tr := range transports {
			gs := newGroups(b, n, tr.opts...)
			rng := rand.New(rand.NewPCG(1, 3))
			ins, outs, blocks := make([][]byte, n), make([][]byte, n), make([][]byte, n)
			for i := range ins {
				ins[i] = randomBuffer(rng, Float32, size/4)
				outs[i] = make([]byte, size)
				_, l := ScatterBlock(size/4, n, i)
				blocks[i] = make([]byte, 4*l)
			}
			for _, way := range []string{"allreduce", "reducescatter", "reducescatter+allgather"} {
				b.Run(fmt.Sprintf("size=%dMiB/transport=%s/%s", size>>20, tr.name, way), func(b *testing.B) {
					b.SetBytes(int64(size))
					for range b.N {
						requireAllOK(b, onAll(gs, func(i int, g *Group) error {
							ctx := context.Background()
							if way == "allreduce" {
								return g.AllReduceTo(ctx, "x", Sum, Float32, outs[i], ins[i])
							}
							if err := g.ReduceScatter(ctx, "x", Sum, Float32, blocks[i], ins[i]); err != nil || way == "reducescatter" {
								return err
							}
							return g.AllGatherBlocks(ctx, "x", Float32, outs[i], blocks[i])
						}))
					}
				})
			}
		}
	}
}
