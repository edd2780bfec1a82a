package app_test

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/musterhq/muster/db/dbtest"
	"github.com/musterhq/muster/internal/app"
	"github.com/musterhq/muster/internal/app/apptest"
	"github.com/musterhq/muster/internal/breakglass"
	"github.com/musterhq/muster/internal/notify"
	"github.com/musterhq/muster/internal/wait"
)

// webhook is a plain JSON webhook target that keeps every alert posted.
type webhook struct {
	mu     sync.Mutex
	alerts []notify.Alert
	srv    *httptest.Server
}

func newWebhook(t *testing.T) *webhook {
	w := &webhook{}
	w.srv = httptest.NewServer(http.HandlerFunc(func(rw http.ResponseWriter, r *http.Request) {
		var body notify.Webhook
		if err := json.NewDecoder(r.Body).Decode(&body); err != nil {
			http.Error(rw, err.Error(), http.StatusBadRequest)
			return
		}
		w.mu.Lock()
		w.alerts = append(w.alerts, body.Alerts...)
		w.mu.Unlock()
	}))
	t.Cleanup(w.srv.Close)
	return w
}

// count is how many alerts with status whose description mentions text
// were posted.
func (w *webhook) count(status, text string) int {
	w.mu.Lock()
	defer w.mu.Unlock()
	n := 0
	for _, a := range w.alerts {
		if a.Status == status && strings.Contains(a.Annotations["description"], text) {
			n++
		}
	}
	return n
}

// TestWebhookHearsEachAlarmOncePerRegion: two replicas on one database
// both hold the same estate-wide alarm (a live break-glass grant), and a
// plain webhook target, which deduplicates nothing, receives it once:
// only the owner of the region alarms' shard sends it. When that replica
// stops, the survivor takes its shards and sends the next alarm, once.
func TestWebhookHearsEachAlarmOncePerRegion(t *testing.T) {
	t.Parallel()
	hook := newWebhook(t)
	url := dbtest.URL(t)
	notifyTo := func() *notify.Config {
		return &notify.Config{Targets: notify.Targets{Platform: &notify.Target{URL: hook.srv.URL, Kind: notify.KindWebhook}},
			// Resend as short as the round: a webhook is never resent to.
			Interval: 50 * time.Millisecond, Resend: 50 * time.Millisecond}
	}
	b := apptest.New(t, apptest.Options{Replica: "b", DatabaseURL: url, Notify: notifyTo()})
	grant := func(st *apptest.Stack, operator string) string {
		t.Helper()
		g, _, err := breakglass.Issue(t.Context(), st.Pool, apptest.SealKey(), "local",
			breakglass.Request{Operator: operator, Reason: "the identity provider is down", IssuedBy: "root@muster-0"}, time.Now())
		if err != nil {
			t.Fatal(err)
		}
		return g.ID.String()
	}
	// rounds runs every notifier a few times over, so a copy a replica
	// would send has been sent.
	rounds := func(stacks ...*apptest.Stack) {
		for range 3 {
			for _, st := range stacks {
				st.App.Notifier.RunOnce(t.Context())
			}
		}
	}

	var first string
	t.Run("two replicas", func(t *testing.T) {
		a := apptest.New(t, apptest.Options{Replica: "a", DatabaseURL: url, Notify: notifyTo()}) // takes every shard
		wait.For(t, 20*time.Second, "a owns the region alarms' shard", func() bool {
			_, ok := a.App.Ownership.Owns(app.RegionAlarmsOwnershipKey)
			return ok
		})
		first = grant(a, "alice")
		for name, st := range map[string]*apptest.Stack{"a": a, "b": b} {
			if err := st.App.BreakGlass.RunOnce(t.Context()); err != nil {
				t.Fatal(err)
			}
			held := false
			for _, al := range st.App.Server.Alarms() {
				held = held || strings.Contains(al.Detail, first)
			}
			if !held {
				t.Fatalf("replica %s does not hold the grant's alarm (the test's premise)", name)
			}
		}
		wait.For(t, 20*time.Second, "the webhook hears of the grant", func() bool { return hook.count("firing", first) > 0 })
		rounds(a, b)
		if n := hook.count("firing", first); n != 1 {
			t.Fatalf("the webhook received the alarm %d times from two replicas, want once", n)
		}
	})

	// a has stopped (its shutdown released its shards); b takes them.
	b.TakeOver(t)
	second := grant(b, "bob")
	if err := b.App.BreakGlass.RunOnce(t.Context()); err != nil {
		t.Fatal(err)
	}
	wait.For(t, 20*time.Second, "the webhook hears of the second grant from b", func() bool { return hook.count("firing", second) > 0 })
	rounds(b)
	if n := hook.count("firing", second); n != 1 {
		t.Fatalf("the webhook received the second alarm %d times, want once", n)
	}
	// The first is still open: b, now its sender, fires it once more (it
	// cannot know a delivered it), never resolves it.
	if n := hook.count("firing", first); n > 2 || hook.count("resolved", first) != 0 {
		t.Fatalf("the first alarm across the handover: %d firing, %d resolved; want at most one more firing and no resolution", n, hook.count("resolved", first))
	}
}
