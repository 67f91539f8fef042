package mtls

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"net/url"
	"os"
	"path/filepath"
	"time"

	"github.com/tfdist/tfdist/cluster"
)

// DefaultLifetime is how long an Authority's certificates are valid by
// default: long enough for a day's job, short enough that a leaked key
// soon stops working.
const DefaultLifetime = 24 * time.Hour

// clockSkew backdates certificates, so that hosts whose clocks differ a
// little accept them at once.
const clockSkew = 5 * time.Minute

// Authority is a CA that issues task certificates, for local and test
// use: a production job takes its certificates from the organisation's CA,
// in the same format.
type Authority struct {
	cert *x509.Certificate
	key  *ecdsa.PrivateKey
}

// NewAuthority makes a CA called name, valid for lifetime (DefaultLifetime
// if zero), with an ECDSA P-256 key.
func NewAuthority(name string, lifetime time.Duration) (*Authority, error) {
	if lifetime <= 0 {
		lifetime = DefaultLifetime
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("mtls: CA key: %w", err)
	}
	now := time.Now()
	tmpl := &x509.Certificate{
		Subject:               pkix.Name{CommonName: name},
		NotBefore:             now.Add(-clockSkew),
		NotAfter:              now.Add(lifetime),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign,
		BasicConstraintsValid: true,
		IsCA:                  true,
		MaxPathLenZero:        true,
	}
	cert, err := sign(tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return nil, fmt.Errorf("mtls: CA certificate: %w", err)
	}
	return &Authority{cert: cert, key: key}, nil
}

// CertPEM returns the CA certificate, PEM-encoded: the CA file of every task.
func (a *Authority) CertPEM() []byte {
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: a.cert.Raw})
}

// Validity returns when the CA's certificate, and so every certificate it
// issues, becomes valid and stops being valid.
func (a *Authority) Validity() (notBefore, notAfter time.Time) {
	return a.cert.NotBefore, a.cert.NotAfter
}

// KeyPEM returns the CA's private key, PEM-encoded (PKCS #8).
func (a *Authority) KeyPEM() ([]byte, error) { return keyPEM(a.key) }

// Issue makes a certificate and key for the task id, valid from notBefore
// to notAfter (clamped to the CA's own validity), naming the task as the
// package doc describes; for client and server authentication.
func (a *Authority) Issue(id Identity, notBefore, notAfter time.Time) (certPEM, keyPEMBytes []byte, err error) {
	if err := CheckJob(id.Job); err != nil {
		return nil, nil, fmt.Errorf("mtls: %w", err)
	}
	task := id.Task
	if (!task.Type.Valid() || task.Index < 0) && task != RendezvousTask {
		return nil, nil, fmt.Errorf("mtls: task %q: expected a chief, worker, ps or evaluator task, or %s", task, RendezvousTask)
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, fmt.Errorf("mtls: key of %s: %w", task, err)
	}
	tmpl := &x509.Certificate{
		Subject:     pkix.Name{CommonName: task.String(), OrganizationalUnit: []string{id.Job}},
		NotBefore:   notBefore,
		NotAfter:    notAfter,
		KeyUsage:    x509.KeyUsageDigitalSignature,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
		URIs:        []*url.URL{id.URI()},
	}
	if tmpl.NotBefore.Before(a.cert.NotBefore) {
		tmpl.NotBefore = a.cert.NotBefore
	}
	if tmpl.NotAfter.After(a.cert.NotAfter) {
		tmpl.NotAfter = a.cert.NotAfter
	}
	cert, err := sign(tmpl, a.cert, &key.PublicKey, a.key)
	if err != nil {
		return nil, nil, fmt.Errorf("mtls: certificate of %s: %w", task, err)
	}
	kp, err := keyPEM(key)
	if err != nil {
		return nil, nil, err
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: cert.Raw}), kp, nil
}

func sign(tmpl, parent *x509.Certificate, pub *ecdsa.PublicKey, priv *ecdsa.PrivateKey) (*x509.Certificate, error) {
	serial, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
	if err != nil {
		return nil, err
	}
	tmpl.SerialNumber = serial
	der, err := x509.CreateCertificate(rand.Reader, tmpl, parent, pub, priv)
	if err != nil {
		return nil, err
	}
	return x509.ParseCertificate(der)
}

func keyPEM(k *ecdsa.PrivateKey) ([]byte, error) {
	der, err := x509.MarshalPKCS8PrivateKey(k)
	if err != nil {
		return nil, fmt.Errorf("mtls: encoding a key: %w", err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der}), nil
}

// WriteTasks makes a CA for job and a certificate for each of tasks,
// valid for lifetime (DefaultLifetime if zero) from now, and writes them
// under dir as Write does, with the CA's key beside its certificate as
// ca.key. It returns each task's Files.
func WriteTasks(dir, job string, tasks []cluster.Task, lifetime time.Duration) (map[cluster.Task]Files, error) {
	if len(tasks) == 0 {
		return nil, fmt.Errorf("mtls: no tasks to write certificates for")
	}
	if err := CheckJob(job); err != nil {
		return nil, fmt.Errorf("mtls: %w", err)
	}
	a, err := NewAuthority("tfdist CA for job "+job, lifetime)
	if err != nil {
		return nil, err
	}
	ids := make([]Identity, len(tasks))
	for i, t := range tasks {
		ids[i] = Identity{Job: job, Task: t}
	}
	nb, na := a.Validity()
	files, err := a.Write(dir, ids, nb, na)
	if err != nil {
		return nil, err
	}
	caKey, err := a.KeyPEM()
	if err != nil {
		return nil, err
	}
	if err := writeFiles(map[string][]byte{filepath.Join(dir, "ca.key"): caKey}); err != nil {
		return nil, err
	}
	out := make(map[cluster.Task]Files, len(tasks))
	for i, t := range tasks {
		out[t] = files[i]
	}
	return out, nil
}

// WriteTempTasks is WriteTasks into a new private directory named by
// pattern (as os.MkdirTemp names one), for a run that needs certificates
// only while it lasts: remove deletes the directory.
func WriteTempTasks(pattern, job string, tasks []cluster.Task, lifetime time.Duration) (files map[cluster.Task]Files, dir string, remove func(), err error) {
	dir, err = os.MkdirTemp("", pattern)
	if err != nil {
		return nil, "", nil, fmt.Errorf("mtls: %w", err)
	}
	remove = func() { _ = os.RemoveAll(dir) }
	if files, err = WriteTasks(dir, job, tasks, lifetime); err != nil {
		remove()
		return nil, "", nil, err
	}
	return files, dir, remove, nil
}

// Write issues a certificate for each of ids, valid from notBefore to
// notAfter, and writes under dir (created with mode 0700) the CA
// certificate, ca.crt, and each task's <type>-<index>.crt and .key, every
// file with mode 0600. It returns the Files of each of ids.
func (a *Authority) Write(dir string, ids []Identity, notBefore, notAfter time.Time) ([]Files, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("mtls: %w", err)
	}
	ca := filepath.Join(dir, "ca.crt")
	if err := writeFiles(map[string][]byte{ca: a.CertPEM()}); err != nil {
		return nil, err
	}
	out := make([]Files, len(ids))
	for i, id := range ids {
		cert, key, err := a.Issue(id, notBefore, notAfter)
		if err != nil {
			return nil, err
		}
		base := filepath.Join(dir, fmt.Sprintf("%s-%d", id.Task.Type, id.Task.Index))
		out[i] = Files{CA: ca, Cert: base + ".crt", Key: base + ".key"}
		if err := writeFiles(map[string][]byte{out[i].Cert: cert, out[i].Key: key}); err != nil {
			return nil, err
		}
	}
	return out, nil
}

// writeFiles writes each file with mode 0600, replacing it atomically.
func writeFiles(files map[string][]byte) error {
	for path, b := range files {
		tmp, err := os.CreateTemp(filepath.Dir(path), ".tmp-*")
		if err != nil {
			return fmt.Errorf("mtls: %w", err)
		}
		_, werr := tmp.Write(b)
		cerr := tmp.Close()
		if err := errors.Join(werr, cerr, os.Chmod(tmp.Name(), 0o600), os.Rename(tmp.Name(), path)); err != nil {
			_ = os.Remove(tmp.Name())
			return fmt.Errorf("mtls: writing %s: %w", path, err)
		}
	}
	return nil
}
