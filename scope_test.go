package mlock_test

import (
	"bufio"
	"errors"
	"net"
	"testing"

	"github.com/mlock-dev/mlock"
	"github.com/mlock-dev/mlock/internal/protocol"
	"github.com/mlock-dev/mlock/server"
)

// ReleaseIn and ReleaseAllIn: the scope is the Client's prefix then scope;
// the owner's locks outside it are not touched, and a handle of one is not
// lost.
func TestReleaseInScope(t *testing.T) {
	t.Parallel()
	addr, _ := startServer(t, server.Config{}, "")
	ctx := ctxT(t)
	shop := client(t, addr, mlock.Options{Prefix: "shopA:"})
	plain := client(t, addr, mlock.Options{})
	in, err := shop.Lock(ctx, "cart", &mlock.LockOptions{Owner: "u1"})
	if err != nil {
		t.Fatal(err)
	}
	out, err := plain.Lock(ctx, "report:nightly", &mlock.LockOptions{Owner: "u1"})
	if err != nil {
		t.Fatal(err)
	}
	if ok, err := shop.ReleaseIn(ctx, "u1", "cart", "x:"); ok || err != nil {
		t.Fatalf("ReleaseIn outside its scope (shopA:x:) = %v, %v", ok, err)
	}
	if n, err := shop.ReleaseAllIn(ctx, "u1", ""); n != 1 || err != nil {
		t.Fatalf("ReleaseAllIn = %d, %v; want 1", n, err)
	}
	<-in.Lost()
	if !errors.Is(in.Err(), mlock.ErrReleased) {
		t.Fatalf("the handle in the scope: %v", in.Err())
	}
	select {
	case <-out.Lost():
		t.Fatalf("the lock outside the scope was lost: %v", out.Err())
	default:
	}
	if _, err := shop.ReleaseAllIn(ctx, "u1", "a b"); err == nil {
		t.Fatal("a scope with a space must be refused")
	}
	if n, err := plain.ReleaseAllIn(ctx, "u1", ""); n != 1 || err != nil {
		t.Fatalf("no prefix, empty scope: the whole server: %d, %v", n, err)
	}
}

// A server that does not know scoped releases refuses them as unknown
// commands: the client says so, and nothing was released.
func TestReleaseAllInOnAnOlderServer(t *testing.T) {
	t.Parallel()
	addr := fakeServer(t, func(c net.Conn, r *bufio.Reader) {
		if f, err := readCommand(r); err != nil || f[0] != "connect" {
			return
		}
		c.Write(protocol.Append(nil, "connected", "1.0", "new", "15000"))
		for {
			f, err := readCommand(r)
			if err != nil {
				return
			}
			switch f[0] {
			case "releaseall":
				c.Write(protocol.Append(nil, "result", f[1], "success", "3"))
			default:
				c.Write(protocol.Append(nil, "result", f[1], "failed", "invalid", "message!"))
			}
		}
	})
	c := client(t, addr, mlock.Options{Prefix: "shop:"})
	ctx := ctxT(t)
	_, err := c.ReleaseAllIn(ctx, "u1", "")
	var me *mlock.Error
	if !errors.Is(err, mlock.ErrScopeUnsupported) || !errors.As(err, &me) || me.Type != mlock.TypeRequest {
		t.Fatalf("err = %v", err)
	}
	if _, err := c.ReleaseIn(ctx, "u1", "a", ""); !errors.Is(err, mlock.ErrScopeUnsupported) {
		t.Fatalf("ReleaseIn: err = %v", err)
	}
	if n, err := c.ReleaseAll(ctx, "u1"); n != 3 || err != nil {
		t.Fatalf("ReleaseAll = %d, %v", n, err)
	}
}
