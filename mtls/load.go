package mtls

import (
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"os"
	"slices"
	"time"
)

// material is one reading of a task's files.
type material struct {
	pool *x509.CertPool
	cert tls.Certificate // Leaf set
	id   Identity
}

// loadMaterial reads and checks f: every error names the file and what is
// wrong with it.
func loadMaterial(f Files, now time.Time) (*material, error) {
	if f.CA == "" || f.Cert == "" || f.Key == "" {
		return nil, fmt.Errorf("mtls: files %+v: the CA, the certificate and the key must all be named", f)
	}
	pool, err := loadCA(f.CA)
	if err != nil {
		return nil, err
	}
	certPEM, err := readFile("certificate", f.Cert)
	if err != nil {
		return nil, err
	}
	chain, err := parseCerts(certPEM)
	if err != nil {
		return nil, fmt.Errorf("mtls: certificate file %q: %w", f.Cert, err)
	}
	if len(chain) == 0 {
		return nil, fmt.Errorf("mtls: certificate file %q holds no PEM certificate", f.Cert)
	}
	keyPEM, err := readFile("key", f.Key)
	if err != nil {
		return nil, err
	}
	if err := checkKeyPEM(keyPEM); err != nil {
		return nil, fmt.Errorf("mtls: key file %q: %w", f.Key, err)
	}
	cert, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		return nil, fmt.Errorf("mtls: key file %q does not match certificate file %q: %w", f.Key, f.Cert, err)
	}
	leaf := chain[0]
	cert.Leaf = leaf
	if err := checkOwn(leaf, chain[1:], pool, now); err != nil {
		return nil, fmt.Errorf("mtls: certificate file %q (CA file %q): %w", f.Cert, f.CA, err)
	}
	id, err := IdentityOf(leaf)
	if err != nil {
		return nil, fmt.Errorf("mtls: certificate file %q: %w", f.Cert, err)
	}
	return &material{pool: pool, cert: cert, id: id}, nil
}

func readFile(what, path string) ([]byte, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("mtls: %s file: %w", what, err)
	}
	return b, nil
}

func loadCA(path string) (*x509.CertPool, error) {
	b, err := readFile("CA", path)
	if err != nil {
		return nil, err
	}
	certs, err := parseCerts(b)
	if err != nil {
		return nil, fmt.Errorf("mtls: CA file %q: %w", path, err)
	}
	if len(certs) == 0 {
		return nil, fmt.Errorf("mtls: CA file %q holds no PEM certificates", path)
	}
	pool := x509.NewCertPool()
	for i, c := range certs {
		if !c.IsCA {
			return nil, fmt.Errorf("mtls: CA file %q: certificate %d (%q) is not a CA certificate", path, i+1, c.Subject.String())
		}
		pool.AddCert(c)
	}
	return pool, nil
}

// parseCerts parses every CERTIFICATE block of b, skipping other blocks.
func parseCerts(b []byte) ([]*x509.Certificate, error) {
	var certs []*x509.Certificate
	for n := 1; ; n++ {
		var blk *pem.Block
		blk, b = pem.Decode(b)
		if blk == nil {
			return certs, nil
		}
		if blk.Type != "CERTIFICATE" {
			continue
		}
		c, err := x509.ParseCertificate(blk.Bytes)
		if err != nil {
			return nil, fmt.Errorf("PEM block %d: %w", n, err)
		}
		certs = append(certs, c)
	}
}

// checkKeyPEM reports a key file that holds no parsable private key.
func checkKeyPEM(b []byte) error {
	for {
		var blk *pem.Block
		blk, b = pem.Decode(b)
		if blk == nil {
			return errors.New("holds no PEM private key")
		}
		var err error
		switch blk.Type {
		case "PRIVATE KEY":
			_, err = x509.ParsePKCS8PrivateKey(blk.Bytes)
		case "EC PRIVATE KEY":
			_, err = x509.ParseECPrivateKey(blk.Bytes)
		case "RSA PRIVATE KEY":
			_, err = x509.ParsePKCS1PrivateKey(blk.Bytes)
		default:
			continue
		}
		if err != nil {
			return fmt.Errorf("%s block: %w", blk.Type, err)
		}
		return nil
	}
}

// checkOwn checks a task's own certificate as its peers will.
func checkOwn(leaf *x509.Certificate, inter []*x509.Certificate, pool *x509.CertPool, now time.Time) error {
	if err := checkValidity(leaf, now); err != nil {
		return err
	}
	for _, u := range []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth} {
		if err := verifyChain(leaf, inter, pool, u, now); err != nil {
			return err
		}
	}
	return nil
}

func checkValidity(c *x509.Certificate, now time.Time) error {
	switch {
	case now.After(c.NotAfter):
		return fmt.Errorf("certificate %q expired at %s", c.Subject.String(), c.NotAfter.UTC().Format(time.RFC3339))
	case now.Before(c.NotBefore):
		return fmt.Errorf("certificate %q is not valid before %s", c.Subject.String(), c.NotBefore.UTC().Format(time.RFC3339))
	}
	return nil
}

// verifyChain checks that leaf chains to pool and may be used for usage.
func verifyChain(leaf *x509.Certificate, inter []*x509.Certificate, pool *x509.CertPool, usage x509.ExtKeyUsage, now time.Time) error {
	opts := x509.VerifyOptions{Roots: pool, CurrentTime: now, KeyUsages: []x509.ExtKeyUsage{usage}}
	if len(inter) > 0 {
		opts.Intermediates = x509.NewCertPool()
		for _, c := range inter {
			opts.Intermediates.AddCert(c)
		}
	}
	if _, err := leaf.Verify(opts); err != nil {
		if slices.Contains(leaf.ExtKeyUsage, usage) || len(leaf.ExtKeyUsage) == 0 {
			return fmt.Errorf("not signed by the job's CA: %w", err)
		}
		return fmt.Errorf("certificate %q is not for %s: %w", leaf.Subject.String(), usageName(usage), err)
	}
	return nil
}

func usageName(u x509.ExtKeyUsage) string {
	if u == x509.ExtKeyUsageServerAuth {
		return "server authentication"
	}
	return "client authentication"
}
