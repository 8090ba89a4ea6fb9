// Package browser tests mlockd's live page in a real headless Chromium,
// driven with chromedp. It lives in the e2e module so that the main
// module's go.mod, which every user of the Go client reads, does not
// require chromedp.
package browser

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/chromedp/cdproto/fetch"
	"github.com/chromedp/chromedp"

	"github.com/mlock-dev/mlock/internal/auth"
	"github.com/mlock-dev/mlock/internal/testenv"
	"github.com/mlock-dev/mlock/server"
)

// browserPath finds a headless-capable Chromium. Without one the browser
// test skips, except under CI=true, where it fails.
func browserPath(t *testing.T) string {
	t.Helper()
	return testenv.LookPath(t, "the live page's test drives a headless Chromium (install the chromium package)",
		"chromium", "chromium-browser", "google-chrome", "headless-shell")
}

// artifactDir is where the browser test saves its screenshot:
// $MLOCK_TEST_ARTIFACTS if set, else the test's temporary directory.
func artifactDir(t *testing.T) string {
	if d := os.Getenv("MLOCK_TEST_ARTIFACTS"); d != "" {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
		return d
	}
	return t.TempDir()
}

// pageQueue is one resource as the page shows it.
type pageQueue struct {
	Resource string      `json:"resource"`
	Length   string      `json:"length"`
	Rows     []pageEntry `json:"rows"`
}

type pageEntry struct {
	State string `json:"state"`
	Owner string `json:"owner"`
	Lock  string `json:"lock"`
}

// readPage is run in the page: the queues it shows, from its DOM.
const readPage = `[...document.querySelectorAll("#queues-list .queue")].map(q => ({
  resource: q.querySelector(".q-name").textContent,
  length: q.dataset.length,
  rows: [...q.querySelectorAll("tr[data-state]")].map(r => ({
    state: r.dataset.state, owner: r.children[1].textContent, lock: r.children[2].textContent}))
}))`

// The live page in a real headless Chromium shows the holders, waiters
// and counts of the server, picks up a grant made after it loaded without
// a reload, shows names as text, and never shows a whole lock id or
// socketId. It saves a screenshot.
func TestPageInBrowser(t *testing.T) {
	chrome := browserPath(t)
	srv := start(t, server.Config{})
	base := startHTTP(t, srv)

	type holder struct {
		sid, res, owner string
		wait            bool
	}
	script := []holder{
		{"sid-alice-0000000000000000", "orders:1001", "alice", false},
		{"sid-bob-00000000000000000", "orders:1001", "bob", true},
		{"sid-carol-000000000000000", "orders:1001", "carol", true},
		{"sid-dave-00000000000000000", "stock:sku-42", "dave", false},
		{"sid-erin-00000000000000000", "stock:sku-42", "erin", true},
		{"sid-frank-000000000000000", "payments:batch", "frank", false},
		{"sid-mallory-0000000000000", "<i>x</i>", "<b>mallory</b>", false},
	}
	secrets := []string{}
	conns := map[string]*raw{}
	ids := map[string]string{}
	for i, h := range script {
		c := connected(t, srv, h.sid)
		conns[h.owner] = c
		id := c.lock("r", h.res+" 600000 0 0 "+h.owner)
		if !h.wait {
			c.locked(id)
		}
		ids[h.owner] = id
		secrets = append(secrets, h.sid, id)
		_ = i
	}

	opts := append(slices.Clone(chromedp.DefaultExecAllocatorOptions[:]),
		chromedp.ExecPath(chrome), chromedp.NoSandbox, chromedp.WindowSize(1280, 900),
		chromedp.Flag("disable-dev-shm-usage", true))
	actx, cancelA := chromedp.NewExecAllocator(context.Background(), opts...)
	defer cancelA()
	ctx, cancel := chromedp.NewContext(actx)
	defer cancel()
	ctx, cancelT := context.WithTimeout(ctx, 60*time.Second)
	defer cancelT()

	if err := chromedp.Do(ctx,
		chromedp.Navigate(base+"/"),
		chromedp.WaitVisible(chromedp.CSS(`.queue[data-resource="orders:1001"]`)),
	); err != nil {
		t.Fatalf("loading the page: %v", err)
	}
	held, waiting, online := text(t, ctx, "held"), text(t, ctx, "waiting"), text(t, ctx, "online")
	if held != "4" || waiting != "3" || online != "7" {
		t.Errorf("counts shown: held %s waiting %s online %s; want 4, 3, 7", held, waiting, online)
	}
	shown := readQueues(t, ctx)
	want := []pageQueue{
		{"orders:1001", "3", []pageEntry{{"held", "alice", ids["alice"][8:16]}, {"waiting", "bob", ids["bob"][8:16]}, {"waiting", "carol", ids["carol"][8:16]}}},
		{"stock:sku-42", "2", []pageEntry{{"held", "dave", ids["dave"][8:16]}, {"waiting", "erin", ids["erin"][8:16]}}},
	}
	if len(shown) != 4 {
		t.Fatalf("the page shows %d queues, want 4: %+v", len(shown), shown)
	}
	for i, w := range want {
		if got, _ := json.Marshal(shown[i]); string(got) != mustJSON(t, w) {
			t.Errorf("queue %d shown as %s, want %s", i, got, mustJSON(t, w))
		}
	}
	// A name is text, never markup.
	markup, err := chromedp.Run(ctx, chromedp.Evaluate[bool](`document.querySelector("#queues-list i, #queues-list b") !== null`))
	if err != nil {
		t.Fatal(err)
	}
	if markup || !slices.ContainsFunc(shown, func(q pageQueue) bool { return q.Resource == "<i>x</i>" && q.Rows[0].Owner == "<b>mallory</b>" }) {
		t.Errorf("names rendered as markup (%v) or missing: %+v", markup, shown)
	}

	// Changes after the page loaded show up without a reload: alice
	// unlocks, bob is granted; a new resource is locked.
	a := conns["alice"]
	a.send("unlock u " + ids["alice"])
	a.expect("result u success done")
	conns["bob"].locked(ids["bob"])
	late := connected(t, srv, "sid-late-00000000000000000")
	lateID := late.lock("l", "late:1 600000 0 0 grace")
	late.locked(lateID)
	secrets = append(secrets, "sid-late-00000000000000000", lateID)
	if err := chromedp.Do(ctx,
		chromedp.WaitVisible(chromedp.CSS(`.queue[data-resource="late:1"]`)),
		chromedp.WaitVisible(chromedp.CSS(`.queue[data-resource="orders:1001"][data-length="2"]`)),
	); err != nil {
		t.Fatalf("waiting for the page to update: %v", err)
	}
	shown = readQueues(t, ctx)
	if got := mustJSON(t, shown[0]); got != mustJSON(t, pageQueue{"orders:1001", "2",
		[]pageEntry{{"held", "bob", ids["bob"][8:16]}, {"waiting", "carol", ids["carol"][8:16]}}}) {
		t.Errorf("after the hand-off the page shows %s", got)
	}
	held, waiting = text(t, ctx, "held"), text(t, ctx, "waiting")
	if held != "5" || waiting != "2" {
		t.Errorf("counts after the changes: held %s waiting %s; want 5, 2", held, waiting)
	}

	// The filter by prefix.
	if err := chromedp.Do(ctx,
		chromedp.SendKeys(chromedp.ID("prefix"), "stock:"),
		chromedp.WaitNotPresent(chromedp.CSS(`.queue[data-resource="orders:1001"]`)),
	); err != nil {
		t.Fatalf("filtering: %v", err)
	}
	if shown = readQueues(t, ctx); len(shown) != 1 || shown[0].Resource != "stock:sku-42" {
		t.Errorf("filtered by stock: the page shows %+v", shown)
	}
	if err := chromedp.Do(ctx,
		chromedp.Func(func(ctx context.Context, tg *chromedp.Target) error {
			_, err := chromedp.Evaluate[bool](`(() => { const e = document.getElementById("prefix"); e.value = "";
				return e.dispatchEvent(new Event("input")) })()`)(ctx, tg)
			return err
		}),
		chromedp.WaitVisible(chromedp.CSS(`.queue[data-resource="orders:1001"]`)),
		chromedp.Sleep(1100*time.Millisecond), // a sample more for the rates
	); err != nil {
		t.Fatal(err)
	}

	html, err := chromedp.Run(ctx, chromedp.OuterHTML(chromedp.CSS("html")))
	if err != nil {
		t.Fatal(err)
	}
	png, err := chromedp.Run(ctx, chromedp.FullScreenshot(100))
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range secrets {
		if strings.Contains(html, s) {
			t.Errorf("the page shows the secret %q", s)
		}
	}
	path := filepath.Join(artifactDir(t), "mlockd-page.png")
	if err := os.WriteFile(path, png, 0o644); err != nil {
		t.Fatal(err)
	}
	t.Logf("screenshot: %s", path)
}

func readQueues(t *testing.T, ctx context.Context) []pageQueue {
	t.Helper()
	qs, err := chromedp.Run(ctx, chromedp.Evaluate[[]pageQueue](readPage))
	if err != nil {
		t.Fatal(err)
	}
	return qs
}

// text is the text of the element with id.
func text(t *testing.T, ctx context.Context, id string) string {
	t.Helper()
	s, err := chromedp.Run(ctx, chromedp.Text(chromedp.ID(id)))
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func mustJSON(t *testing.T, v any) string {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// On a server with an auth file the live page is behind an administrator's
// credentials: Chromium is challenged (Basic) and, given the name and token
// of an admin principal as a user would type them into its prompt, shows
// the page, whose requests to the API then go through with them. Refused
// (the user cancels the prompt), it shows the 401 and no lock.
func TestPageInBrowserWithToken(t *testing.T) {
	chrome := browserPath(t)
	tk := struct{ a, admin string }{auth.NewToken(), auth.NewToken()}
	srv := start(t, server.Config{AuthFile: writeAuthFile(t,
		authLine(t, "A", tk.a, "prefix=orders:"),
		authLine(t, "ops", tk.admin, "admin"),
	)})
	base := startHTTP(t, srv)
	a := connectAs(t, srv, "sid-a-000000000000000000", "A", tk.a)
	held := a.lock("1", "orders:1001 600000 0 0 alice")
	a.locked(held)
	waiting := connectAs(t, srv, "sid-w-000000000000000000", "A", tk.a)
	waiting.lock("2", "orders:1001 600000 0 0 bob")

	opts := append(slices.Clone(chromedp.DefaultExecAllocatorOptions[:]),
		chromedp.ExecPath(chrome), chromedp.NoSandbox, chromedp.WindowSize(1280, 900),
		chromedp.Flag("disable-dev-shm-usage", true))
	actx, cancelA := chromedp.NewExecAllocator(context.Background(), opts...)
	defer cancelA()

	// browse opens a tab that answers every auth challenge with name and
	// token (cancel: it cancels them), and returns it and how many
	// challenges it answered.
	browse := func(name, token string, cancel bool) (context.Context, *atomic.Int32) {
		ctx, stop := chromedp.NewContext(actx)
		t.Cleanup(stop)
		ctx, stopT := context.WithTimeout(ctx, 60*time.Second)
		t.Cleanup(stopT)
		var challenges atomic.Int32
		events := make(chan any, 256)
		if err := chromedp.Listen(ctx, func(ev any) {
			switch ev.(type) {
			case *fetch.EventAuthRequired, *fetch.EventRequestPaused:
				select {
				case events <- ev:
				default:
				}
			}
		}); err != nil {
			t.Fatal(err)
		}
		go func() {
			for {
				select {
				case <-ctx.Done():
					return
				case ev := <-events:
					switch e := ev.(type) {
					case *fetch.EventRequestPaused:
						_, _ = chromedp.Call(ctx, fetch.ContinueRequest, fetch.ContinueRequestParams{RequestID: e.RequestID})
					case *fetch.EventAuthRequired:
						challenges.Add(1)
						resp := &fetch.AuthChallengeResponse{Response: fetch.AuthChallengeResponseResponseProvideCredentials,
							Username: name, Password: token}
						if cancel {
							resp = &fetch.AuthChallengeResponse{Response: fetch.AuthChallengeResponseResponseCancelAuth}
						}
						_, _ = chromedp.Call(ctx, fetch.ContinueWithAuth, fetch.ContinueWithAuthParams{RequestID: e.RequestID,
							AuthChallengeResponse: resp})
					}
				}
			}
		}()
		on := true
		if _, err := chromedp.Call(ctx, fetch.Enable, fetch.EnableParams{HandleAuthRequests: &on}); err != nil {
			t.Fatal(err)
		}
		return ctx, &challenges
	}

	ctx, challenges := browse("ops", tk.admin, false)
	if err := chromedp.Do(ctx,
		chromedp.Navigate(base+"/"),
		chromedp.WaitVisible(chromedp.CSS(`.queue[data-resource="orders:1001"][data-length="2"]`)),
	); err != nil {
		t.Fatalf("loading the page with the admin's token: %v", err)
	}
	if n := challenges.Load(); n < 1 {
		t.Errorf("the browser was challenged %d times: the page is not behind credentials", n)
	}
	shown := readQueues(t, ctx)
	if len(shown) != 1 || len(shown[0].Rows) != 2 || shown[0].Rows[0].Owner != "alice" || shown[0].Rows[0].Lock != short(held) {
		t.Errorf("the page shows %+v", shown)
	}
	// It keeps updating through the API with the credentials.
	a.send("unlock 3 " + held)
	a.expect("result 3 success done")
	if err := chromedp.Do(ctx, chromedp.WaitVisible(chromedp.CSS(`.queue[data-resource="orders:1001"][data-length="1"]`))); err != nil {
		t.Fatalf("the page did not update: %v", err)
	}
	if ready := text(t, ctx, "ready"); ready == "unreachable" {
		t.Errorf("the page's API requests failed: %q", ready)
	}

	refused, _ := browse("", "", true)
	if err := chromedp.Do(refused, chromedp.Navigate(base+"/"), chromedp.WaitReady(chromedp.CSS("body"))); err != nil {
		t.Fatal(err)
	}
	body, err := chromedp.Run(refused, chromedp.Text(chromedp.CSS("body")))
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(body, "401 unauthorized") || strings.Contains(body, "orders:1001") {
		t.Errorf("without credentials the browser shows %q", body)
	}
}
