package protocol

import "testing"

func TestBuilders(t *testing.T) {
	id := ID{0xab, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 0xff}
	hex := id.String()
	tests := []struct {
		name string
		got  []byte
		want string
	}{
		{"connected new", AppendConnected(nil, false, 15000), "connected 1.0 new 15000"},
		{"connected without grace", AppendConnected(nil, false, -1), "connected 1.0 new"},
		{"connected resumed", AppendConnected(nil, true, 0), "connected 1.0 resumed 0"},
		{"connected with a leader", AppendConnectedLeader(nil, false, 15000, "h3:12340"), "connected 1.0 new 15000 leader=h3:12340"},
		{"connected leader without grace", AppendConnectedLeader(nil, false, -1, "h3:12340"), "connected 1.0 new"},
		{"error", AppendError(nil, CodeTakenOver), "error session taken over by a new connection!"},
		{"ok", AppendOK(nil, []byte("r1"), []byte("pong")), "result r1 success pong"},
		{"ok id", AppendOKID(nil, []byte("r1"), id), "result r1 success " + hex},
		{"failed", AppendFailed(nil, []byte("r2"), CodeLockNotExist, ""), "result r2 failed lock not exist!"},
		{"failed busy", AppendFailed(nil, []byte("r2"), CodeBusy, "order:1"), "result r2 failed resource is locked! order:1"},
		{"failed conflict", AppendFailed(nil, []byte("r2"), CodeOwnerConflict, "a"), "result r2 failed owner holds an overlapping lock! a"},
		{"tolerate keeps 1.0 text", AppendFailed(nil, []byte("r3"), CodeCannotTolerate, "a"), "result r3 failed can not tolerate!"},
		{"failed unknown", AppendFailed(nil, []byte("r4"), CodeUnknown, "locktable: unknown session"), "result r4 failed locktable: unknown session"},
		{"locked", AppendLocked(nil, id, 1700000000123, 42), "locked " + hex + " 1700000000123 42"},
		{"timeout", AppendPush(nil, PushTimeout, id), "timeout " + hex},
		{"expired", AppendPush(nil, PushExpired, id), "expired " + hex},
		{"released", AppendPush(nil, PushReleased, id), "expired " + hex + " released"},
		{"shutdown", AppendPush(nil, PushShutdown, id), "expired " + hex + " shutdown"},
		{"evicted", AppendPush(nil, PushEvicted, id), "expired " + hex + " evicted"},
	}
	for _, tc := range tests {
		p, n, _, err := Next(tc.got, MaxFrameLimit)
		if err != nil || n != len(tc.got) || string(p) != tc.want {
			t.Errorf("%s: %q (%d of %d bytes, %v), want %q", tc.name, p, n, len(tc.got), err, tc.want)
		}
	}
}
