package ctxsync

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// A waiter gives up when its context ends, and the lock still works.
func TestLockContextGivesUpWhenItsContextEnds(t *testing.T) {
	var m Mutex
	m.Lock()
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- m.LockContext(ctx) }()
	select {
	case err := <-done:
		require.ErrorIs(t, err, context.DeadlineExceeded)
	case <-time.After(30 * time.Second): // m stays locked: without its context, the wait never ends
		t.Fatal("LockContext still waits 30 s after its 50 ms context ended")
	}
	m.Unlock()
	require.NoError(t, m.LockContext(context.Background()))
	m.Unlock()
}

// The lock excludes: concurrent increments under it are all counted.
func TestMutexExcludes(t *testing.T) {
	var m Mutex
	n := 0
	var wg sync.WaitGroup
	for i := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range 1000 {
				if i%2 == 0 {
					m.Lock()
				} else if err := m.LockContext(context.Background()); err != nil {
					t.Error(err)
					return
				}
				n++
				m.Unlock()
			}
		}()
	}
	wg.Wait()
	assert.Equal(t, 8000, n)
}

func TestUnlockOfAnUnlockedMutexPanics(t *testing.T) {
	var m Mutex
	assert.Panics(t, m.Unlock)
}
