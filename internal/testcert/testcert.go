// Package testcert makes certificates for tests: a certificate authority
// generated in memory, and server and client certificates signed by it,
// written as PEM files to the test's temporary directory. Keys are ECDSA
// P-256 (fast to make). Certificates are valid from an hour ago for a day.
//
// It is for tests only; every failure ends the test (t.Fatal).
package testcert

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// A CA is a test certificate authority. Its methods are safe for
// concurrent use.
type CA struct {
	cert     *x509.Certificate
	key      *ecdsa.PrivateKey
	certFile string
	pool     *x509.CertPool
}

// New returns a new CA whose certificate is written to a file in
// t.TempDir().
func New(t testing.TB) *CA {
	t.Helper()
	key := newKey(t)
	now := time.Now()
	tmpl := &x509.Certificate{
		SerialNumber:          serial(t),
		Subject:               pkix.Name{CommonName: "mlock test CA"},
		NotBefore:             now.Add(-time.Hour),
		NotAfter:              now.Add(24 * time.Hour),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
		BasicConstraintsValid: true,
		IsCA:                  true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatalf("testcert: CA certificate: %v", err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatalf("testcert: CA certificate: %v", err)
	}
	ca := &CA{cert: cert, key: key, pool: x509.NewCertPool()}
	ca.pool.AddCert(cert)
	ca.certFile = filepath.Join(t.TempDir(), "ca.pem")
	writePEM(t, ca.certFile, "CERTIFICATE", der)
	return ca
}

// CertFile returns the path of the CA's certificate (PEM).
func (ca *CA) CertFile() string { return ca.certFile }

// Pool returns a pool that holds the CA's certificate (for RootCAs or
// ClientCAs). Each call returns a new pool.
func (ca *CA) Pool() *x509.CertPool { return ca.pool.Clone() }

// Server returns the paths of a new server certificate and its key, for the
// hosts (IP addresses or DNS names; by default 127.0.0.1, ::1 and
// localhost). The first host is also the CommonName.
func (ca *CA) Server(t testing.TB, hosts ...string) (certFile, keyFile string) {
	t.Helper()
	if len(hosts) == 0 {
		hosts = []string{"127.0.0.1", "::1", "localhost"}
	}
	tmpl := ca.template(t, hosts[0])
	tmpl.ExtKeyUsage = []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}
	for _, h := range hosts {
		if ip := net.ParseIP(h); ip != nil {
			tmpl.IPAddresses = append(tmpl.IPAddresses, ip)
		} else {
			tmpl.DNSNames = append(tmpl.DNSNames, h)
		}
	}
	return ca.issue(t, tmpl, "server")
}

// Client returns the paths of a new client certificate and its key, whose
// CommonName is name.
func (ca *CA) Client(t testing.TB, name string) (certFile, keyFile string) {
	t.Helper()
	tmpl := ca.template(t, name)
	tmpl.ExtKeyUsage = []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}
	return ca.issue(t, tmpl, "client")
}

func (ca *CA) template(t testing.TB, cn string) *x509.Certificate {
	now := time.Now()
	return &x509.Certificate{
		SerialNumber: serial(t),
		Subject:      pkix.Name{CommonName: cn},
		NotBefore:    now.Add(-time.Hour),
		NotAfter:     now.Add(24 * time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature,
	}
}

func (ca *CA) issue(t testing.TB, tmpl *x509.Certificate, base string) (certFile, keyFile string) {
	t.Helper()
	key := newKey(t)
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, &key.PublicKey, ca.key)
	if err != nil {
		t.Fatalf("testcert: %s certificate: %v", base, err)
	}
	keyDER, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		t.Fatalf("testcert: %s key: %v", base, err)
	}
	dir := t.TempDir()
	certFile = filepath.Join(dir, base+".pem")
	keyFile = filepath.Join(dir, base+"-key.pem")
	writePEM(t, certFile, "CERTIFICATE", der)
	writePEM(t, keyFile, "PRIVATE KEY", keyDER)
	return certFile, keyFile
}

func newKey(t testing.TB) *ecdsa.PrivateKey {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatalf("testcert: key: %v", err)
	}
	return key
}

func serial(t testing.TB) *big.Int {
	n, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
	if err != nil {
		t.Fatalf("testcert: serial: %v", err)
	}
	return n
}

func writePEM(t testing.TB, path, typ string, der []byte) {
	t.Helper()
	if err := os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}), 0o600); err != nil {
		t.Fatalf("testcert: %v", err)
	}
}
