package taskserver

import (
	"context"
	"crypto/sha256"
	"crypto/tls"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"strconv"
	"sync"
	"time"

	"github.com/google/uuid"
	tf "github.com/wamuir/graft/tensorflow"
	"go.uber.org/zap"

	"github.com/tfdist/tfdist/internal/partition"
	"github.com/tfdist/tfdist/mtls"
)

// idleTimeout is how long a server keeps an idle connection: longer than
// its clients keep theirs (clientIdleTimeout), so that a client closes
// first and never sends a request on a connection the server is closing.
const idleTimeout = 5 * time.Minute

// Server serves one task: the fragments of its partition.Host, and the
// plans the task executes. Safe for concurrent use.
type Server struct {
	host        *partition.Host
	cfg         config
	log, audit  *zap.Logger
	incarnation string
	tls         *tls.Config   // cfg.tls, auditing its refusals
	own         mtls.Identity // the task the server's certificate names, if known
	srv         *http.Server

	mu        sync.Mutex
	closed    bool
	fragments map[string][sha256.Size]byte // imported through the server, by prefix
	runners   map[string]partition.Runner  // the host's, by prefix
	plans     map[string]*installed
	clients   map[string]*Client // by address and task
	peers     map[net.Conn]*peer

	importing sync.Mutex
	handlers  sync.WaitGroup // requests being handled
	work      sync.WaitGroup // the runs they started
	refused   sync.Map       // addresses whose handshake was refused and audited
}

// installed is a plan installed on the server, with the runners of its
// tasks.
type installed struct {
	plan    *partition.Plan
	runners map[string]partition.Runner
}

// NewServer returns a server of host, which it does not close.
func NewServer(host *partition.Host, opts ...Option) *Server {
	cfg := newConfig(opts)
	s := &Server{
		host: host, cfg: cfg, log: cfg.log, audit: cfg.log.Named("audit"), incarnation: uuid.NewString(),
		fragments: map[string][sha256.Size]byte{}, runners: map[string]partition.Runner{},
		plans: map[string]*installed{}, clients: map[string]*Client{}, peers: map[net.Conn]*peer{},
	}
	if cfg.tls != nil {
		s.tls = s.auditing(cfg.tls)
		s.own, _ = ownIdentity(cfg.tls)
	}
	mux := http.NewServeMux()
	mux.Handle(pathPing, s.handle(func(*decoder) call { return none }))
	mux.Handle(pathImport, s.handle(s.importFragment))
	mux.Handle(pathRun, s.handle(s.run))
	mux.Handle(pathInstallPlan, s.handle(s.installPlan))
	mux.Handle(pathRunPlan, s.handle(s.runPlan))
	s.srv = &http.Server{
		Handler: mux, ReadHeaderTimeout: cfg.timeout, IdleTimeout: idleTimeout, MaxHeaderBytes: 64 << 10,
		ErrorLog: log.New(errorLog{s}, "", 0), ConnContext: s.connContext, ConnState: s.connState,
	}
	return s
}

// Serve serves the connections ln accepts until Close, and then returns
// http.ErrServerClosed; it closes ln.
func (s *Server) Serve(ln net.Listener) error {
	if s.tls != nil {
		ln = tls.NewListener(ln, s.tls)
	}
	return s.srv.Serve(ln)
}

// Close stops the server: it closes its listeners and connections, and
// returns once the requests in progress have returned and the runs they
// started on the host, which TensorFlow does not interrupt, have ended.
// Calling it again does nothing.
func (s *Server) Close() error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil
	}
	s.closed = true
	s.mu.Unlock()
	err := s.srv.Close()
	s.handlers.Wait()
	s.work.Wait()
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, c := range s.clients {
		c.Close()
	}
	return err
}

// Incarnation returns the server's identity: random, new each server.
func (s *Server) Incarnation() string { return s.incarnation }

// call is the work of a request, once its body is read.
type call func(ctx context.Context) (*encoder, error)

func none(context.Context) (*encoder, error) { return &encoder{}, nil }

// handle serves the requests of one path: admits them, reads their body
// with decode and runs the call it returns.
func (s *Server) handle(decode func(*decoder) call) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set(headerProtocol, protocolVersion)
		w.Header().Set(headerIncarnation, s.incarnation)
		if !s.enter() {
			s.reply(w, nil, http.StatusServiceUnavailable, fmt.Errorf("taskserver: %w: it is closing", ErrUnavailable))
			return
		}
		defer s.handlers.Done()
		if !s.admit(w, r) {
			return
		}
		rc := http.NewResponseController(w)
		_ = rc.SetReadDeadline(time.Now().Add(s.cfg.timeout))
		d := newDecoder(r.Body, r.ContentLength)
		c := decode(d)
		err := d.end()
		d.release()
		if err != nil {
			s.log.Warn("taskserver: unreadable request", zap.String("path", r.URL.Path), zap.String("address", r.RemoteAddr), zap.Error(err))
			s.reply(w, nil, http.StatusBadRequest, fmt.Errorf("taskserver: %s: %w", r.URL.Path, err))
			return
		}
		_, _ = io.Copy(io.Discard, r.Body)  // sees the body's end: net/http then watches for the client leaving
		_ = rc.SetReadDeadline(time.Time{}) // which a long run must not end
		ctx, cancel := requestContext(r)
		defer cancel()
		e, err := c(ctx)
		s.auditValue(r, err)
		s.reply(w, e, http.StatusOK, err)
	})
}

func (s *Server) enter() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return false
	}
	s.handlers.Add(1)
	return true
}

// reply writes e, or err and the status it calls for (status if it calls
// for none).
func (s *Server) reply(w http.ResponseWriter, e *encoder, status int, err error) {
	if err != nil {
		we := toWire(err)
		if status == http.StatusOK {
			status = we.status()
		}
		e = &encoder{}
		e.wireError(we)
	}
	if e == nil {
		e = &encoder{}
	}
	_ = http.NewResponseController(w).SetWriteDeadline(time.Now().Add(s.cfg.timeout))
	w.Header().Set("Content-Type", contentType)
	w.Header().Set("Content-Length", strconv.Itoa(e.buf.Len()))
	w.WriteHeader(status)
	_, _ = w.Write(e.buf.Bytes()) // a client that left learns nothing more
}

// async runs f, and returns its result, or ctx's error if ctx ends first:
// runs on the host go on when their caller leaves, and end on their own.
func (s *Server) async(ctx context.Context, f func() ([]*tf.Tensor, error)) ([]*tf.Tensor, error) {
	type result struct {
		out []*tf.Tensor
		err error
	}
	done := make(chan result, 1)
	s.work.Add(1)
	go func() {
		defer s.work.Done()
		out, err := f()
		done <- result{out, err}
	}()
	select {
	case r := <-done:
		return r.out, r.err
	case <-ctx.Done():
		return nil, fmt.Errorf("taskserver: the caller stopped waiting: %w", ctx.Err())
	}
}

// importFragment imports a fragment into the host; importing the same
// fragment again under the same prefix does nothing.
func (s *Server) importFragment(d *decoder) call {
	prefix, fragment := d.string("prefix"), d.bytes("fragment")
	return func(context.Context) (*encoder, error) {
		sum := sha256.Sum256(fragment)
		s.importing.Lock()
		defer s.importing.Unlock()
		s.mu.Lock()
		have, ok := s.fragments[prefix]
		s.mu.Unlock()
		switch {
		case ok && have == sum:
			return &encoder{}, nil
		case ok:
			return nil, fmt.Errorf("taskserver: prefix %q: another fragment is imported under it", prefix)
		}
		if err := s.host.Import(prefix, fragment); err != nil {
			return nil, err
		}
		s.mu.Lock()
		s.fragments[prefix] = sum
		s.mu.Unlock()
		return &encoder{}, nil
	}
}

// run runs a fragment of the host.
func (s *Server) run(d *decoder) call {
	prefix, fetches, targets := d.string("prefix"), d.strings("fetches"), d.strings("targets")
	feeds := d.tensorMap()
	return func(ctx context.Context) (*encoder, error) {
		r, err := s.runner(prefix)
		if err != nil {
			return nil, err
		}
		out, err := s.async(ctx, func() ([]*tf.Tensor, error) { return r.Run(ctx, feeds, fetches, targets) })
		if err != nil {
			return nil, err
		}
		return result(fetches, out)
	}
}

func result(names []string, out []*tf.Tensor) (*encoder, error) {
	e := &encoder{}
	if err := e.tensors(names, out); err != nil {
		return nil, err
	}
	return e, nil
}

// runner returns the host's runner of the fragment imported under prefix.
func (s *Server) runner(prefix string) (partition.Runner, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if r, ok := s.runners[prefix]; ok {
		return r, nil
	}
	if !s.host.Imported(prefix) {
		return nil, fmt.Errorf("taskserver: fragment %q: %w", prefix, ErrUnknown)
	}
	r := s.host.Runner(prefix)
	s.runners[prefix] = r
	return r, nil
}

// localRunner runs the host's fragment imported under prefix, or fails
// with ErrUnknown.
type localRunner struct {
	s      *Server
	prefix string
}

func (l localRunner) Run(ctx context.Context, feeds map[string]*tf.Tensor, fetches, targets []string) ([]*tf.Tensor, error) {
	r, err := l.s.runner(l.prefix)
	if err != nil {
		return nil, err
	}
	return r.Run(ctx, feeds, fetches, targets)
}

// installPlan stores a plan and the runners of its tasks, replacing the
// plan of the same id.
func (s *Server) installPlan(d *decoder) call {
	id, p, addrs := d.string("plan id"), d.plan(), d.stringMap("addresses")
	return func(context.Context) (*encoder, error) {
		runners, err := s.planRunners(id, p, addrs)
		if err != nil {
			return nil, err
		}
		s.mu.Lock()
		s.plans[id] = &installed{plan: p, runners: runners}
		s.mu.Unlock()
		return &encoder{}, nil
	}
}

// planRunners returns a runner of every task of plan id: the host's for
// the task whose address is "", a client's of the address for the others.
func (s *Server) planRunners(id string, p *partition.Plan, addrs map[string]string) (map[string]partition.Runner, error) {
	runners := map[string]partition.Runner{}
	local := ""
	for _, round := range p.Rounds {
		for _, run := range round {
			addr, ok := addrs[run.Task]
			switch {
			case runners[run.Task] != nil:
			case !ok:
				return nil, fmt.Errorf("taskserver: plan %q: no address for task %s, expected one (or \"\" for this server's task)", id, run.Task)
			case addr == "" && local != "":
				return nil, fmt.Errorf("taskserver: plan %q: tasks %s and %s both have address \"\", which names this server's task", id, local, run.Task)
			case addr == "":
				local = run.Task
				runners[run.Task] = localRunner{s: s, prefix: id}
			default:
				runners[run.Task] = s.client(addr, run.Task).Runner(id)
			}
		}
	}
	return runners, nil
}

// client returns the server's client of the task device (a device name,
// "/job:ps/replica:0/task:0") at addr, made on first use.
func (s *Server) client(addr, device string) *Client {
	task := taskName(device)
	key := addr + "\x00" + task
	s.mu.Lock()
	defer s.mu.Unlock()
	if c, ok := s.clients[key]; ok {
		return c
	}
	c := NewClient(addr, WithTLS(s.cfg.tls), WithJob(s.cfg.job), WithLogger(s.cfg.log), WithTimeout(s.cfg.timeout), withServerName(task))
	s.clients[key] = c
	return c
}

// runPlan executes an installed plan.
func (s *Server) runPlan(d *decoder) call {
	id, feeds := d.string("plan id"), d.tensorMap()
	return func(ctx context.Context) (*encoder, error) {
		s.mu.Lock()
		in := s.plans[id]
		s.mu.Unlock()
		if in == nil {
			return nil, fmt.Errorf("taskserver: plan %q: %w", id, ErrUnknown)
		}
		out, err := s.async(ctx, func() ([]*tf.Tensor, error) { return in.plan.Execute(ctx, in.runners, feeds) })
		if err != nil {
			return nil, err
		}
		return result(in.plan.Fetches, out)
	}
}
