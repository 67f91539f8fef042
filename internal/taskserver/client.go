package taskserver

import (
	"bytes"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptrace"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	tf "github.com/wamuir/graft/tensorflow"

	"github.com/tfdist/tfdist/cluster"
	"github.com/tfdist/tfdist/internal/partition"
	"github.com/tfdist/tfdist/internal/tfrt"
)

const (
	// clientIdleTimeout is how long a client keeps an idle connection:
	// less than a server does (idleTimeout).
	clientIdleTimeout = 90 * time.Second
	// maxIdleConns is how many idle connections a client keeps: as many
	// as calls it makes at once, or a busy client would close and open
	// connections at every call.
	maxIdleConns = 64
)

// Client talks to one task's server. Safe for concurrent use; its
// connections are kept and reused.
type Client struct {
	addr string
	cfg  config
	base string // the URL of the server, without a path
	tr   *http.Transport
	http *http.Client

	mu          sync.Mutex
	incarnation string // the server's, as last seen
}

// NewClient returns a client of the server at addr (host:port). It
// connects on its first call.
func NewClient(addr string, opts ...Option) *Client {
	cfg := newConfig(opts)
	c := &Client{addr: addr, cfg: cfg, base: "http://" + addr}
	dialer := &net.Dialer{Timeout: cfg.timeout, KeepAlive: 30 * time.Second}
	c.tr = &http.Transport{
		DialContext: dialer.DialContext, MaxIdleConns: maxIdleConns, MaxIdleConnsPerHost: maxIdleConns,
		IdleConnTimeout: clientIdleTimeout, DisableCompression: true,
	}
	if cfg.tls != nil {
		c.base = "https://" + addr
		c.tr.DialTLSContext = c.dialTLS(dialer)
	}
	c.http = &http.Client{Transport: c.tr, CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	return c
}

// Close closes the client's idle connections.
func (c *Client) Close() { c.tr.CloseIdleConnections() }

// Ping returns the server's incarnation.
func (c *Client) Ping(ctx context.Context) (incarnation string, err error) {
	err = c.call(ctx, "ping", pathPing, &encoder{}, true, nil)
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.incarnation, err
}

// Import imports fragment, a serialized GraphDef (a partition.Plan's
// fragment), into the server's host under prefix. Importing the same
// fragment under the same prefix again does nothing; another is an error.
func (c *Client) Import(ctx context.Context, prefix string, fragment []byte) error {
	e := &encoder{}
	e.string(prefix)
	e.bytes(fragment)
	return c.call(ctx, fmt.Sprintf("import %q", prefix), pathImport, e, true, nil)
}

// Runner returns the Runner of the fragment imported on the server's host
// under prefix.
func (c *Client) Runner(prefix string) partition.Runner { return remoteRunner{c: c, prefix: prefix} }

type remoteRunner struct {
	c      *Client
	prefix string
}

func (r remoteRunner) Run(ctx context.Context, feeds map[string]*tf.Tensor, fetches, targets []string) ([]*tf.Tensor, error) {
	e := &encoder{}
	e.string(r.prefix)
	e.strings(fetches)
	e.strings(targets)
	if err := e.tensorMap(feeds); err != nil {
		return nil, err
	}
	var out []*tf.Tensor
	err := r.c.call(ctx, fmt.Sprintf("run %q", r.prefix), pathRun, e, false, func(d *decoder) { out = d.fetched(fetches) })
	return out, err
}

// fetched reads the values of the tensors names.
func (d *decoder) fetched(names []string) []*tf.Tensor {
	got, ts := d.tensors()
	if d.err == nil && !slices.Equal(got, names) {
		d.fail("values of %v, expected %v", got, names)
	}
	return ts
}

// InstallPlan stores plan on the server under id, replacing the plan of
// that id. Its fragments are not sent: each task's was imported on that
// task under the prefix id beforehand. addrs gives the address of the
// server of each task of the plan, and "" for the server's own task, whose
// fragment runs on its host.
func (c *Client) InstallPlan(ctx context.Context, id string, plan *partition.Plan, addrs map[string]string) error {
	e := &encoder{}
	e.string(id)
	e.plan(plan)
	e.stringMap(addrs)
	return c.call(ctx, fmt.Sprintf("install plan %q", id), pathInstallPlan, e, true, nil)
}

// RunPlan executes the plan installed under id on the server, which runs
// the plan's other tasks' fragments on their servers, and returns the
// values of the plan's Fetches. The error of a run of another task is a
// *partition.RunError naming that task.
func (c *Client) RunPlan(ctx context.Context, id string, feeds map[string]*tf.Tensor) ([]*tf.Tensor, error) {
	e := &encoder{}
	e.string(id)
	if err := e.tensorMap(feeds); err != nil {
		return nil, err
	}
	var out []*tf.Tensor
	err := c.call(ctx, fmt.Sprintf("run plan %q", id), pathRunPlan, e, false, func(d *decoder) { _, out = d.tensors() })
	return out, err
}

// call posts e to path and reads the response with read (nil: an empty
// one). what names the call in errors.
func (c *Client) call(ctx context.Context, what, path string, e *encoder, idempotent bool, read func(*decoder)) error {
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, c.cfg.timeout)
		defer cancel()
	}
	resp, err := c.send(ctx, path, e, idempotent)
	if err != nil {
		return c.failed(ctx, what, err)
	}
	defer drain(resp.Body)
	switch v := resp.Header.Get(headerProtocol); v {
	case protocolVersion:
	case "":
		return c.notServer(resp)
	default:
		return &RefusedError{Addr: c.addr, Reason: fmt.Sprintf("it speaks protocol version %q; this client speaks version %q", v, protocolVersion)}
	}
	if err := c.observe(resp.Header.Get(headerIncarnation)); err != nil {
		return err
	}
	d := newDecoder(resp.Body, resp.ContentLength)
	defer d.release()
	if resp.StatusCode != http.StatusOK {
		we := d.wireError()
		if err := d.end(); err != nil {
			return c.broken(ctx, what, d, fmt.Errorf("an error response (%s): %w", resp.Status, err))
		}
		return c.remote(what, we)
	}
	if read != nil {
		read(d)
	}
	if err := d.end(); err != nil {
		return c.broken(ctx, what, d, err)
	}
	return nil
}

// send posts e to path. A call marked idempotent net/http sends again on
// another connection when the one it was sent on turns out closed. So does
// send, once, with any call that names the server's incarnation and finds
// its kept connection closed or reset before any response: the server
// closed it without reading the call (it was idle, or the server stopped,
// as a restarted task's did). The server that the call then reaches runs
// it only if it is the same incarnation; a new one refuses it, unrun, with
// ErrRestarted.
func (c *Client) send(ctx context.Context, path string, e *encoder, idempotent bool) (*http.Response, error) {
	for retried := false; ; retried = true {
		var reused bool
		trace := &httptrace.ClientTrace{GotConn: func(i httptrace.GotConnInfo) { reused = i.Reused }}
		req, err := http.NewRequestWithContext(httptrace.WithClientTrace(ctx, trace), http.MethodPost, c.base+path, bytes.NewReader(e.buf.Bytes()))
		if err != nil {
			return nil, err
		}
		expects := c.header(ctx, req.Header, idempotent)
		resp, err := c.http.Do(req)
		if err == nil || retried || !reused || !expects || !closedUnanswered(err) || ctx.Err() != nil {
			return resp, err
		}
		c.tr.CloseIdleConnections() // the others were likely closed too
	}
}

// closedUnanswered reports whether err says that the server closed or
// reset the connection before its response.
func closedUnanswered(err error) bool {
	return errors.Is(err, io.EOF) || isReset(err) || strings.Contains(err.Error(), "server closed idle connection")
}

// header sets the headers of a call, and reports whether they name the
// server's incarnation.
func (c *Client) header(ctx context.Context, h http.Header, idempotent bool) bool {
	h.Set(headerProtocol, protocolVersion)
	h.Set(headerJob, c.cfg.job)
	h.Set("Content-Type", contentType)
	if deadline, ok := ctx.Deadline(); ok {
		h.Set(headerTimeout, strconv.FormatInt(timeoutMillis(time.Until(deadline)), 10))
	}
	if idempotent {
		h["Idempotency-Key"] = nil // net/http sends it again on another connection, and sends no such header
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.incarnation == "" {
		return false
	}
	h.Set(headerExpect, c.incarnation)
	return true
}

// observe notes the server's incarnation, and returns an error wrapping
// ErrRestarted when it is not the one seen before.
func (c *Client) observe(incarnation string) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	prev := c.incarnation
	if incarnation == "" || incarnation == prev {
		return nil
	}
	c.incarnation = incarnation
	if prev == "" {
		return nil
	}
	return fmt.Errorf("taskserver: %s: %w (incarnation %s, was %s): what was imported and installed on it is gone, as are a ps task's variables",
		c.addr, ErrRestarted, incarnation, prev)
}

// remote returns the error a server returned.
func (c *Client) remote(what string, we wireError) error {
	if we.kind == kindRefused && we.task == "" {
		return &RefusedError{Addr: c.addr, Reason: we.msg}
	}
	return fmt.Errorf("taskserver: %s on %s: %w", what, c.addr, we.rebuild(c.addr))
}

// failed returns the error of a request that got no response: refused
// by TLS, cancelled by the caller, or ErrUnavailable.
func (c *Client) failed(ctx context.Context, what string, err error) error {
	var ue *url.Error
	if errors.As(err, &ue) {
		err = ue.Err
	}
	var op *net.OpError
	var he *handshakeError
	var rh tls.RecordHeaderError
	switch {
	case errors.As(err, &op) && op.Op == "remote error":
		return &RefusedError{Addr: c.addr, Reason: fmt.Sprintf("TLS: %v (the server refused this task's certificate; its audit log says why)", op.Err)}
	case errors.As(err, &rh):
		return &RefusedError{Addr: c.addr, Reason: fmt.Sprintf("TLS: %v (does the server run without TLS?)", err)}
	case errors.As(err, &he) && !transient(he.err):
		return &RefusedError{Addr: c.addr, Reason: he.Error()}
	case errors.Is(ctx.Err(), context.Canceled):
		return fmt.Errorf("taskserver: %s on %s: %w", what, c.addr, ctx.Err())
	}
	return fmt.Errorf("taskserver: %s on %s: %w: %w", what, c.addr, ErrUnavailable, err)
}

// broken returns the error of a response that could not be read: its
// connection failed, or it is malformed.
func (c *Client) broken(ctx context.Context, what string, d *decoder, err error) error {
	if terr := d.transportErr(); terr != nil {
		return c.failed(ctx, what, terr)
	}
	return fmt.Errorf("taskserver: %s on %s: %w", what, c.addr, err)
}

// notServer returns the error of a response without the protocol's
// header: whatever answered is not a task server, or not of this
// protocol.
func (c *Client) notServer(resp *http.Response) error {
	snippet, _ := io.ReadAll(io.LimitReader(resp.Body, 256))
	return &RefusedError{Addr: c.addr, Reason: fmt.Sprintf("it answered %s without the taskserver protocol: %q", resp.Status, bytes.TrimSpace(snippet))}
}

func drain(body io.ReadCloser) {
	_, _ = io.CopyN(io.Discard, body, 64<<10) // what remains of a response we stopped reading, so that the connection is reused
	_ = body.Close()
}

// handshakeError is a failed TLS handshake.
type handshakeError struct{ err error }

func (e *handshakeError) Error() string { return "TLS handshake: " + e.err.Error() }

func (e *handshakeError) Unwrap() error { return e.err }

// transient reports whether err is a failure of the network, not a
// refusal: a timeout, a connection closed or reset.
func transient(err error) bool {
	var ne net.Error
	return errors.Is(err, io.EOF) || errors.Is(err, context.DeadlineExceeded) || errors.Is(err, context.Canceled) ||
		(errors.As(err, &ne) && ne.Timeout()) || errors.Is(err, net.ErrClosed) || isReset(err)
}

// isReset reports whether err is a connection reset, refused or broken.
func isReset(err error) bool {
	return errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.ECONNREFUSED) || errors.Is(err, syscall.EPIPE)
}

// dialTLS dials addr and runs the TLS handshake, within the timeout,
// checking that the server's certificate names the task expected there
// (the configuration's ServerName, else the client's server name).
func (c *Client) dialTLS(d *net.Dialer) func(ctx context.Context, network, addr string) (net.Conn, error) {
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		ctx, cancel := context.WithTimeout(ctx, c.cfg.timeout)
		defer cancel()
		raw, err := d.DialContext(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		cfg := c.cfg.tls.Clone()
		if cfg.ServerName == "" {
			cfg.ServerName = c.cfg.serverName
		}
		if cfg.ServerName == "" && !cfg.InsecureSkipVerify {
			cfg.ServerName, _, _ = net.SplitHostPort(addr)
		}
		tc := tls.Client(raw, cfg)
		if err := tc.HandshakeContext(ctx); err != nil {
			_ = raw.Close()
			return nil, &handshakeError{err}
		}
		return tc, nil
	}
}

// taskName returns the name of the task of a device ("ps:0" of
// "/job:ps/replica:0/task:0"), or "" if it names none.
func taskName(device string) string {
	d, err := tfrt.ParseDevice(device)
	if err != nil || !cluster.TaskType(d.Job).Valid() {
		return ""
	}
	return cluster.Task{Type: cluster.TaskType(d.Job), Index: max(d.Task, 0)}.String()
}
