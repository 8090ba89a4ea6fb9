package testcert

import (
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"net"
	"os"
	"testing"
)

// loader returns a function that loads a pair and returns its leaf.
func loader(t *testing.T) func(certFile, keyFile string) *x509.Certificate {
	return func(certFile, keyFile string) *x509.Certificate { return load(t, certFile, keyFile) }
}

func load(t *testing.T, certFile, keyFile string) *x509.Certificate {
	t.Helper()
	pair, err := tls.LoadX509KeyPair(certFile, keyFile)
	if err != nil {
		t.Fatalf("LoadX509KeyPair: %v", err)
	}
	leaf, err := x509.ParseCertificate(pair.Certificate[0])
	if err != nil {
		t.Fatal(err)
	}
	return leaf
}

func TestServerCertificateVerifiesForDefaultHosts(t *testing.T) {
	ca := New(t)
	leaf := loader(t)(ca.Server(t))
	for _, host := range []string{"127.0.0.1", "::1", "localhost"} {
		_, err := leaf.Verify(x509.VerifyOptions{Roots: ca.Pool(), DNSName: host})
		if err != nil {
			t.Errorf("verify for %s: %v", host, err)
		}
	}
	if _, err := leaf.Verify(x509.VerifyOptions{Roots: ca.Pool(), DNSName: "example.com"}); err == nil {
		t.Error("verified for a host it was not made for")
	}
	if _, err := leaf.Verify(x509.VerifyOptions{Roots: New(t).Pool(), DNSName: "localhost"}); err == nil {
		t.Error("verified against another CA")
	}
}

func TestServerCertificateForGivenHosts(t *testing.T) {
	ca := New(t)
	leaf := loader(t)(ca.Server(t, "mlock.test", "10.1.2.3"))
	if leaf.Subject.CommonName != "mlock.test" {
		t.Errorf("CommonName = %q", leaf.Subject.CommonName)
	}
	if len(leaf.DNSNames) != 1 || leaf.DNSNames[0] != "mlock.test" || len(leaf.IPAddresses) != 1 || !leaf.IPAddresses[0].Equal(net.ParseIP("10.1.2.3")) {
		t.Errorf("names: %v %v", leaf.DNSNames, leaf.IPAddresses)
	}
}

func TestClientCertificate(t *testing.T) {
	ca := New(t)
	leaf := loader(t)(ca.Client(t, "worker-1"))
	if leaf.Subject.CommonName != "worker-1" {
		t.Errorf("CommonName = %q", leaf.Subject.CommonName)
	}
	opts := x509.VerifyOptions{Roots: ca.Pool(), KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}
	if _, err := leaf.Verify(opts); err != nil {
		t.Errorf("verify as a client: %v", err)
	}
	if leaf.PublicKeyAlgorithm != x509.ECDSA {
		t.Errorf("key algorithm %v, want ECDSA", leaf.PublicKeyAlgorithm)
	}
}

func TestCertFileHoldsTheCA(t *testing.T) {
	ca := New(t)
	b, err := os.ReadFile(ca.CertFile())
	if err != nil {
		t.Fatal(err)
	}
	block, _ := pem.Decode(b)
	if block == nil || block.Type != "CERTIFICATE" {
		t.Fatalf("not a PEM certificate: %q", b)
	}
	cert, err := x509.ParseCertificate(block.Bytes)
	if err != nil {
		t.Fatal(err)
	}
	if !cert.IsCA || !cert.Equal(ca.cert) {
		t.Error("the file does not hold the CA certificate")
	}
}

func TestHandshake(t *testing.T) {
	ca := New(t)
	srv, err := tls.LoadX509KeyPair(ca.Server(t))
	if err != nil {
		t.Fatal(err)
	}
	cli, err := tls.LoadX509KeyPair(ca.Client(t, "alice"))
	if err != nil {
		t.Fatal(err)
	}
	a, b := net.Pipe()
	s := tls.Server(a, &tls.Config{Certificates: []tls.Certificate{srv}, ClientCAs: ca.Pool(), ClientAuth: tls.RequireAndVerifyClientCert})
	c := tls.Client(b, &tls.Config{RootCAs: ca.Pool(), ServerName: "localhost", Certificates: []tls.Certificate{cli}})
	errc := make(chan error, 1)
	go func() { errc <- s.Handshake() }()
	if err := c.Handshake(); err != nil {
		t.Fatalf("client handshake: %v", err)
	}
	if err := <-errc; err != nil {
		t.Fatalf("server handshake: %v", err)
	}
	if got := s.ConnectionState().VerifiedChains[0][0].Subject.CommonName; got != "alice" {
		t.Errorf("client name %q", got)
	}
	a.Close() // the raw pipe: a TLS close would wait for its peer to read
	b.Close()
}
