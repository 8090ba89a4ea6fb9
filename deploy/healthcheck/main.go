// Command healthcheck is the container's health probe: it fetches a URL
// and exits 0 if the answer is 200 OK within 2 seconds, else 1 with one
// line on stderr. The URL is its argument, else mlockd's liveness
// endpoint at $MLOCK_HTTP (the address mlockd's --http serves; a wildcard
// host such as 0.0.0.0 is probed on loopback; https when $MLOCK_TLS_CERT is
// set, as mlockd's HTTP listener then speaks TLS), else
// http://127.0.0.1:12341/healthz. The image has no shell or curl: this
// static binary is its HEALTHCHECK.
package main

import (
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"time"
)

func main() {
	url, err := probeURL(os.Args[1:], os.LookupEnv)
	if err == nil {
		err = check(url)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "healthcheck:", err)
		os.Exit(1)
	}
}

// probeURL is the URL to probe: the argument, else /healthz at
// $MLOCK_HTTP, else at 127.0.0.1:12341.
func probeURL(args []string, lookup func(string) (string, bool)) (string, error) {
	if len(args) > 0 {
		return args[0], nil
	}
	addr, ok := lookup("MLOCK_HTTP")
	if !ok {
		addr = "127.0.0.1:12341"
	}
	if addr == "" {
		return "", errors.New("MLOCK_HTTP is empty: mlockd serves no /healthz")
	}
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return "", fmt.Errorf("MLOCK_HTTP=%q: %v", addr, err)
	}
	switch ip := net.ParseIP(host); {
	case host == "":
		host = "127.0.0.1"
	case ip != nil && ip.IsUnspecified() && ip.To4() != nil:
		host = "127.0.0.1"
	case ip != nil && ip.IsUnspecified():
		host = "::1"
	}
	scheme := "http://"
	if cert, ok := lookup("MLOCK_TLS_CERT"); ok && cert != "" {
		scheme = "https://" // mlockd's HTTP listener speaks TLS with the lock port's certificate
	}
	return scheme + net.JoinHostPort(host, port) + "/healthz", nil
}

// check fetches url. Over https it does not verify the certificate: the
// probe sends nothing secret and believes only the status of mlockd's
// /healthz, on the address mlockd serves, whose certificate may name only
// the service's public names.
func check(url string) error {
	c := &http.Client{Timeout: 2 * time.Second, Transport: &http.Transport{
		TLSClientConfig: &tls.Config{InsecureSkipVerify: true}, // see above
	}}
	res, err := c.Get(url)
	if err != nil {
		return err
	}
	defer res.Body.Close()
	if res.StatusCode != http.StatusOK {
		return fmt.Errorf("%s: %s", url, res.Status)
	}
	return nil
}
