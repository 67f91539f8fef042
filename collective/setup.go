package collective

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strings"
	"time"

	"go.uber.org/zap"
)

// setupState tracks the connections New waits for. Guarded by Group.mu.
type setupState struct {
	missing int
	lastErr []error       // by rank: why the last attempt failed
	formed  chan struct{} // closed when every peer is connected
	fatal   chan error    // an error no retry can fix
	done    bool          // New has returned
	err     error         // New failed
}

func newSetupState(n int) setupState {
	s := setupState{
		missing: n - 1,
		lastErr: make([]error, n),
		formed:  make(chan struct{}),
		fatal:   make(chan error, 1),
	}
	if n == 1 {
		s.done = true
		close(s.formed)
	}
	return s
}

// New joins the group members as member rank: it listens on
// members[rank].Addr (or the listener of WithListener), connects to every
// other member and checks that all were started with the same fingerprint,
// epoch and group size. It fails if a peer is not connected within the
// startup timeout, naming every missing member. Member i dials every member
// j < i and accepts the others.
func New(ctx context.Context, members []Member, rank int, opts ...Option) (*Group, error) {
	cfg := defaultConfig()
	for _, opt := range opts {
		opt(&cfg)
	}
	if err := validateMembers(members, rank); err != nil {
		if cfg.listener != nil {
			_ = cfg.listener.Close()
		}
		return nil, err
	}
	if cfg.tlsConfig != nil {
		if err := checkOwnIdentity(cfg.tlsConfig, members, rank); err != nil {
			if cfg.listener != nil {
				_ = cfg.listener.Close()
			}
			return nil, err
		}
	}
	g := newGroup(cfg, members, rank)
	ln, err := g.listen()
	if err != nil {
		return nil, err
	}
	g.ln = ln
	g.startShm()
	g.wg.Add(1)
	go g.acceptLoop(g.ln, g.handleAccepted)
	if err := g.connectAll(ctx); err != nil {
		g.abortSetup(err)
		return nil, err
	}
	for _, p := range g.peers {
		g.wg.Add(1)
		go g.readLoop(g.conns[p])
	}
	g.log.Debug("collective group formed", zap.Int("size", len(members)), zap.Int("rank", rank))
	return g, nil
}

func validateMembers(members []Member, rank int) error {
	if rank < 0 || rank >= len(members) {
		return fmt.Errorf("collective: rank %d out of range for %d members", rank, len(members))
	}
	seen := make(map[string]bool)
	for _, m := range members {
		if _, _, err := net.SplitHostPort(m.Addr); err != nil {
			return fmt.Errorf("collective: member %s: %w", m, err)
		}
		if seen[m.Addr] {
			return fmt.Errorf("collective: address %s appears twice", m.Addr)
		}
		seen[m.Addr] = true
	}
	return nil
}

// listen listens on this member's port on every interface, as
// TensorFlow's servers do: the member's host name may resolve to an address
// that is not the machine's own (a service's virtual IP, say). Peers'
// connections are checked against the members' hosts.
func (g *Group) listen() (net.Listener, error) {
	if g.cfg.listener != nil {
		return g.cfg.listener, nil
	}
	_, port, err := net.SplitHostPort(g.members[g.rank].Addr)
	if err != nil {
		return nil, fmt.Errorf("collective: member %s: %w", g.members[g.rank], err)
	}
	ln, err := net.Listen("tcp", net.JoinHostPort("", port))
	if err != nil {
		return nil, fmt.Errorf("collective: listen on port %s for %s: %w", port, g.members[g.rank], err)
	}
	return ln, nil
}

// connectAll dials the lower ranks and waits until every peer is connected.
func (g *Group) connectAll(ctx context.Context) error {
	sctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var timeout <-chan time.Time
	if d := g.cfg.startupTimeout; d > 0 {
		t := time.NewTimer(d)
		defer t.Stop()
		timeout = t.C
	}
	for _, p := range g.peers {
		if p < g.rank {
			g.wg.Add(1)
			go g.dialLoop(sctx, p)
		}
	}
	select {
	case <-g.setup.formed:
		return nil
	case err := <-g.setup.fatal:
		return err
	case <-timeout:
		return g.missingErr(context.DeadlineExceeded)
	case <-ctx.Done():
		return g.missingErr(ctx.Err())
	}
}

// errClaimed is why a hello is refused when its member is not missing.
const errClaimed = "the group is formed or the member is connected already"

// claimable reports whether New still waits for peer.
func (g *Group) claimable(peer int) bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.claimableLocked(peer)
}

func (g *Group) claimableLocked(peer int) bool {
	return !g.setup.done && g.err == nil && g.conns[peer] == nil
}

// claim installs c as the connection to peer while New waits for it.
func (g *Group) claim(peer int, c *peerConn) bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	delete(g.handshakes, c.nc)
	if !g.claimableLocked(peer) {
		return false
	}
	c.rank, c.member = peer, g.members[peer]
	g.conns[peer] = c
	g.auditJoined(c)
	g.setup.missing--
	if g.setup.missing == 0 {
		g.setup.done = true
		close(g.setup.formed)
	}
	return true
}

// setupFailed records why peer is not connected yet; fatal errors end New.
func (g *Group) setupFailed(peer int, err error, fatal bool) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if peer >= 0 {
		g.setup.lastErr[peer] = err
	}
	if fatal {
		select {
		case g.setup.fatal <- err:
		default:
		}
	}
}

func (g *Group) missingErr(cause error) error {
	g.mu.Lock()
	defer g.mu.Unlock()
	var missing []string
	for _, p := range g.peers {
		if g.conns[p] != nil {
			continue
		}
		s := g.members[p].String()
		if err := g.setup.lastErr[p]; err != nil {
			s += " (" + err.Error() + ")"
		}
		missing = append(missing, s)
	}
	return fmt.Errorf("collective: %s could not connect to %s within %v: %w",
		g.members[g.rank].Name, strings.Join(missing, ", "), g.cfg.startupTimeout, cause)
}

// abortSetup undoes a failed New: every connection and the listener close
// and every goroutine exits.
func (g *Group) abortSetup(err error) {
	g.mu.Lock()
	g.setup.done, g.setup.err = true, err
	g.err = err
	close(g.broken)
	conns := append([]*peerConn(nil), g.conns...)
	handshakes := g.handshakes
	g.handshakes = nil
	g.mu.Unlock()
	g.closeListeners()
	for nc := range handshakes {
		_ = nc.Close()
	}
	for _, c := range conns {
		if c != nil {
			_ = c.nc.Close()
		}
	}
	g.wg.Wait()
}

// errRetry marks a refused hello worth retrying.
var errRetry = errors.New("refused")
