package collective

import (
	"context"
	"fmt"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// listeners opens n loopback listeners and the members they serve.
func listeners(t testing.TB, n int) ([]net.Listener, []Member) {
	t.Helper()
	lns := make([]net.Listener, n)
	members := make([]Member, n)
	for i := range lns {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		require.NoError(t, err)
		lns[i] = ln
		members[i] = Member{Name: fmt.Sprintf("worker:%d", i), Addr: ln.Addr().String()}
	}
	return lns, members
}

// newGroups forms a group of n members in this process and closes it when
// the test ends.
func newGroups(t testing.TB, n int, opts ...Option) []*Group {
	t.Helper()
	gs, err := tryGroups(t, n, opts...)
	require.NoError(t, err)
	t.Cleanup(func() { closeAll(gs) })
	return gs
}

// tryGroups forms a group of n members, returning the first New error.
func tryGroups(t testing.TB, n int, opts ...Option) ([]*Group, error) {
	t.Helper()
	lns, members := listeners(t, n)
	return formGroups(lns, members, nil, opts...)
}

// formGroups forms a group of members, each listening on its listener and
// given opts and each(i)'s options, returning the first New error.
func formGroups(lns []net.Listener, members []Member, each func(i int) []Option, opts ...Option) ([]*Group, error) {
	n := len(members)
	gs := make([]*Group, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			// Bounds that a loaded machine never reaches; a test of
			// a timeout sets its own.
			o := append([]Option{WithListener(lns[i]), WithStartupTimeout(time.Minute),
				WithTimeout(time.Minute)}, opts...)
			if each != nil {
				o = append(o, each(i)...)
			}
			gs[i], errs[i] = New(context.Background(), members, i, o...)
		}()
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			closeAll(gs)
			return nil, err
		}
	}
	return gs, nil
}

// closeAll closes every non-nil group concurrently.
func closeAll(gs []*Group) {
	var wg sync.WaitGroup
	for _, g := range gs {
		if g != nil {
			wg.Add(1)
			go func() {
				defer wg.Done()
				_ = g.Close(context.Background())
			}()
		}
	}
	wg.Wait()
}

// onAll runs f on every member concurrently and returns their errors.
func onAll(gs []*Group, f func(i int, g *Group) error) []error {
	errs := make([]error, len(gs))
	var wg sync.WaitGroup
	for i, g := range gs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[i] = f(i, g)
		}()
	}
	wg.Wait()
	return errs
}

func requireAllOK(t testing.TB, errs []error) {
	t.Helper()
	for i, err := range errs {
		require.NoError(t, err, "member %d", i)
	}
}
