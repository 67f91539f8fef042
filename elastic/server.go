package elastic

import (
	"context"
	"crypto/tls"
	"fmt"
	"net"
	"slices"
	"sync"
	"time"

	"go.uber.org/zap"

	"github.com/tfdist/tfdist/logging"
	"github.com/tfdist/tfdist/mtls"
)

// helloTimeout bounds a new connection's hello; writeTimeout a message's
// write.
const (
	helloTimeout = 10 * time.Second
	writeTimeout = 5 * time.Second
)

// Server is the rendezvous of an elastic job.
type Server struct {
	cfg    serverConfig
	ln     net.Listener
	events chan event
	done   chan struct{} // closed when Serve returns
	conns  sync.WaitGroup
}

// Listen validates the options and listens on addr (host:port; port 0
// picks one).
func Listen(addr string, opts ...Option) (*Server, error) {
	return serve(func() (net.Listener, error) { return net.Listen("tcp", addr) }, addr, opts)
}

// NewServer is Listen on ln, a listener of the caller's (one in another
// network namespace, say), which the server closes when Serve returns.
func NewServer(ln net.Listener, opts ...Option) (*Server, error) {
	s, err := serve(func() (net.Listener, error) { return ln, nil }, ln.Addr().String(), opts)
	if err != nil {
		_ = ln.Close()
	}
	return s, err
}

// serve validates the options and makes the server of the listener
// listen returns, at addr.
func serve(listen func() (net.Listener, error), addr string, opts []Option) (*Server, error) {
	cfg := serverConfig{
		min: 1, max: 1,
		heartbeatTimeout: DefaultHeartbeatTimeout,
		roundTimeout:     DefaultRoundTimeout,
		settle:           DefaultSettle,
		waitTimeout:      DefaultWaitTimeout,
		flapLimit:        DefaultFlapLimit,
		flapWindow:       DefaultFlapWindow,
	}
	for _, o := range opts {
		o(&cfg)
	}
	if cfg.replay != nil {
		var err error
		if cfg.replay, cfg.until, err = schedule(cfg.replay); err != nil {
			return nil, err
		}
	}
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	cfg.log = logging.OrNop(cfg.log)
	if err := cfg.checkTLS(); err != nil {
		return nil, err
	}
	ln, err := listen()
	if err != nil {
		return nil, fmt.Errorf("elastic: listen on %s: %w", addr, err)
	}
	if cfg.tls != nil {
		ln = tls.NewListener(ln, cfg.tls)
	}
	return &Server{cfg: cfg, ln: ln, events: make(chan event, 64), done: make(chan struct{})}, nil
}

// checkTLS checks that the certificate WithTLS presents names
// mtls.RendezvousTask, as workers expect.
func (c serverConfig) checkTLS() error {
	if c.tls == nil {
		return nil
	}
	id, err := mtls.ConfigIdentity(c.tls)
	switch {
	case err != nil:
		return fmt.Errorf("elastic: WithTLS: %w", err)
	case id.Task != mtls.RendezvousTask:
		return fmt.Errorf("elastic: WithTLS: the certificate names %s; a rendezvous's must name %s, which workers check", id, mtls.RendezvousTask)
	}
	return nil
}

func (c serverConfig) validate() error {
	switch {
	case c.min < 1 || c.max < c.min:
		return fmt.Errorf("elastic: WithMembers(%d, %d): expected 1 ≤ min ≤ max", c.min, c.max)
	case c.heartbeatTimeout <= DefaultHeartbeat:
		return fmt.Errorf("elastic: WithHeartbeatTimeout(%v): expected more than the heartbeat, %v", c.heartbeatTimeout, DefaultHeartbeat)
	case c.roundTimeout <= 0:
		return fmt.Errorf("elastic: WithRoundTimeout(%v): expected a positive duration", c.roundTimeout)
	case c.settle < 0:
		return fmt.Errorf("elastic: WithSettle(%v): expected a duration ≥ 0", c.settle)
	case c.waitTimeout <= 0:
		return fmt.Errorf("elastic: WithWaitTimeout(%v): expected a positive duration", c.waitTimeout)
	case slices.ContainsFunc(c.sizes, func(n int) bool { return n < c.min || n > c.max }) || !slices.IsSorted(c.sizes):
		return fmt.Errorf("elastic: WithSizes(%v): expected ascending sizes between the minimum %d and the maximum %d", c.sizes, c.min, c.max)
	case c.flapLimit < 0 || c.flapWindow < 0:
		return fmt.Errorf("elastic: WithFlapLimit(%d, %v): expected a count and a duration ≥ 0", c.flapLimit, c.flapWindow)
	}
	return nil
}

// Addr is the address the server listens on.
func (s *Server) Addr() string { return s.ln.Addr().String() }

// Serve, called once, admits workers and forms memberships until the job finishes (a
// member leaves with done, and every worker has gone: nil), stops (too
// few members for longer than the wait timeout: a *StopError, also sent
// to every worker), or ctx ends. It closes the listener and every
// connection before it returns.
func (s *Server) Serve(ctx context.Context) error {
	go s.accept()
	err := s.run(ctx)
	close(s.done)
	_ = s.ln.Close()
	s.conns.Wait()
	return err
}

func (s *Server) accept() {
	for {
		c, err := s.ln.Accept()
		if err != nil {
			return
		}
		s.conns.Add(1)
		go s.serveConn(c)
	}
}

// event is what a connection tells the state loop.
type event struct {
	p   *peer
	msg message
	err error // the connection ended
}

// peer is a worker's connection, as the server sees it. Only the state
// loop touches its fields past conn and out.
type peer struct {
	conn     net.Conn
	out      chan message
	hello    Hello
	lastSeen time.Time
	claimed  time.Time // when it asked for a member's name
	report   *Report   // at a boundary, for the next membership
	leaving  bool
	gone     bool
}

func (s *Server) post(ev event) bool {
	select {
	case s.events <- ev:
		return true
	case <-s.done:
		return false
	}
}

// serveConn reads a worker's messages into the state loop.
func (s *Server) serveConn(c net.Conn) {
	defer s.conns.Done()
	p := &peer{conn: c, out: make(chan message, 32)}
	s.conns.Add(1)
	go s.write(p)
	_ = c.SetReadDeadline(time.Now().Add(helloTimeout))
	m, err := readMessage(c)
	if err == nil && (m.Kind != kindHello || m.Hello == nil) {
		err = fmt.Errorf("a %q message before its hello", m.Kind)
	}
	if err != nil {
		s.cfg.log.Warn("a connection without a hello", zap.Stringer("from", c.RemoteAddr()), zap.Error(err))
		close(p.out)
		return
	}
	if err := certifies(c, *m.Hello); err != nil {
		s.cfg.log.Warn("refused a worker", zap.String("worker", m.Hello.Name), zap.Stringer("from", c.RemoteAddr()), zap.Error(err))
		p.out <- message{Kind: kindRefused, Reason: err.Error()}
		close(p.out)
		return
	}
	_ = c.SetReadDeadline(time.Time{})
	p.hello = *m.Hello
	for ok := s.post(event{p: p, msg: m}); ok; {
		m, err := readMessage(c)
		if err != nil {
			s.post(event{p: p, err: err})
			return
		}
		ok = s.post(event{p: p, msg: m})
	}
	_ = c.Close()
}

// certifies checks that the certificate a worker presented on a TLS
// connection names the worker its hello names (see package mtls). A
// connection without TLS, or whose server configuration asked for no
// client certificate, has nothing to check.
func certifies(c net.Conn, h Hello) error {
	tc, ok := c.(*tls.Conn)
	if !ok || len(tc.ConnectionState().PeerCertificates) == 0 {
		return nil
	}
	id, err := mtls.IdentityOf(tc.ConnectionState().PeerCertificates[0])
	if err != nil {
		return err
	}
	if id.Task.String() != h.Name {
		return fmt.Errorf("its certificate names %s, but its hello names %q: a worker of a job that runs TLS is named as its certificate names it", id, h.Name)
	}
	return nil
}

// write sends p's messages until out is closed (or, once Serve has
// returned, empty), then closes the connection.
func (s *Server) write(p *peer) {
	defer s.conns.Done()
	defer p.conn.Close()
	for {
		var m message
		var ok bool
		select {
		case m, ok = <-p.out:
		case <-s.done:
			select {
			case m, ok = <-p.out:
			default:
			}
		}
		if !ok {
			return
		}
		_ = p.conn.SetWriteDeadline(time.Now().Add(writeTimeout))
		if writeMessage(p.conn, m) != nil {
			return
		}
	}
}

// run is the state loop: it alone changes the job's state.
func (s *Server) run(ctx context.Context) error {
	st := newState(s.cfg, time.Now())
	tick := time.NewTicker(s.cfg.heartbeatTimeout / 4)
	defer tick.Stop()
	for {
		var wake <-chan time.Time
		var timer *time.Timer
		if d, ok := st.nextDeadline(time.Now()); ok {
			timer = time.NewTimer(time.Until(d))
			wake = timer.C
		}
		select {
		case <-ctx.Done():
			st.stopAll(message{Kind: kindStop, Reason: "the rendezvous stopped: " + ctx.Err().Error()})
			return ctx.Err()
		case ev := <-s.events:
			st.handle(ev, time.Now())
		case now := <-tick.C:
			st.checkHeartbeats(now)
		case <-wake:
		}
		if timer != nil {
			timer.Stop()
		}
		if over, err := st.advance(time.Now()); over {
			return err
		}
	}
}
