package mtls

import (
	"crypto/tls"
	"errors"
	"fmt"
	"strconv"
)

// The environment variables a launcher or an orchestrator sets for a task.
const (
	// EnvCA names the PEM file of the job's CA certificates.
	EnvCA = "TFDIST_TLS_CA"
	// EnvCert names the PEM file of the task's certificate (and any
	// intermediate certificates after it).
	EnvCert = "TFDIST_TLS_CERT"
	// EnvKey names the PEM file of the task's private key.
	EnvKey = "TFDIST_TLS_KEY"
	// EnvRequire, when true ("1", "true"), makes a program refuse to start
	// unless all its traffic between processes can be TLS.
	EnvRequire = "TFDIST_REQUIRE_TLS"
)

// Files names a task's PEM files.
type Files struct {
	// CA holds the job's CA certificates, which peers' certificates must
	// chain to.
	CA string
	// Cert holds this task's certificate, signed by the CA.
	Cert string
	// Key holds the private key of Cert.
	Key string
}

// Env returns the environment that names f (EnvCA, EnvCert, EnvKey) and,
// when require is true, sets EnvRequire, as "KEY=value" strings.
func (f Files) Env(require bool) []string {
	env := []string{EnvCA + "=" + f.CA, EnvCert + "=" + f.Cert, EnvKey + "=" + f.Key}
	if require {
		env = append(env, EnvRequire+"=1")
	}
	return env
}

// IsZero reports whether no file is named.
func (f Files) IsZero() bool { return f == Files{} }

// FilesFromEnv returns the files the environment names (lookup is
// os.LookupEnv in a program). ok is false when none of EnvCA, EnvCert and
// EnvKey is set; setting only some of them is an error naming the others.
func FilesFromEnv(lookup func(string) (string, bool)) (f Files, ok bool, err error) {
	vars := []struct {
		name string
		dst  *string
	}{{EnvCA, &f.CA}, {EnvCert, &f.Cert}, {EnvKey, &f.Key}}
	var set, unset []string
	for _, v := range vars {
		if s, found := lookup(v.name); found && s != "" {
			*v.dst = s
			set = append(set, v.name)
		} else {
			unset = append(unset, v.name)
		}
	}
	switch {
	case len(set) == 0:
		return Files{}, false, nil
	case len(unset) > 0:
		return Files{}, false, fmt.Errorf("mtls: %v set but %v not: TLS needs the CA, the certificate and the key", set, unset)
	}
	return f, true, nil
}

// RequiredFromEnv reports whether EnvRequire asks for TLS; a value that is
// not a boolean is an error naming it.
func RequiredFromEnv(lookup func(string) (string, bool)) (bool, error) {
	s, ok := lookup(EnvRequire)
	if !ok || s == "" {
		return false, nil
	}
	b, err := strconv.ParseBool(s)
	if err != nil {
		return false, fmt.Errorf("mtls: %s=%q: expected a boolean (1, true, 0, false)", EnvRequire, s)
	}
	return b, nil
}

// ErrUnavailable is wrapped by the error of a program that requires TLS
// on a path that cannot provide it.
var ErrUnavailable = errors.New("TLS is required but not available")

// RefuseUnencrypted returns an error wrapping ErrUnavailable when required
// is true, for path, which runs over TensorFlow's gRPC server: it takes no
// TLS in TensorFlow 2.18.
func RefuseUnencrypted(required bool, path string) error {
	if !required {
		return nil
	}
	return fmt.Errorf("%w: %s runs over TensorFlow's gRPC server, which takes no TLS in TensorFlow 2.18 (unset %s to run it in plaintext)",
		ErrUnavailable, path, EnvRequire)
}

// RefuseUnencryptedFromEnv is RefuseUnencrypted with required read from
// the environment (EnvRequire).
func RefuseUnencryptedFromEnv(lookup func(string) (string, bool), path string) error {
	required, err := RequiredFromEnv(lookup)
	if err != nil {
		return err
	}
	return RefuseUnencrypted(required, path)
}

// Resolve returns the TLS configuration of a task: cfg when it is not nil;
// else that of the certificate files the environment names (EnvCA,
// EnvCert, EnvKey), loaded and checked with opts, with their credentials;
// else nil, for plaintext — an error wrapping ErrUnavailable when the
// environment requires TLS (EnvRequire).
func Resolve(cfg *tls.Config, lookup func(string) (string, bool), opts ...LoadOption) (*tls.Config, *Credentials, error) {
	if cfg != nil {
		return cfg, nil, nil
	}
	files, ok, err := FilesFromEnv(lookup)
	if err != nil {
		return nil, nil, err
	}
	if !ok {
		required, err := RequiredFromEnv(lookup)
		if err == nil && required {
			err = fmt.Errorf("%w: %s is set but no certificate is configured: set %s, %s and %s",
				ErrUnavailable, EnvRequire, EnvCA, EnvCert, EnvKey)
		}
		return nil, nil, err
	}
	creds, err := Load(files, opts...)
	if err != nil {
		return nil, nil, err
	}
	return creds.Config(), creds, nil
}
