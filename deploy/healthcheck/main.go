// Command healthcheck is the container's health probe: it fetches a URL
// (default http://127.0.0.1:12341/healthz, mlockd's liveness endpoint)
// and exits 0 if the answer is 200 OK within 2 seconds, else 1 with one
// line on stderr. The image has no shell or curl: this static binary is
// its HEALTHCHECK.
package main

import (
	"fmt"
	"net/http"
	"os"
	"time"
)

func main() {
	url := "http://127.0.0.1:12341/healthz"
	if len(os.Args) > 1 {
		url = os.Args[1]
	}
	if err := check(url); err != nil {
		fmt.Fprintln(os.Stderr, "healthcheck:", err)
		os.Exit(1)
	}
}

func check(url string) error {
	c := &http.Client{Timeout: 2 * time.Second}
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
