package elastic

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/tfdist/tfdist/collective"
	"github.com/tfdist/tfdist/mtls"
)

// Member is a worker's side of the rendezvous.
type Member struct {
	name    string
	addr    string
	conn    net.Conn
	wmu     sync.Mutex
	pending atomic.Bool
	leaving atomic.Bool
	next    chan Membership
	lost    chan Departure
	done    chan struct{} // closed when the connection ends
	err     error         // why, set before done is closed
	stop    chan struct{} // closed by Close
	once    sync.Once
	wg      sync.WaitGroup
}

// JoinOption configures Join.
type JoinOption func(*joinConfig)

type joinConfig struct {
	tls *tls.Config
}

// WithClientTLS joins a rendezvous that serves TLS, with cfg: a task's
// configuration of package mtls (mtls.LoadConfig), whose certificate names
// the worker as its Hello does. Unless cfg sets a ServerName, the
// rendezvous's certificate must name mtls.RendezvousTask.
func WithClientTLS(cfg *tls.Config) JoinOption { return func(c *joinConfig) { c.tls = cfg } }

// Join connects to the rendezvous at addr and introduces the worker. It
// returns once the server admitted it (a *RefusedError if not); the
// worker then asks for its first membership with Next.
func Join(ctx context.Context, addr string, h Hello, opts ...JoinOption) (*Member, error) {
	var cfg joinConfig
	for _, o := range opts {
		o(&cfg)
	}
	h.Protocol = ProtocolVersion
	var d net.Dialer
	c, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("elastic: join the rendezvous at %s: %w", addr, err)
	}
	if cfg.tls != nil {
		tc := cfg.tls.Clone()
		if tc.ServerName == "" {
			tc.ServerName = mtls.RendezvousTask.String()
		}
		c = tls.Client(c, tc)
	}
	stopWatch := context.AfterFunc(ctx, func() { _ = c.SetDeadline(time.Now()) })
	m, err := introduce(c, h)
	if !stopWatch() {
		err = errors.Join(err, ctx.Err())
	}
	if err != nil {
		_ = c.Close()
		return nil, fmt.Errorf("elastic: join the rendezvous at %s: %w", addr, err)
	}
	_ = c.SetDeadline(time.Time{})
	if m.Kind == kindRefused {
		_ = c.Close()
		if m.Done {
			return nil, ErrJobFinished
		}
		return nil, &RefusedError{Reason: m.Reason}
	}
	mb := &Member{name: h.Name, addr: addr, conn: c, next: make(chan Membership, 1), lost: make(chan Departure, 16),
		done: make(chan struct{}), stop: make(chan struct{})}
	mb.wg.Add(2)
	go mb.read()
	go mb.heartbeat()
	return mb, nil
}

func introduce(c net.Conn, h Hello) (message, error) {
	_ = c.SetDeadline(time.Now().Add(helloTimeout))
	if err := writeMessage(c, message{Kind: kindHello, Hello: &h}); err != nil {
		return message{}, err
	}
	m, err := readMessage(c)
	if err == nil && m.Kind != kindAccepted && m.Kind != kindRefused {
		err = fmt.Errorf("the rendezvous answered its hello with %q", m.Kind)
	}
	return m, err
}

// read delivers the server's messages until the connection ends.
func (m *Member) read() {
	defer m.wg.Done()
	err := m.readLoop()
	select {
	case <-m.stop:
		err = errClosed
	default:
	}
	m.err = err
	close(m.done)
}

var errClosed = errors.New("elastic: the member is closed")

func (m *Member) readLoop() error {
	for {
		msg, err := readMessage(m.conn)
		if err != nil {
			return fmt.Errorf("elastic: the rendezvous at %s is lost: %w", m.addr, err)
		}
		switch msg.Kind {
		case kindPending:
			m.pending.Store(true)
		case kindMembership:
			if msg.Membership == nil {
				return fmt.Errorf("elastic: the rendezvous at %s sent an empty membership", m.addr)
			}
			m.pending.Store(false)
			select {
			case <-m.next:
			default:
			}
			m.next <- *msg.Membership
		case kindLost:
			for _, d := range msg.Left {
				select {
				case m.lost <- d:
				default: // a reader that lags has its group broken already
				}
			}
		case kindStop:
			if msg.Done {
				return ErrJobFinished
			}
			return &StopError{Left: msg.Left, reason: msg.Reason}
		default:
			return fmt.Errorf("elastic: the rendezvous at %s sent %q, which a worker does not expect", m.addr, msg.Kind)
		}
	}
}

// heartbeat tells the server the worker is alive.
func (m *Member) heartbeat() {
	defer m.wg.Done()
	t := time.NewTicker(DefaultHeartbeat)
	defer t.Stop()
	for {
		select {
		case <-t.C:
			if m.send(message{Kind: kindPing}) != nil {
				return
			}
		case <-m.done:
			return
		case <-m.stop:
			return
		}
	}
}

func (m *Member) send(msg message) error {
	m.wmu.Lock()
	defer m.wmu.Unlock()
	_ = m.conn.SetWriteDeadline(time.Now().Add(writeTimeout))
	if err := writeMessage(m.conn, msg); err != nil {
		return fmt.Errorf("elastic: tell the rendezvous at %s: %w", m.addr, err)
	}
	return nil
}

// Lost delivers the members the server saw go without leaving (a dead
// process, a silent host), each with the epoch of the membership it left:
// a member whose group is that membership's may abort it rather than wait
// for the collective timeout. Departures of older epochs are stale.
func (m *Member) Lost() <-chan Departure { return m.lost }

// Name returns the worker's name, as its Hello gave it.
func (m *Member) Name() string { return m.name }

// Pending says whether the server waits for the members to report at
// their next step boundary: a worker waits to join, or a member left.
// Members must agree on the boundary (Agree) before they report.
func (m *Member) Pending() bool { return m.pending.Load() }

// Next reports the worker at a step boundary and waits for the next
// membership. A member that loses a peer calls it at once; the others
// learn to from Pending.
func (m *Member) Next(ctx context.Context, r Report) (Membership, error) {
	if err := m.send(message{Kind: kindReady, Report: &r}); err != nil {
		return Membership{}, m.cause(err)
	}
	select {
	case mb := <-m.next:
		return mb, nil
	case <-m.done:
		return Membership{}, m.err
	case <-ctx.Done():
		return Membership{}, fmt.Errorf("elastic: wait for the next membership: %w", ctx.Err())
	}
}

// cause prefers the reader's error (a stop, say) to a failed write.
func (m *Member) cause(err error) error {
	select {
	case <-m.done:
		return m.err
	case <-time.After(100 * time.Millisecond):
		return err
	}
}

// Leave tells the server the worker leaves at this boundary (done: the
// job is finished, and no new membership forms) and closes the member.
func (m *Member) Leave(done bool) error {
	err := m.send(message{Kind: kindLeave, Done: done})
	return errors.Join(err, m.Close())
}

// Close ends the connection; the server counts the worker as gone.
func (m *Member) Close() error {
	m.once.Do(func() {
		close(m.stop)
		_ = m.conn.Close()
	})
	m.wg.Wait()
	return nil
}

// LeaveSoon makes the worker's next Agree stop every member, so that it
// can leave at that boundary (Leave) while the others report (Next): a
// graceful leave, on SIGTERM say.
func (m *Member) LeaveSoon() { m.leaving.Store(true) }

// Leaving says whether LeaveSoon was called.
func (m *Member) Leaving() bool { return m.leaving.Load() }

// Agree says whether any member of g has a change pending or wants to
// leave, the same answer on every member: called at every step boundary
// (or every few, the same on all), it is where members stop together to
// report. A membership of one has no group: g nil.
func (m *Member) Agree(ctx context.Context, g *collective.Group, name string) (bool, error) {
	var b [4]byte
	if m.Pending() || m.leaving.Load() {
		b[0] = 1
	}
	if g == nil {
		return b[0] != 0, nil
	}
	if err := g.AllReduce(ctx, name, collective.Max, collective.Int32, b[:]); err != nil {
		return false, err
	}
	return b[0] != 0, nil
}
