package collective

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"

	"go.uber.org/zap"
)

// closeName is the reserved name of the barrier Close holds.
const closeName = "\x00close"

// Group is one member's handle on a group of processes that run collective
// operations together. Its methods are safe for concurrent use.
type Group struct {
	cfg     config
	members []Member
	rank    int
	peers   []int // ranks of the other members, ascending
	log     *zap.Logger
	audit   *zap.Logger // the audit trail of peers joining, leaving and refused
	ln      net.Listener
	shmLn   *net.UnixListener // where peers on this host send segments; nil without
	arena   *arena            // this process's arena, which peers on this host map; nil without
	conns   []*peerConn       // by rank; nil for this member and until connected
	wg      sync.WaitGroup

	mu          sync.Mutex
	applied     *sync.Cond // on mu: a reader ended an in-place application (see ringRecv)
	names       map[string]*nameState
	left        []bool // the peer closed its group in order
	closing     []bool // the peer (or, at rank, this member) is closing: it starts no operation
	err         error
	broken      chan struct{} // closed when err is set
	setup       setupState
	handshakes  map[net.Conn]struct{}
	offers      map[string]chan shmDelivery // shared-memory offers by nonce
	peerWait    time.Duration               // time operations waited for peers to arrive, overlaps counted once
	waitedUntil time.Time                   // the end of the last such wait

	hostMu  sync.Mutex
	hostIPs map[netip.Addr]bool

	closeOnce sync.Once
	closeErr  error

	started     [opReduceScatter + 1]atomic.Int64 // operations started, by kind
	sent        atomic.Int64                      // payload bytes of data frames written
	remoteReads atomic.Int64                      // chunks read from a peer's memory (remote.go)
	pushed      atomic.Int64                      // chunks written into a peer's result (push.go)
}

// Stats counts the operations a member has started, by kind: those that
// go to the network, so none in a group of one member, whose operations
// complete locally. Close's barrier counts among the barriers.
type Stats struct {
	AllReduces, AllGathers, Broadcasts, Barriers, ReduceScatters int64
	// BytesSent counts the payload bytes of the operations' frames this
	// member wrote: what compression reduces.
	BytesSent int64
	// PeerWait is the time operations spent waiting, from their start,
	// for the last member they hear from (Record.Wait); waits that
	// overlap in time count once.
	PeerWait time.Duration
}

// Stats returns the operations this member has started since the group
// was formed.
func (g *Group) Stats() Stats {
	return Stats{
		AllReduces:     g.started[opAllReduce].Load(),
		AllGathers:     g.started[opAllGather].Load(),
		Broadcasts:     g.started[opBroadcast].Load(),
		Barriers:       g.started[opBarrier].Load(),
		ReduceScatters: g.started[opReduceScatter].Load(),
		BytesSent:      g.sent.Load(),
		PeerWait:       g.waited(),
	}
}

func (g *Group) waited() time.Duration {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.peerWait
}

func newGroup(cfg config, members []Member, rank int) *Group {
	g := &Group{
		cfg:        cfg,
		members:    append([]Member(nil), members...),
		rank:       rank,
		log:        cfg.log.With(zap.String("member", members[rank].Name)),
		audit:      cfg.log.Named("audit").With(zap.String("member", members[rank].Name)),
		conns:      make([]*peerConn, len(members)),
		names:      make(map[string]*nameState),
		left:       make([]bool, len(members)),
		closing:    make([]bool, len(members)),
		broken:     make(chan struct{}),
		handshakes: make(map[net.Conn]struct{}),
		hostIPs:    make(map[netip.Addr]bool),
	}
	for r := range members {
		if r != rank {
			g.peers = append(g.peers, r)
		}
	}
	g.applied = sync.NewCond(&g.mu)
	g.setup = newSetupState(len(members))
	return g
}

// Rank returns this member's index in Members.
func (g *Group) Rank() int { return g.rank }

// Size returns the number of members.
func (g *Group) Size() int { return len(g.members) }

// Members returns a copy of the group's members in rank order.
func (g *Group) Members() []Member { return append([]Member(nil), g.members...) }

// Err returns the error that broke the group (ErrClosed after Close), nil
// while it works.
func (g *Group) Err() error {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.err
}

// Close holds a barrier with every peer (bounded by ctx and the group's
// timeout) so that no member leaves while a peer still needs it, then shuts
// every connection down in order: goodbye frame, half-close, drain to EOF,
// close. Operations still pending fail with ErrClosed, and so do those
// started once Close has begun. When no operation is pending, Close first
// tells every peer that it is closing, so that a peer's operation that
// waits for this member fails at once with a *PeerError wrapping
// ErrPeerLeft (the program on this member has finished) rather than at the
// timeout. Close is idempotent and returns once every goroutine of the
// group has exited.
func (g *Group) Close(ctx context.Context) error {
	g.closeOnce.Do(func() { g.closeErr = g.close(ctx) })
	return g.closeErr
}

func (g *Group) close(ctx context.Context) error {
	var err error
	if g.Err() == nil && len(g.members) > 1 {
		g.announceClosing()
		if err = g.barrier(ctx, closeName); err != nil {
			err = fmt.Errorf("collective: close: %w", err)
		}
	}
	g.fail(ErrClosed)
	g.closeListeners()
	g.wg.Wait()
	return err
}

// announceClosing makes this member start no operation but its closing
// barrier and, when none is pending, tells every peer so (a closing frame,
// written within the linger bound): an operation still pending may need
// frames this member has yet to send, so then it says nothing.
func (g *Group) announceClosing() {
	g.mu.Lock()
	g.closing[g.rank] = true
	idle := !g.pendingLocked()
	conns := g.connectedLocked()
	g.mu.Unlock()
	if !idle {
		return
	}
	frame := appendHeader(nil, &header{kind: kindClosing, epoch: g.cfg.epoch})
	deadline := time.Now().Add(g.cfg.linger)
	for _, c := range conns {
		if err := c.write(deadline, frame, nil); err != nil {
			g.log.Debug("collective closing frame not sent", zap.String("peer", c.member.Name), zap.Error(err))
		}
	}
}

// fail breaks the group with err unless it is already broken, and returns
// the error the group is broken with. Every pending operation wakes up and
// fails; every connection is shut down (abort frame, or goodbye for
// ErrClosed) and its reader exits. The listeners stay open until Close.
func (g *Group) fail(err error) error {
	g.mu.Lock()
	if g.err != nil {
		defer g.mu.Unlock()
		return g.err
	}
	g.err = err
	close(g.broken)
	handshakes := g.handshakes
	g.handshakes = nil
	conns := g.connectedLocked()
	g.wg.Add(len(conns)) // before unlocking, so that Close's Wait covers them
	g.mu.Unlock()
	if !errors.Is(err, ErrClosed) {
		g.log.Warn("collective group broken", zap.Error(err))
	}
	for nc := range handshakes {
		_ = nc.Close()
	}
	final := g.finalFrame(err)
	for _, c := range conns {
		go func() {
			defer g.wg.Done()
			c.shutdown(final, g.cfg.linger)
		}()
	}
	return err
}

// closeListeners stops accepting peers and their segments. A group broken
// by a failure keeps its listeners open, accepting nothing, until Close:
// this process stays reachable at its address, so that a peer checking on
// it after the failure finds it alive rather than gone.
func (g *Group) closeListeners() {
	_ = g.ln.Close()
	if g.shmLn != nil {
		_ = g.shmLn.Close()
	}
}

// finalFrame encodes the last frame sent to every peer: goodbye after
// Close, else an abort carrying err.
func (g *Group) finalFrame(err error) []byte {
	if errors.Is(err, ErrClosed) {
		return appendHeader(nil, &header{kind: kindGoodbye, epoch: g.cfg.epoch})
	}
	payload := encodeAbort(err)
	h := header{kind: kindAbort, epoch: g.cfg.epoch, length: uint32(len(payload))}
	return append(appendHeader(nil, &h), payload...)
}

// connectedLocked returns the connections whose reader runs. Caller holds
// g.mu.
func (g *Group) connectedLocked() []*peerConn {
	var cs []*peerConn
	if g.setup.done && g.setup.err == nil {
		for _, c := range g.conns {
			if c != nil {
				cs = append(cs, c)
			}
		}
	}
	return cs
}

// peerError builds the error for a peer's connection failing with err.
func (g *Group) peerError(rank int, err error) error {
	return &PeerError{Peer: g.members[rank], Err: err}
}

// writeGrace is how long a write to a peer that failed waits for the
// peer's reader to break the group.
const writeGrace = 200 * time.Millisecond

// writeFailed is the error of a write to peer that failed with err: the
// group's, once the connection's reader has broken it with what it saw
// (the peer's goodbye, or the end of the connection, which follows a dead
// peer's failed write at once), or, should the reader see nothing within
// writeGrace, a lost connection. Either way the error says what became of
// the peer, whichever of the write and the read noticed first.
func (g *Group) writeFailed(peer int, err error) error {
	select {
	case <-g.broken:
		return g.Err()
	case <-time.After(writeGrace):
	}
	return g.peerError(peer, fmt.Errorf("%w: %w", ErrPeerLost, err))
}

// Abort breaks the group with err, sent to every peer: their pending and
// later operations fail at once with a *PeerError that names this member
// and carries err's text. A member aborts when it cannot take part in the
// operations its peers wait in (its input failed, say), so that they learn
// why without waiting for the timeout. Close still releases the group.
func (g *Group) Abort(err error) {
	if err == nil {
		err = errors.New("aborted")
	}
	g.fail(err)
}
