package auth

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"os"
	"sync"
	"sync/atomic"
)

// A CertReloader holds the server's certificate and key, read from two PEM
// files, and serves them to new handshakes through GetCertificate; made by
// ServerConfig with a client CA file, it holds the client CAs too and
// serves them through GetConfigForClient. Reload reads the files again (on
// SIGHUP, say): handshakes that start after it returns use the new pair and
// CAs; established connections are not touched. Its methods are safe for
// concurrent use.
type CertReloader struct {
	certFile, keyFile string
	cur               atomic.Pointer[tls.Certificate]
	mu                sync.Mutex // serializes Reload

	clientCAFile string                     // "": no client certificates
	base         *tls.Config                // the configuration the per-handshake ones are cloned from
	conf         atomic.Pointer[tls.Config] // with the current client CAs
}

// NewCertReloader reads the certificate (chain) and key PEM files. The
// error is one of reading or of tls.X509KeyPair (for example a key that
// does not match the certificate).
func NewCertReloader(certFile, keyFile string) (*CertReloader, error) {
	r := &CertReloader{certFile: certFile, keyFile: keyFile}
	if err := r.Reload(); err != nil {
		return nil, err
	}
	return r, nil
}

// Reload reads both files again and, if they make a valid pair, serves the
// new pair to the handshakes that start after it returns; with a client CA
// file (ServerConfig) it reads that too, and a file that holds certificates
// becomes the CAs new handshakes verify client certificates against. Each
// part that fails keeps the old one in place, and the error says why.
func (r *CertReloader) Reload() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	err := r.reloadPair()
	if r.clientCAFile != "" {
		if pool, caErr := readCAs(r.clientCAFile); caErr != nil {
			err = errors.Join(err, caErr)
		} else {
			r.setCAs(pool)
		}
	}
	return err
}

// reloadPair reads the certificate and key. r.mu is held.
func (r *CertReloader) reloadPair() error {
	certPEM, err := os.ReadFile(r.certFile)
	if err != nil {
		return fmt.Errorf("tls certificate: %w", err)
	}
	keyPEM, err := os.ReadFile(r.keyFile)
	if err != nil {
		return fmt.Errorf("tls key: %w", err)
	}
	pair, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		return fmt.Errorf("tls certificate %s and key %s: %w", r.certFile, r.keyFile, err)
	}
	if pair.Leaf == nil { // GODEBUG=x509keypairleaf=0
		if pair.Leaf, err = x509.ParseCertificate(pair.Certificate[0]); err != nil {
			return fmt.Errorf("tls certificate %s: %w", r.certFile, err)
		}
	}
	r.cur.Store(&pair)
	return nil
}

// setCAs serves pool as the client CAs of new handshakes. r.mu is held
// (or r is not shared yet).
func (r *CertReloader) setCAs(pool *x509.CertPool) {
	c := r.base.Clone()
	c.ClientCAs = pool
	r.conf.Store(c)
}

// GetConfigForClient returns the configuration of a new handshake: the
// current client CAs. It is meant for tls.Config.GetConfigForClient; nil
// (the configuration it is set on) without a client CA file.
func (r *CertReloader) GetConfigForClient(*tls.ClientHelloInfo) (*tls.Config, error) {
	return r.conf.Load(), nil
}

// readCAs reads a PEM file of CA certificates.
func readCAs(path string) (*x509.CertPool, error) {
	pem, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("tls client CA: %w", err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(pem) {
		return nil, fmt.Errorf("tls client CA %s: %w", path, errNoCert)
	}
	return pool, nil
}

// GetCertificate returns the current pair; it is meant for
// tls.Config.GetCertificate and never fails.
func (r *CertReloader) GetCertificate(*tls.ClientHelloInfo) (*tls.Certificate, error) {
	return r.cur.Load(), nil
}

// Leaf returns the current leaf certificate (for logging its subject and
// expiry).
func (r *CertReloader) Leaf() *x509.Certificate { return r.cur.Load().Leaf }

// ServerConfig returns the TLS configuration of a server: TLS 1.2 at least,
// Go's default cipher suites and curves, and the certificate of certFile
// and keyFile served through the returned CertReloader (call its Reload to
// change it without a restart).
//
// With clientCAFile (PEM, one certificate or more), a client may present a
// certificate, and one that it presents must verify against those CAs
// (tls.VerifyClientCertIfGiven): clients without a certificate still
// connect and authenticate otherwise (token, address). VerifiedName gives
// the name of a verified certificate. The returned CertReloader's Reload
// reads the client CA file again, as it does the certificate and key.
//
// Errors: those of NewCertReloader, of reading clientCAFile, or a client CA
// file that holds no certificate.
func ServerConfig(certFile, keyFile, clientCAFile string) (*tls.Config, *CertReloader, error) {
	r, err := NewCertReloader(certFile, keyFile)
	if err != nil {
		return nil, nil, err
	}
	cfg := &tls.Config{
		MinVersion:     tls.VersionTLS12,
		GetCertificate: r.GetCertificate,
	}
	if clientCAFile != "" {
		pool, err := readCAs(clientCAFile)
		if err != nil {
			return nil, nil, err
		}
		cfg.ClientCAs = pool
		cfg.ClientAuth = tls.VerifyClientCertIfGiven
		r.clientCAFile, r.base = clientCAFile, cfg.Clone()
		r.setCAs(pool)
		cfg.GetConfigForClient = r.GetConfigForClient
	}
	return cfg, r, nil
}

var errNoCert = errors.New("no PEM certificate found")

// CertName returns the principal name a client certificate stands for: its
// subject CommonName, else its first DNS name, else "".
func CertName(cert *x509.Certificate) string {
	if cert == nil {
		return ""
	}
	if cert.Subject.CommonName != "" {
		return cert.Subject.CommonName
	}
	if len(cert.DNSNames) > 0 {
		return cert.DNSNames[0]
	}
	return ""
}

// VerifiedName returns CertName of the client certificate of a completed
// handshake if it verified against the server's client CAs, else "" (no
// certificate, or a configuration that does not verify them).
func VerifiedName(state tls.ConnectionState) string {
	if len(state.VerifiedChains) == 0 || len(state.VerifiedChains[0]) == 0 {
		return ""
	}
	return CertName(state.VerifiedChains[0][0])
}
