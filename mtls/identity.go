package mtls

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net/url"
	"regexp"
	"strconv"
	"strings"

	"github.com/tfdist/tfdist/cluster"
)

// Scheme is the URI scheme of a task identity in a certificate.
const Scheme = "tfdist"

// Identity is what a certificate proves: a task of a job.
type Identity struct {
	// Job names the training job, as the CA issued its certificates.
	Job string
	// Task is the task in the job's cluster.
	Task cluster.Task
}

// jobName is a DNS-label-like name: lower-case letters, digits, '-' and '.'.
var jobName = regexp.MustCompile(`^[a-z0-9]([a-z0-9.-]{0,61}[a-z0-9])?$`)

// CheckJob returns an error unless job can name a job in a certificate.
func CheckJob(job string) error {
	if !jobName.MatchString(job) {
		return fmt.Errorf("job name %q: expected 1 to 63 lower-case letters, digits, '-' or '.', starting and ending with a letter or digit", job)
	}
	return nil
}

// URI returns the identity as it appears in a certificate.
func (id Identity) URI() *url.URL {
	return &url.URL{Scheme: Scheme, Host: id.Job, Path: "/" + string(id.Task.Type) + "/" + strconv.Itoa(id.Task.Index)}
}

// String returns the identity's URI.
func (id Identity) String() string { return id.URI().String() }

// ParseIdentity parses a URI of the form tfdist://<job>/<type>/<index>.
func ParseIdentity(u *url.URL) (Identity, error) {
	bad := func(why string) (Identity, error) {
		return Identity{}, fmt.Errorf("identity %q: %s: expected %s://<job>/<task type>/<task index>", u, why, Scheme)
	}
	if u.Scheme != Scheme {
		return bad("scheme is not " + Scheme)
	}
	if err := CheckJob(u.Host); err != nil {
		return bad(err.Error())
	}
	parts := strings.Split(strings.TrimPrefix(u.Path, "/"), "/")
	if len(parts) != 2 {
		return bad("path has no task type and index")
	}
	name := parts[0] + ":" + parts[1]
	if name == RendezvousTask.String() {
		return Identity{Job: u.Host, Task: RendezvousTask}, nil
	}
	task, err := cluster.ParseTask(name)
	if err != nil {
		return bad(err.Error())
	}
	return Identity{Job: u.Host, Task: task}, nil
}

// RendezvousTask is the identity an elastic job's rendezvous (package
// elastic) presents: not a task of the cluster, but named as one, so that
// a worker can tell it from a peer.
var RendezvousTask = cluster.Task{Type: "rendezvous", Index: 0}

// ConfigIdentity returns the identity of the certificate cfg presents
// (its Certificates or GetClientCertificate).
func ConfigIdentity(cfg *tls.Config) (Identity, error) {
	var cert *tls.Certificate
	switch {
	case cfg.GetClientCertificate != nil:
		c, err := cfg.GetClientCertificate(&tls.CertificateRequestInfo{Version: tls.VersionTLS13})
		if err != nil {
			return Identity{}, fmt.Errorf("the configuration's certificate: %w", err)
		}
		cert = c
	case len(cfg.Certificates) > 0:
		cert = &cfg.Certificates[0]
	}
	if cert == nil || len(cert.Certificate) == 0 {
		return Identity{}, errors.New("the configuration presents no certificate, and peers require one")
	}
	leaf := cert.Leaf
	if leaf == nil {
		var err error
		if leaf, err = x509.ParseCertificate(cert.Certificate[0]); err != nil {
			return Identity{}, fmt.Errorf("the configuration's certificate: %w", err)
		}
	}
	return IdentityOf(leaf)
}

// IdentityOf returns the task identity a certificate names: its one URI
// SAN of scheme tfdist.
func IdentityOf(cert *x509.Certificate) (Identity, error) {
	var ids []*url.URL
	for _, u := range cert.URIs {
		if u.Scheme == Scheme {
			ids = append(ids, u)
		}
	}
	switch len(ids) {
	case 0:
		return Identity{}, fmt.Errorf("certificate %q names no task: expected a URI SAN %s://<job>/<task type>/<task index>",
			cert.Subject.String(), Scheme)
	case 1:
		return ParseIdentity(ids[0])
	}
	return Identity{}, fmt.Errorf("certificate %q names %d tasks, expected one", cert.Subject.String(), len(ids))
}
