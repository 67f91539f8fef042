package collective

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"
)

// records collects each member's Records.
type records struct {
	mu  sync.Mutex
	got map[int][]Record
}

func (r *records) option(i int) []Option {
	return []Option{WithObserver(func(rec Record) {
		r.mu.Lock()
		defer r.mu.Unlock()
		r.got[i] = append(r.got[i], rec)
	})}
}

func (r *records) of(i int) []Record {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]Record(nil), r.got[i]...)
}

// Every member knows which member arrived last at an operation and by how
// much, for the small all-reduces that hear from every member and for the
// large ones that go around the ring, and counts the wait in its Stats.
func TestRecordsNameTheLastMember(t *testing.T) {
	const late = 200 * time.Millisecond
	for _, size := range []int{64, 4 << 20} {
		rec := &records{got: map[int][]Record{}}
		lns, members := listeners(t, 3)
		gs, err := formGroups(lns, members, rec.option)
		require.NoError(t, err)
		requireAllOK(t, onAll(gs, func(i int, g *Group) error {
			if i == 2 {
				time.Sleep(late)
			}
			return g.AllReduce(context.Background(), "grad", Sum, Float32, make([]byte, size))
		}))
		closeAll(gs)
		for i := range gs {
			got := rec.of(i)
			require.NotEmpty(t, got, "member %d", i)
			r := got[0]
			assert.Equal(t, "all-reduce", r.Op)
			assert.Equal(t, "grad", r.Name)
			assert.Equal(t, size, r.Bytes)
			assert.NoError(t, r.Err)
			if size > defaultDirectMax {
				assert.Contains(t, r.Algorithm, "ring")
			} else {
				assert.Equal(t, "direct", r.Algorithm)
			}
			if i == 2 {
				assert.Equal(t, members[2], r.Last, "the late member sees itself last")
				assert.Less(t, r.Wait, late/2, "the late member waits for nobody")
				assert.Greater(t, r.Margin, late/2)
				continue
			}
			if size <= defaultDirectMax || i == 0 { // in the ring, member 0 hears from member 2
				assert.Equal(t, members[2], r.Last, "member %d, %d bytes", i, size)
				assert.Greater(t, r.Wait, late/2, "member %d, %d bytes", i, size)
				assert.GreaterOrEqual(t, gs[i].Stats().PeerWait, r.Wait)
			}
		}
	}
}

// A call that waits long for a peer says so in the log, once, naming the
// operation and the member it waits for, before it times out.
func TestHangWarningNamesThePeer(t *testing.T) {
	core, logs := observer.New(zapcore.WarnLevel)
	lns, members := listeners(t, 2)
	gs, err := formGroups(lns, members, nil, WithHangWarning(50*time.Millisecond), WithLogger(zap.New(core)))
	require.NoError(t, err)
	defer closeAll(gs)
	requireAllOK(t, onAll(gs, func(i int, g *Group) error {
		if i == 1 {
			time.Sleep(400 * time.Millisecond)
		}
		return g.AllReduce(context.Background(), "stuck", Sum, Float32, make([]byte, 16))
	}))
	warned := logs.FilterMessage("collective operation waiting for peers").All()
	require.Len(t, warned, 1, "one warning, from the member that waited")
	fields := warned[0].ContextMap()
	assert.Equal(t, "stuck", fields["name"])
	assert.Equal(t, "worker:0", fields["member"])
	assert.Equal(t, []any{"worker:1"}, fields["waiting_for"])
}
